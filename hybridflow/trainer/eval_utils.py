"""Evaluation helpers shared by main_eval, the quickstart recipes and tests.

* ``pass_at_k``: the unbiased pass@k estimator (Chen et al., 2021) from n samples with c correct.
* ``score_responses``: the reward scorer (built-in by data_source, or a custom function) applied to
  responses, each score a float (a scorer's dict result contributes its ``"score"``).
* ``greedy_accuracy``: load a Hugging Face model directory, decode every prompt of an RL parquet file
  greedily with the ``hf`` rollout engine, and return the share of responses the scorer rates correct.
  This is the held-out number the quickstart reports before and after RL.
* ``greedy_agent_eval``: the same through the agent loops named by each row's ``agent_name`` (tools,
  interactions: ``rollout_config["multi_turn"]``), returning each row's decoded conversation too.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct) = 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    # product form of C(n-c, k) / C(n, k): no huge binomials
    return 1.0 - float(np.prod([(n - c - i) / (n - i) for i in range(k)]))


def ks_for(n: int) -> list[int]:
    """The k reported for n responses per prompt: 1, 2, 4, ... and n itself."""
    ks = [1 << i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    return sorted(set(ks + [n])) if n >= 1 else []


def as_float_score(result: Any) -> float:
    """A scorer may return a number or a dict holding ``score``."""
    if isinstance(result, dict):
        if "score" not in result:
            raise KeyError(f"scorer returned a dict without 'score': {sorted(result)}")
        result = result["score"]
    return float(result)


def score_responses(
    compute_score: Callable | None, data_source: str, responses: Sequence[str], ground_truth, extra_info=None
) -> list[float]:
    """Scores of several responses to one prompt (``compute_score`` None: the built-in scorers)."""
    if compute_score is None:
        from hybridflow.rewards.scorers import default_compute_score as compute_score
    return [as_float_score(compute_score(data_source, r, ground_truth, extra_info)) for r in responses]


def summarize_scores(
    data_sources: Sequence[str], scores: Sequence[Sequence[float]], correct_above: float = 0.0
) -> dict[str, float]:
    """Per data source: mean score over all responses and pass@k over prompts.

    A response counts as correct when its score > ``correct_above`` (rule scorers give 1 right, 0
    wrong). Prompts may have different response counts; pass@k is reported for the k of the smallest.
    """
    by_source: dict[str, list[list[float]]] = defaultdict(list)
    for ds, s in zip(data_sources, scores):
        by_source[str(ds)].append(list(s))
    out: dict[str, float] = {}
    for ds, rows in by_source.items():
        flat = [x for row in rows for x in row]
        out[f"{ds}/mean_score"] = float(np.mean(flat)) if flat else float("nan")
        n_min = min(len(r) for r in rows)
        for k in ks_for(n_min):
            out[f"{ds}/pass@{k}"] = float(
                np.mean([pass_at_k(len(r), sum(x > correct_above for x in r), k) for r in rows])
            )
    return out


def _model_and_rows(
    model_dir: str, parquet_path: str, max_prompt_length: int, chat_template_kwargs: dict | None, chat_template=None
):
    """(local model dir, tokenizer, dataset, model in eval mode on this process's device) as the trainer
    reads them (left truncation, no overlong filter)."""
    import torch

    from hybridflow.data.rl_dataset import RLHFDataset
    from hybridflow.workers.model_loading import load_model, load_tokenizer, local_model_path

    model_dir = local_model_path(model_dir, "model_dir")  # a GGUF file gives its converted folder
    tokenizer = load_tokenizer(model_dir, False, chat_template=chat_template)
    dataset = RLHFDataset(
        parquet_path,
        tokenizer,
        {
            "max_prompt_length": max_prompt_length,
            "filter_overlong_prompts": False,
            "truncation": "left",
            "apply_chat_template_kwargs": dict(chat_template_kwargs or {}),
        },
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    module = load_model(model_dir, "causal_lm").to(device).eval()
    return model_dir, tokenizer, dataset, module


def greedy_accuracy(
    model_dir: str,
    parquet_path: str,
    limit: int | None = None,
    response_length: int = 32,
    max_prompt_length: int = 256,
    batch_size: int = 64,
    compute_score: Callable | None = None,
    return_samples: int = 0,
    chat_template_kwargs: dict | None = None,
) -> float | tuple[float, list[tuple[str, float]]]:
    """Share of prompts (the first ``limit`` rows) whose greedy response scores > 0.

    Runs in this process on the CPU (or the current CUDA device), through the same dataset and rollout
    code the trainer uses, so the number matches the trainer's greedy validation on the same rows.
    With ``return_samples`` > 0 also returns that many (response, score) pairs to show the user.
    ``chat_template_kwargs``: ``data.apply_chat_template_kwargs`` (e.g. ``enable_thinking=False``).
    """
    from hybridflow.rollout.sampling import model_eos_token_ids
    from hybridflow.workers.rollout import HFRollout

    model_dir, tokenizer, dataset, module = _model_and_rows(
        model_dir, parquet_path, max_prompt_length, chat_template_kwargs
    )
    rollout = HFRollout(
        module,
        {"do_sample": False, "temperature": 0.0, "response_length": response_length},
        tokenizer.pad_token_id,
        model_eos_token_ids(model_dir, tokenizer),
    )
    try:
        scores, samples = _score_greedy(rollout, dataset, tokenizer, limit, batch_size, compute_score, return_samples)
    finally:
        rollout.close()
    accuracy = float(np.mean([s > 0 for s in scores])) if scores else float("nan")
    return (accuracy, samples) if return_samples else accuracy


def _score_greedy(rollout, dataset, tokenizer, limit, batch_size, compute_score, return_samples):
    from hybridflow.data.rl_dataset import collate_fn
    from hybridflow.protocol import DataProto

    rows = range(len(dataset) if limit is None else min(limit, len(dataset)))
    scores, samples = [], []
    for start in range(0, len(rows), batch_size):
        items = [dataset[i] for i in rows[start : start + batch_size]]
        batch = DataProto.from_single_dict(collate_fn(items))
        gen = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
        gen.meta_info = {"do_sample": False, "pad_token_id": tokenizer.pad_token_id}
        out = rollout.generate_sequences(gen)
        texts = tokenizer.batch_decode(out.batch["responses"], skip_special_tokens=True)
        for item, text in zip(items, texts):
            score = score_responses(
                compute_score, item["data_source"], [text], item["reward_model"]["ground_truth"], item.get("extra_info")
            )[0]
            scores.append(score)
            if len(samples) < return_samples:
                samples.append((text, score))
    return scores, samples


def greedy_agent_eval(
    model_dir: str,
    parquet_path: str,
    rollout_config: dict,
    response_length: int,
    max_prompt_length: int,
    batch_size: int = 64,
    compute_score: Callable | None = None,
    limit: int | None = None,
    sample: bool = False,
    chat_template_kwargs: dict | None = None,
    chat_template: str | None = None,
) -> tuple[float, list[dict]]:
    """(share of rows scored > 0, one record per row: ``response`` (decoded, special tokens kept),
    ``score``, ``num_turns``, ``ground_truth``, ``extra`` (the loop's extra fields)). Greedy (or, with
    ``sample``, one draw at temperature 1, reproducible from the row order), in this process, through
    the same dataset and agent loop code the trainer uses; ``chat_template_kwargs`` reach both, ``chat_template``
    (``model.custom_chat_template``) replaces the tokenizer's."""
    from hybridflow.data.rl_dataset import collate_fn
    from hybridflow.protocol import DataProto
    from hybridflow.rollout.sampling import model_eos_token_ids
    from hybridflow.workers.rollout import HFRollout

    model_dir, tokenizer, dataset, module = _model_and_rows(
        model_dir, parquet_path, max_prompt_length, chat_template_kwargs, chat_template
    )
    config = {
        **rollout_config,
        "do_sample": sample,
        "temperature": 1.0 if sample else 0.0,
        "response_length": response_length,
        "prompt_length": max_prompt_length,
    }
    rollout = HFRollout(
        module,
        config,
        tokenizer.pad_token_id,
        model_eos_token_ids(model_dir, tokenizer),
        tokenizer=tokenizer,
        chat_template_kwargs=chat_template_kwargs,
    )
    rows = range(len(dataset) if limit is None else min(limit, len(dataset)))
    records: list[dict] = []
    try:
        for start in range(0, len(rows), batch_size):
            items = [dataset[i] for i in rows[start : start + batch_size]]
            batch = DataProto.from_single_dict(collate_fn(items))
            batch.meta_info = {"do_sample": sample, "pad_token_id": tokenizer.pad_token_id, "global_steps": start}
            gen = batch.select(
                batch_keys=["input_ids", "attention_mask", "position_ids"],
                non_tensor_batch_keys=list(batch.non_tensor_batch),
            )
            gen.meta_info = batch.meta_info
            out = rollout.generate_sequences(gen)
            p = out.batch["prompts"].size(1)
            lengths = out.batch["attention_mask"][:, p:].sum(-1).tolist()
            for i, item in enumerate(items):
                ids = out.batch["responses"][i, : lengths[i]].tolist()
                text = tokenizer.decode(ids, skip_special_tokens=True)
                truth = item["reward_model"]["ground_truth"]
                score = score_responses(compute_score, item["data_source"], [text], truth, item.get("extra_info"))[0]
                extra = (
                    out.non_tensor_batch["tool_extra_fields"][i] if "tool_extra_fields" in out.non_tensor_batch else {}
                )
                records.append(
                    {
                        "response": tokenizer.decode(ids, skip_special_tokens=False),
                        "score": score,
                        "num_turns": int(out.non_tensor_batch["num_turns"][i]),
                        "ground_truth": truth,
                        "extra": extra or {},
                    }
                )
    finally:
        rollout.close()
    accuracy = float(np.mean([r["score"] > 0 for r in records])) if records else float("nan")
    return accuracy, records
