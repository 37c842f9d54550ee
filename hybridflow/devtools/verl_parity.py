"""Compare every registered policy loss, advantage estimator and distillation loss of hybridflow with veRL 0.9.1's.

    python -m hybridflow.devtools.verl_parity [--verl-python /work/verl_venv/bin/python] [--seeds 4]

veRL is not a dependency: install it in a venv of its own (``pip install --no-deps verl==0.9.1`` plus
``codetiming``, with torch and omegaconf visible, and ``datasets``, which veRL's distillation losses
module imports; docs/verl_parity.md has the commands and the latest
table) and pass that venv's python; the script then re-runs itself there with this checkout on PYTHONPATH. Run under
a python that imports ``verl`` it compares
in process. Each name runs on the same random inputs on both sides (several seeds, every
aggregation mode, with and without rollout IS weights and global batch info; estimators on
single-turn and multi-turn masks); the table gives the largest absolute difference over the loss,
its gradient with respect to ``log_prob`` and the shared metrics (losses), or over advantages and
returns (estimators). Names only one side registers are listed as such.

The helpers (``random_case``, ``loss_outputs``, ``estimator_outputs``, ``max_abs_diff``,
``compare``) take the functions to compare as arguments and import nothing of veRL, so a test can
run them on hybridflow's functions alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["random_case", "loss_outputs", "estimator_outputs", "max_abs_diff", "compare", "format_table", "main"]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum")
TOLERANCE = 1e-5  # float64 inputs: anything above this is a different formula, not rounding

ACTOR = {  # the actor keys the losses read; the cov thresholds are set so that those branches run
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "policy_loss": {
        "clip_cov_ratio": 0.05,
        "clip_cov_lb": 0.0,
        "clip_cov_ub": 5.0,
        "kl_cov_ratio": 0.05,
        "ppo_kl_coef": 0.1,
        "dro_beta": 0.5,
    },
}
ALGORITHM = {
    "gamma": 0.9,
    "lam": 0.8,
    "norm_adv_by_std_in_grpo": True,
    "gdpo_reward_keys": ["acc", "fmt"],
    "gdpo_reward_weights": [1.0, 0.5],
}


def random_case(
    seed: int,
    batch: int = 12,
    width: int = 10,
    multi_turn: bool = False,
    singleton: bool = True,
    dtype: torch.dtype = torch.float64,
) -> dict[str, Any]:
    """Inputs for losses and estimators: log-probs of real probabilities, a ratio spread that hits
    every clip branch, right-padded (or, ``multi_turn``, holed) masks, groups of 2..4 rows (and,
    ``singleton``, one prompt with a single response)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    old = torch.log(torch.rand(batch, width, generator=g, dtype=dtype) * 0.9 + 0.05)
    new = torch.clamp(old + 0.4 * torch.randn(batch, width, generator=g, dtype=dtype), max=-1e-4)
    lengths = torch.from_numpy(rng.integers(1, width + 1, batch))
    lengths[0] = width  # at least one full row
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).to(dtype)  # (B, T)
    if multi_turn:  # a tool-output span inside some responses
        for row in range(0, batch, 2):
            if lengths[row] >= 5:
                mask[row, 2:4] = 0
    sizes, index = ([1] if singleton else []), []
    while sum(sizes) < batch:
        sizes.append(min(int(rng.integers(2, 5)), batch - sum(sizes)))
    if sizes[-1] == 1 and not singleton:
        sizes[-2:] = [sizes[-2] + 1]
    for gid, size in enumerate(sizes):
        index += [f"uid{gid}"] * size
    index = np.array(index, dtype=object)
    rng.shuffle(index)
    seq_adv = torch.randn(batch, 1, generator=g, dtype=dtype)
    token_adv = seq_adv + 0.3 * torch.randn(batch, width, generator=g, dtype=dtype)
    last = (mask * torch.arange(1, width + 1, dtype=dtype)).argmax(-1)  # last valid column
    rewards = torch.zeros(batch, width, dtype=dtype)
    rewards[torch.arange(batch), last] = torch.from_numpy(rng.integers(0, 3, batch)).to(dtype)
    pi = torch.exp(old)
    prompts = torch.ones(batch, 3, dtype=torch.long)
    return {
        "old_log_prob": old,
        "log_prob": new,
        "advantages": token_adv * mask,
        "seq_advantages": seq_adv * mask,
        "response_mask": mask,
        "rollout_is_weights": torch.rand(batch, width, generator=g, dtype=dtype) * 1.5 + 0.25,
        "token_level_rewards": rewards,
        "values": torch.randn(batch, width, generator=g, dtype=dtype) * mask,
        "index": index,
        "reward_baselines": torch.rand(batch, generator=g, dtype=dtype),
        # sum_v pi_v^2 >= pi^2 for the sampled token; the rest of the mass spread at random
        "sum_pi_squared": pi**2 + (1 - pi) ** 2 * torch.rand(batch, width, generator=g, dtype=dtype),
        "non_tensor_batch": {
            "acc": rng.integers(0, 2, batch).astype(float).astype(object),
            "fmt": rng.random(batch).astype(object),
        },
        "batch": {"prompts": prompts, "attention_mask": torch.cat([prompts, mask.long()], dim=1)},
    }


def loss_outputs(
    fn: Callable,
    case: dict,
    config: Any,
    loss_agg_mode: str,
    weights: bool,
    seed: int = 0,
    advantages: str = "advantages",
) -> dict[str, Any]:
    """{"loss", "grad" (d loss / d log_prob), metric name: float} of one policy-loss call; the torch
    RNG is seeded first (clip_cov draws tokens at random)."""
    log_prob = case["log_prob"].clone().requires_grad_(True)
    torch.manual_seed(seed)
    loss, metrics = fn(
        case["old_log_prob"],
        log_prob,
        case[advantages],
        case["response_mask"],
        loss_agg_mode,
        config,
        case["rollout_is_weights"] if weights else None,
    )
    loss.backward()
    out = {"loss": loss.detach(), "grad": log_prob.grad}
    out.update({f"metric {k}": float(v) for k, v in metrics.items()})
    return out


def estimator_outputs(name: str, fn: Callable, case: dict, config: Any) -> dict[str, Any]:
    """{"advantages", "returns"} of one estimator, called with the inputs veRL 0.9.1's trainer passes
    to it (compute_advantage in ray_trainer.py)."""
    c = case
    if name == "gae":
        adv, ret = fn(
            token_level_rewards=c["token_level_rewards"],
            values=c["values"],
            response_mask=c["response_mask"],
            gamma=config["gamma"],
            lam=config["lam"],
        )
        return {"advantages": adv, "returns": ret}
    kwargs = {"token_level_rewards": c["token_level_rewards"], "response_mask": c["response_mask"], "index": c["index"]}
    if name == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = config["norm_adv_by_std_in_grpo"]
    else:
        kwargs["config"] = config
    if name == "remax":
        kwargs["reward_baselines"] = c["reward_baselines"]
    if name == "gdpo":
        kwargs.update(non_tensor_batch=c["non_tensor_batch"], batch=c["batch"])
    if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        kwargs.update(
            sum_pi_squared=c["sum_pi_squared"],
            old_log_probs=c["old_log_prob"],
            rollout_is_weights=c["rollout_is_weights"],
        )
    adv, ret = fn(**kwargs)
    return {"advantages": adv, "returns": ret}


def max_abs_diff(ours: dict, theirs: dict) -> float:
    """Largest absolute difference over the entries both have; inf when the key sets differ or a
    shape differs (a metric one side reports and the other does not is a difference too)."""
    if set(ours) != set(theirs):
        return math.inf
    worst = 0.0
    for key, a in ours.items():
        a = torch.as_tensor(a, dtype=torch.float64)
        b = torch.as_tensor(theirs[key], dtype=torch.float64)
        if a.shape != b.shape:
            return math.inf
        if a.numel():
            both_nan = torch.isnan(a) & torch.isnan(b)
            diff = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
            worst = max(worst, float(torch.nan_to_num(diff, nan=math.inf).max()))
    return worst


def _loss_runs(seeds: Iterable[int]):
    """(seed, case, loss_agg_mode, weights, global_batch_info or None, advantages key) per run."""
    for seed in seeds:
        for multi_turn in (False, True):
            case = random_case(seed, multi_turn=multi_turn)
            tokens, seqs = int(case["response_mask"].sum()), int((case["response_mask"].sum(-1) > 0).sum())
            for mode in AGG_MODES:
                for weights in (False, True):
                    for info in (
                        None,
                        {
                            "dp_size": 2,
                            "batch_num_tokens": 3 * tokens,
                            "global_batch_size": 3 * seqs,
                            "loss_scale_factor": None,
                        },
                    ):
                        for adv in ("advantages", "seq_advantages"):
                            yield seed, case, mode, weights, info, adv


def _outputs_or_error(fn, *args):
    try:
        return fn(*args)
    except (ValueError, AssertionError) as e:  # e.g. grpo_passk refuses a group of one on both sides
        return e


# Differences on purpose: (name, variant) -> why. Their runs are reported on a row of their own.
KNOWN_DEVIATIONS = {
    ("geo_mean", "global batch info"): "veRL takes the mean over the micro-batch's sequences whatever "
    "global_batch_info says (k accumulated micro-batches scale the gradient by k); hybridflow divides the "
    "sequence sum by global_batch_size (x dp_size), so accumulation gives the full-batch gradient"
}


def compare(
    ours_losses: dict,
    theirs_losses: dict,
    ours_estimators: dict,
    theirs_estimators: dict,
    loss_config: Callable[[dict | None], tuple[Any, Any]],
    algo_config: Callable[[], tuple[Any, Any]],
    seeds: Iterable[int] = range(3),
) -> list[tuple[str, str, float]]:
    """[(kind, name, max abs diff)] for every name in either registry (nan: only one side has it).
    ``loss_config(global_batch_info)`` / ``algo_config()`` return the (ours, theirs) config objects.
    A loss with a ``KNOWN_DEVIATIONS`` entry gets a second row, ``name (variant)``, for those runs."""
    seeds = list(seeds)
    rows = []
    for name in sorted(set(ours_losses) | set(theirs_losses)):
        if name not in ours_losses or name not in theirs_losses:
            rows.append(("policy loss", name, math.nan))
            continue
        worst = {None: 0.0, "global batch info": 0.0}
        for seed, case, mode, weights, info, adv in _loss_runs(seeds):
            cfg_ours, cfg_theirs = loss_config(info)
            a = loss_outputs(ours_losses[name], case, cfg_ours, mode, weights, seed, adv)
            b = loss_outputs(theirs_losses[name], case, cfg_theirs, mode, weights, seed, adv)
            variant = "global batch info" if info and (name, "global batch info") in KNOWN_DEVIATIONS else None
            worst[variant] = max(worst[variant], max_abs_diff(a, b))
        rows.append(("policy loss", name, worst[None]))
        if (name, "global batch info") in KNOWN_DEVIATIONS:
            rows.append(("policy loss", f"{name} (global batch info)", worst["global batch info"]))
    for name in sorted(set(ours_estimators) | set(theirs_estimators)):
        if name not in ours_estimators or name not in theirs_estimators:
            rows.append(("estimator", name, math.nan))
            continue
        worst = 0.0
        for seed in seeds:
            for multi_turn, singleton in ((False, True), (True, True), (False, False), (True, False)):
                case = random_case(seed, multi_turn=multi_turn, singleton=singleton)
                cfg_ours, cfg_theirs = algo_config()
                a = _outputs_or_error(estimator_outputs, name, ours_estimators[name], case, cfg_ours)
                b = _outputs_or_error(estimator_outputs, name, theirs_estimators[name], case, cfg_theirs)
                if isinstance(a, Exception) or isinstance(b, Exception):  # both refusing the input agree
                    worst = worst if isinstance(a, Exception) and isinstance(b, Exception) else math.inf
                    continue
                worst = max(worst, max_abs_diff(a, b))
        rows.append(("estimator", name, worst))
    return rows


def format_table(rows: list[tuple[str, str, float]]) -> str:
    lines = ["| kind | name | max abs diff | ok |", "|---|---|---|---|"]
    for kind, name, diff in rows:
        if math.isnan(diff):
            verdict, text = "only one side registers it", "-"
        elif name.endswith(")"):
            verdict, text = "deviation on purpose (see KNOWN_DEVIATIONS)", f"{diff:.2e}"
        else:
            verdict, text = ("yes" if diff <= TOLERANCE else "NO"), f"{diff:.2e}"
        lines.append(f"| {kind} | {name} | {text} | {verdict} |")
    return "\n".join(lines)


def _verl_configs():
    """Config builders for both sides: plain mappings for hybridflow, veRL's dataclasses for veRL
    (some of its losses insist on an ActorConfig)."""
    from verl.trainer.config import AlgoConfig
    from verl.workers.config import ActorConfig, PolicyLossConfig

    def loss_config(info):
        ours = {**ACTOR, "global_batch_info": dict(info or {})}
        fields = {k: v for k, v in ACTOR.items() if k != "policy_loss"}
        theirs = ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            policy_loss=PolicyLossConfig(**ACTOR["policy_loss"]),
            **fields,
        )
        theirs.global_batch_info.update(info or {})
        return ours, theirs

    def algo_config():
        return dict(ALGORITHM), AlgoConfig(**ALGORITHM)

    return loss_config, algo_config


def _distillation_case(seed: int, vocab: int = 16, topk: int = 4) -> dict[str, Any]:
    """A random case's masks and log-probs plus student logits, teacher top-k log-probs and ids."""
    case = random_case(seed)
    g = torch.Generator().manual_seed(seed + 1000)
    shape = case["response_mask"].shape
    teacher = torch.log_softmax(torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 2, -1)
    top, ids = teacher.topk(topk, dim=-1)
    logits = torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 2
    return {**case, "teacher": case["old_log_prob"] + 0.5, "logits": logits, "top": top, "ids": ids}


def distillation_rows(seeds: Iterable[int]) -> list[tuple[str, str, float]]:
    """hybridflow's distillation losses (algorithms/distillation.py) against veRL 0.9.1's: the
    estimators against ``kl_penalty`` as veRL's estimator loss calls it, ``forward_kl_topk`` against
    veRL's FSDP top-k loss (clamped at 0 as its loss function does), and ``distillation_objective`` +
    ``combine_with_task_loss`` against ``distillation_ppo_loss`` fed fixed per-token losses (supervised
    and policy-gradient, with and without loss_max_clamp and use_task_rewards; loss and gradient)."""
    from tensordict import TensorDict
    from verl.trainer.distillation import losses as verl_dl
    from verl.trainer.distillation.fsdp.losses import compute_forward_kl_topk
    from verl.trainer.ppo.core_algos import kl_penalty as verl_kl
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.config import DistillationConfig as VDistill
    from verl.workers.config import DistillationLossConfig as VLoss

    from hybridflow.algorithms import distillation as ours
    from hybridflow.config import DistillationLossConfig

    if "parity_fixed" not in verl_dl.DISTILLATION_LOSS_REGISTRY:  # per-token losses given by the case
        verl_dl.register_distillation_loss(verl_dl.DistillationLossSettings(names="parity_fixed", use_estimator=True))(
            lambda config, distillation_config, model_output, data: (data["parity_losses"], {})
        )
    rows, names = [], set(ours.DISTILLATION_LOSS_REGISTRY) | set(verl_dl.DISTILLATION_LOSS_REGISTRY) - {"parity_fixed"}
    cases = [_distillation_case(seed) for seed in seeds]
    for name in sorted(names):
        if name not in ours.DISTILLATION_LOSS_REGISTRY or name not in verl_dl.DISTILLATION_LOSS_REGISTRY:
            rows.append(("distillation loss", name, math.nan))
            continue
        worst = 0.0
        for case, clamp in ((c, clamp) for c in cases for clamp in (None, -2.0)):
            fn = ours.get_distillation_loss(name).fn
            if name == "forward_kl_topk":
                student = torch.log_softmax(case["logits"], -1).gather(-1, case["ids"])
                flat = case["response_mask"].bool().flatten()
                nested = {  # veRL reads the teacher tensors as one packed sequence
                    k: torch.nested.nested_tensor_from_jagged(v.flatten(0, 1)[flat], torch.tensor([0, int(flat.sum())]))
                    for k, v in (("top", case["top"]), ("ids", case["ids"]))
                }
                cfg = VDistill(
                    distillation_loss=VLoss(loss_mode=name, log_prob_min_clamp=clamp, use_policy_gradient=False)
                )
                theirs = compute_forward_kl_topk(
                    case["logits"].flatten(0, 1)[flat][None], nested["top"], nested["ids"], cfg, "thd"
                )["distillation_losses"][0].clamp_min(0.0)
                mine = fn(student, case["top"], clamp).flatten()[flat]
            else:
                mine, theirs = (
                    fn(case["log_prob"], case["teacher"], clamp),
                    verl_kl(case["log_prob"], case["teacher"], name),
                )
            worst = max(worst, max_abs_diff({"loss": mine}, {"loss": theirs}))
        rows.append(("distillation loss", name, worst))
    worst = 0.0
    for case in cases:
        mask, old = case["response_mask"], case["old_log_prob"]
        tokens, seqs = int(mask.sum()), int((mask.sum(-1) > 0).sum())
        losses = (case["log_prob"] - case["teacher"]) * 3  # beyond the clamp below for some tokens
        for mode, pg, clamp, task in (
            (m, pg, clamp, task)
            for m in AGG_MODES
            for pg in (False, True)
            for clamp in (None, 1.0)
            for task in (False, True)
        ):
            settings = {"loss_max_clamp": clamp, "use_policy_gradient": pg, "use_task_rewards": task}
            info = {"dp_size": 2, "batch_num_tokens": 3 * tokens, "global_batch_size": 3 * seqs}
            outs = []
            for side in ("ours", "theirs"):
                log_prob = case["log_prob"].clone().requires_grad_(True)
                token_losses = losses.clone().requires_grad_(True)
                if side == "ours":
                    cfg = DistillationLossConfig(loss_mode="k3", distillation_loss_coef=0.7, **settings)
                    d, _ = ours.distillation_objective(
                        token_losses, log_prob, old, mask, cfg, mode, {**info, "loss_scale_factor": None}
                    )
                    loss = ours.combine_with_task_loss(torch.tensor(0.25, dtype=d.dtype), d, cfg)
                else:
                    actor = ActorConfig(
                        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=mode
                    )
                    cfg = VDistill(
                        distillation_loss=VLoss(loss_mode="parity_fixed", distillation_loss_coef=0.7, **settings)
                    )
                    lengths = mask.sum(-1).long()
                    flat = torch.cat(
                        [torch.cat([log_prob[i, :n], log_prob.new_zeros(1)]) for i, n in enumerate(lengths)]
                    )
                    data = TensorDict(
                        {
                            "response_mask": mask,
                            "old_log_probs": old,
                            "parity_losses": token_losses,
                            "prompts": torch.ones(len(mask), 1, dtype=torch.long),
                            "responses": torch.ones_like(mask, dtype=torch.long),
                            "attention_mask": torch.cat([torch.ones(len(mask), 1), mask], -1).long(),
                        },
                        batch_size=[len(mask)],
                    )
                    tu.assign_non_tensor(data, **info)
                    distill, _ = verl_dl.distillation_loss(actor, cfg, {"log_probs": flat}, data)
                    # distillation_ppo_loss's mix with a task loss of 0.25 (its ppo_loss replaced by a constant)
                    loss = (0.25 if task else 0.0) + distill * (
                        cfg.distillation_loss.distillation_loss_coef if task else 1.0
                    )
                grads = torch.autograd.grad(loss, [log_prob, token_losses], allow_unused=True)
                grads = [torch.zeros_like(log_prob) if g is None else g for g in grads]
                outs.append({"loss": loss.detach(), "grad": grads[0], "grad_losses": grads[1]})
            worst = max(worst, max_abs_diff(*outs))
    rows.append(("distillation loss", "objective: clamp, policy gradient, task mix", worst))
    return rows


def run_in_process(seeds: int) -> str:
    from verl.trainer.ppo import core_algos as verl_algos

    from hybridflow import algorithms as ours

    loss_config, algo_config = _verl_configs()
    rows = compare(
        dict(ours.POLICY_LOSS_REGISTRY.items()),
        dict(verl_algos.POLICY_LOSS_REGISTRY),
        dict(ours.ADV_ESTIMATOR_REGISTRY.items()),
        dict(verl_algos.ADV_ESTIMATOR_REGISTRY),
        loss_config,
        algo_config,
        range(seeds),
    )
    return format_table(rows + distillation_rows(range(seeds)))


def field_differences(ours: Any, theirs: Any) -> list[str]:
    """The shared fields of two config instances whose values differ (nested sections compared by
    whether they are set; ``_target_`` left out), then the fields only ``theirs`` has."""

    def shown(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return f"<{type(value).__name__}>"
        return dict(value) if isinstance(value, Mapping) else value

    ours_fields = {f.name for f in dataclasses.fields(ours)}
    theirs_fields = [f.name for f in dataclasses.fields(theirs) if f.name != "_target_"]
    out = []
    for name in theirs_fields:
        if name not in ours_fields:
            out.append(f"{name}: only veRL has it")
            continue
        a, b = shown(getattr(ours, name)), shown(getattr(theirs, name))
        if a != b and not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b)):
            out.append(f"{name}: hybridflow {a!r}, veRL {b!r}")
    return out


def config_default_differences() -> str:
    """Every config class veRL exports (verl.workers.config, verl.trainer.config) built with its defaults on
    both sides: the fields whose defaults differ, what only veRL has, and the classes one side cannot
    build without arguments (veRL's checks at construction). Needs ``verl`` importable."""
    import verl.trainer.config as verl_trainer
    import verl.workers.config as verl_workers

    import hybridflow.config as ours_config

    lines = []
    for module in (verl_workers, verl_trainer):
        for name in module.__all__:
            theirs_cls = getattr(module, name)
            if not (isinstance(theirs_cls, type) and dataclasses.is_dataclass(theirs_cls)):
                continue
            try:
                ours_cls = getattr(ours_config, name)
            except (AttributeError, ImportError) as e:  # refused by name (Megatron, other engines)
                lines.append(f"{name}: not in hybridflow ({str(e).splitlines()[0][:80]})")
                continue
            built = {}
            for side, cls in (("hybridflow", ours_cls), ("veRL", theirs_cls)):
                try:
                    built[side] = cls()
                except Exception as e:  # noqa: BLE001 - report what the constructor says
                    lines.append(f"{name}(): {side} raises {type(e).__name__}: {str(e)[:90]}")
            if len(built) == 2:
                lines.extend(f"{name}.{d}" for d in field_differences(built["hybridflow"], built["veRL"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-python", help="python of a venv where `import verl` (0.9.1) works")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--config-defaults", action="store_true", help="list how veRL's config classes' defaults differ instead"
    )
    args = parser.parse_args(argv)
    try:
        import verl  # noqa: F401
    except ImportError:
        if not args.verl_python:
            print("verl is not importable here: pass --verl-python PATH (a venv with verl 0.9.1)", file=sys.stderr)
            return 2
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        return subprocess.run(
            [
                args.verl_python,
                "-m",
                "hybridflow.devtools.verl_parity",
                "--seeds",
                str(args.seeds),
                *(["--config-defaults"] if args.config_defaults else []),
            ],
            env=env,
        ).returncode
    print(config_default_differences() if args.config_defaults else run_in_process(args.seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
