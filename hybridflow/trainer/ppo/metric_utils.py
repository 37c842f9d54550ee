"""Step metrics with veRL's names, computed as tensors and read back with one host sync."""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.validation_stats import bootstrap_metric, calc_maj_val, process_validation_metrics
from hybridflow.utils.metric import flat_metric_values, reduce_metrics

__all__ = [
    "timer",
    "compute_data_metrics",
    "gdpo_component_metrics",
    "compute_timing_metrics",
    "compute_throughput_metrics",
    "compute_throughout_metrics",
    "rollout_probs_diff_metrics",
    "flat_metric_values",
    "reduce_metrics",
    "bootstrap_metric",
    "calc_maj_val",
    "process_validation_metrics",
    "validation_metrics",
]


@contextmanager
def timer(name: str, timing: dict):
    """Add the block's wall time to ``timing[name]`` (seconds): the phases' timing_s/<name>."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def _stats(prefix: str, values: torch.Tensor) -> dict[str, torch.Tensor]:
    values = values.float()
    if values.numel() == 0:
        values = torch.zeros(1)
    return {f"{prefix}/mean": values.mean(), f"{prefix}/max": values.max(), f"{prefix}/min": values.min()}


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, torch.Tensor]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch (tensors)."""
    b = batch.batch
    response_length = b["responses"].shape[-1]
    response_mask = b["response_mask"].bool()
    prompt_mask = b["attention_mask"][:, :-response_length].bool()
    resp_len = response_mask.sum(-1).float()
    prompt_len = prompt_mask.sum(-1).float()

    metrics: dict[str, torch.Tensor] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][response_mask]))
    metrics.update(_stats("critic/returns", b["returns"][response_mask]))
    if use_critic:
        metrics.update(_stats("critic/values", b["values"][response_mask]))
        ret, val = b["returns"][response_mask], b["values"][response_mask]
        metrics["critic/vf_explained_var"] = 1.0 - (ret - val).var() / (ret.var() + 1e-5)
    metrics.update(_stats("response_length", resp_len))
    metrics["response_length/clip_ratio"] = (resp_len == response_length).float().mean()
    metrics.update(_stats("prompt_length", prompt_len))
    metrics["prompt_length/clip_ratio"] = (prompt_len == prompt_mask.shape[-1]).float().mean()
    return metrics


def gdpo_component_metrics(non_tensor_batch: dict, keys) -> dict[str, float]:
    """gdpo/<key>/{mean,std,max,min} of each reward component (veRL's names; population std)."""
    metrics = {}
    for key in keys or ():
        if key in non_tensor_batch:
            values = np.asarray(non_tensor_batch[key], dtype=np.float64)
            metrics.update(
                {
                    f"gdpo/{key}/mean": float(values.mean()),
                    f"gdpo/{key}/std": float(values.std()),
                    f"gdpo/{key}/max": float(values.max()),
                    f"gdpo/{key}/min": float(values.min()),
                }
            )
    return metrics


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, float]:
    """timing_s/<phase> and timing_per_token_ms/<phase>."""
    b = batch.batch
    response_length = b["responses"].shape[-1]
    n_prompt = float(b["attention_mask"][:, :-response_length].sum())
    n_resp = float(b["response_mask"].sum())
    tokens = {
        "gen": n_resp,
        "ref": n_prompt + n_resp,
        "values": n_prompt + n_resp,
        "update_critic": n_prompt + n_resp,
        "update_actor": n_prompt + n_resp,
        "old_log_prob": n_prompt + n_resp,
    }
    out = {f"timing_s/{k}": v for k, v in timing_raw.items()}
    out.update(
        {f"timing_per_token_ms/{k}": timing_raw[k] * 1000 / max(tokens[k], 1) for k in tokens if k in timing_raw}
    )
    return out


def compute_throughput_metrics(batch: DataProto, step_seconds: float, n_devices: int) -> dict[str, float]:
    """perf/total_num_tokens (prompt + response tokens of the step: ``meta_info["global_token_num"]``
    when the trainer recorded it, as veRL counts, else the attention mask), perf/time_per_step and
    perf/throughput (tokens per second per device)."""
    token_counts = batch.meta_info.get("global_token_num")
    total_tokens = float(sum(token_counts) if token_counts is not None else batch.batch["attention_mask"].sum())
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_seconds,
        "perf/throughput": total_tokens / max(step_seconds, 1e-9) / max(n_devices, 1),
    }


def compute_throughout_metrics(batch: DataProto, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """veRL's name and signature (sic: "throughout") for ``compute_throughput_metrics``: the step time
    is ``timing_raw["step"]``."""
    if "step" not in timing_raw:
        raise KeyError(
            f"compute_throughout_metrics needs timing_raw['step'] (the step's seconds); got {sorted(timing_raw)}"
        )
    return compute_throughput_metrics(batch, timing_raw["step"], n_gpus)


def rollout_probs_diff_metrics(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, torch.Tensor | float]:
    """How far the rollout engine's token probabilities are from the trainer's recomputation
    (veRL's ``training/rollout_probs_diff_*``): |exp(rollout) - exp(old)| over the model's tokens.

    Large values mean the engine samples from a different policy than the one being trained (stale
    weights, a dtype or kernel mismatch); importance-sampling corrections exist for the rest.
    """
    mask = response_mask.bool()
    if not mask.any():
        nan = float("nan")
        return {
            "training/rollout_probs_diff_valid": 0.0,
            "training/rollout_probs_diff_max": nan,
            "training/rollout_probs_diff_mean": nan,
            "training/rollout_probs_diff_std": nan,
            "training/rollout_actor_probs_pearson_corr": nan,
        }
    rollout_p = torch.exp(rollout_log_probs.float())[mask]  # (T,) the model's tokens only
    actor_p = torch.exp(old_log_probs.float())[mask]
    diff = (rollout_p - actor_p).abs()
    corr = torch.corrcoef(torch.stack([actor_p, rollout_p]))[0, 1] if diff.numel() > 1 else torch.tensor(float("nan"))
    return {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": diff.max(),
        "training/rollout_probs_diff_mean": diff.mean(),
        "training/rollout_probs_diff_std": diff.std() if diff.numel() > 1 else torch.tensor(0.0),
        "training/rollout_actor_probs_pearson_corr": corr,
    }


def _n_of(metric_name: str) -> int:
    """N of ``mean@N`` / ``best@N/mean``."""
    return int(metric_name.split("@")[-1].split("/")[0])


def validation_metrics(data_sources, sample_uids, infos_dict: dict, seed: int = 42) -> dict[str, float]:
    """veRL's validation metrics: ``<section>/<data_source>/<variable>/<metric>`` for every statistic of
    ``process_validation_metrics``. val-core holds the headline numbers: the core variable (``acc``
    when the scorer reports it, else ``reward``) at the largest N, its mean@N, best@N/* and maj@N/*;
    everything else (std@N, worst@k, smaller k, other variables) goes to val-aux."""
    out: dict[str, float] = {}
    stats = process_validation_metrics(data_sources, sample_uids, infos_dict, seed=seed)
    for source, var2metrics in stats.items():
        core_var = "acc" if "acc" in var2metrics else "reward"
        for var, metrics in var2metrics.items():
            n_max = max(_n_of(name) for name in metrics)
            for name, value in metrics.items():
                core = var == core_var and name.startswith(("mean", "maj", "best")) and _n_of(name) == n_max
                out[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = value
    return out
