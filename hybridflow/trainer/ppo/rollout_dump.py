"""Rollout dumps: one JSONL file per step (``<dir>/<step>.jsonl``, veRL's naming), one line per sample.

Each line carries veRL's fields, for people and for veRL's tools:

    input, output   the decoded prompt (padding cut, special tokens kept: the chat template the model saw,
                    e.g. ``<|im_start|>user``) and response (special tokens skipped, as the reward reads it)
    gts             the ground truth (``reward_model.ground_truth``), score (the summed token scores), step

and what an exact replay needs, in token ids, never re-derived from text:

    prompt_ids      the prompt without its left padding            prompt_width    the padded prompt length P
    response_ids    the response up to its attention end (no pads) response_width  the padded response length R
    <per-token>     every (B, R) tensor of the batch, cut to the response's attention length, under its
                    batch name: response_mask, token_level_scores, token_level_rewards, advantages,
                    returns, old_log_probs, ref_log_prob, values, rollout_log_probs, ...
    non_tensor      every per-sample field (uid, index, data_source, reward_model, extra_info, ...)
    dtypes          the dtype of each dumped tensor
    padded          only for rows the layout above does not rebuild bit for bit: the full padded row
                    of that tensor (e.g. an engine that pads with EOS, or 3-D position ids)

Rows are written in generation order (``trainer.balance_batch`` reorders the batch for the ranks; the
permutation it applied is in ``meta_info["balance_order"]`` and undone here), so a replay that goes
through the same balancing lands in the same order. Files are written to a temporary name and renamed:
a reader never sees half a step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hybridflow.protocol import DataProto

__all__ = [
    "GENERATED_TENSORS",
    "GENERATED_PER_TOKEN",
    "step_file",
    "batch_to_rows",
    "rows_to_batch",
    "write_rows",
    "read_rows",
    "dumped_steps",
    "pad_token_id_of",
]

# what the generate phase produces: rebuilt from prompt_ids/response_ids (+ padded overrides) ...
GENERATED_TENSORS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids")
# ... and per-token tensors of the rollout that a replay restores; later phases recompute the others
GENERATED_PER_TOKEN = ("response_mask", "rollout_log_probs")


def step_file(directory: str, step: int) -> str:
    return os.path.join(os.path.expanduser(str(directory)), f"{int(step)}.jsonl")


def dumped_steps(directory: str) -> list[int]:
    """Steps with a dump file in ``directory``, ascending."""
    directory = os.path.expanduser(str(directory))
    if not os.path.isdir(directory):
        return []
    return sorted(int(name[:-6]) for name in os.listdir(directory) if name.endswith(".jsonl") and name[:-6].isdigit())


def _jsonable(value: Any) -> Any:
    """numpy/torch values as plain JSON types (lists, numbers, strings, dicts)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _generation_order(batch: DataProto) -> list[int]:
    """Row r of the batch was generated at position order[r]; identity when nothing reordered it."""
    order = batch.meta_info.get("balance_order")
    return list(range(len(batch))) if order is None else [int(i) for i in order]


def batch_to_rows(batch: DataProto, tokenizer, step: int, scores: Sequence[float] | None = None) -> list[dict]:
    """The batch (after its step's phases, or a validation batch) as dump rows, in generation order.

    ``scores``: the per-sample score when the batch has no ``token_level_scores`` (validation)."""
    b = batch.batch
    prompts, responses = b["prompts"], b["responses"]  # (B, P), (B, R)
    width_p, width_r = prompts.shape[-1], responses.shape[-1]
    attention = b["attention_mask"]  # (B, P+R)
    prompt_attn, response_attn = attention[:, :width_p].bool(), attention[:, width_p:]
    response_lens = response_attn.sum(-1).tolist()
    if scores is None:
        scores = b["token_level_scores"].sum(-1).tolist()
    per_token = [k for k in b.keys() if k not in GENERATED_TENSORS and b[k].dim() == 2 and b[k].shape[-1] == width_r]
    rows = []
    for r in range(len(batch)):
        length = int(response_lens[r])
        prompt_ids = prompts[r][prompt_attn[r]].tolist()
        response_ids = responses[r, :length].tolist()
        non_tensor = {k: _jsonable(v[r]) for k, v in batch.non_tensor_batch.items()}
        reward_model = non_tensor.get("reward_model")
        row = {
            "input": tokenizer.decode(prompt_ids, skip_special_tokens=False),
            "output": tokenizer.decode(response_ids, skip_special_tokens=True),
            "gts": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            "score": float(scores[r]),
            "step": int(step),
            "prompt_ids": prompt_ids,
            "response_ids": response_ids,
            "prompt_width": int(width_p),
            "response_width": int(width_r),
        }
        for key in per_token:
            row[key] = b[key][r, :length].tolist()
        row["non_tensor"] = non_tensor
        row["dtypes"] = {
            k: str(b[k].dtype).removeprefix("torch.") for k in (*GENERATED_TENSORS, *per_token) if k in b.keys()
        }
        rows.append(row)
    _add_padded_overrides(batch, rows, pad_token_id=pad_token_id_of(tokenizer))
    order = _generation_order(batch)
    in_generation_order: list[dict] = [None] * len(rows)  # type: ignore[list-item]
    for r, position in enumerate(order):
        in_generation_order[position] = rows[r]
    return in_generation_order


def pad_token_id_of(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def _add_padded_overrides(batch: DataProto, rows: list[dict], pad_token_id: int) -> None:
    """Where the compact layout does not rebuild a generated tensor's row bit for bit, store that row
    in full under ``padded``; rows the layout covers stay compact."""
    rebuilt = _rebuild_generated(rows, pad_token_id)
    for key in (*GENERATED_TENSORS, *GENERATED_PER_TOKEN):
        if key not in batch.batch.keys():
            continue
        actual = batch.batch[key]
        mine = rebuilt.get(key)
        if mine is None or mine.shape != actual.shape:
            mismatched = range(len(rows))
        else:
            mismatched = (
                (~(mine.to(actual.dtype) == actual).reshape(len(rows), -1).all(-1)).nonzero().flatten().tolist()
            )
        for r in mismatched:
            rows[r].setdefault("padded", {})[key] = actual[r].tolist()


def _rebuild_generated(rows: list[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The generated tensors from the compact row layout (before ``padded`` overrides):
    left-padded prompts, right-padded responses, attention 1 over real tokens, and positions that
    count prompt tokens and then continue through the response (the rollout layout)."""
    if not rows:
        return {}
    width_p, width_r = rows[0]["prompt_width"], rows[0]["response_width"]
    n = len(rows)
    prompts = torch.full((n, width_p), pad_token_id, dtype=torch.long)
    responses = torch.full((n, width_r), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((n, width_p), dtype=torch.long)
    response_attn = torch.zeros((n, width_r), dtype=torch.long)
    out: dict[str, torch.Tensor] = {}
    per_token = {k: torch.zeros((n, width_r), dtype=torch.float32) for k in GENERATED_PER_TOKEN if k in rows[0]}
    for i, row in enumerate(rows):
        p, resp = row["prompt_ids"], row["response_ids"]
        if len(p) > width_p or len(resp) > width_r:
            raise ValueError(
                f"dump row {i}: {len(p)} prompt / {len(resp)} response tokens exceed the widths "
                f"{width_p} / {width_r} it declares"
            )
        if p:
            prompts[i, width_p - len(p) :] = torch.tensor(p)
            prompt_attn[i, width_p - len(p) :] = 1
        if resp:
            responses[i, : len(resp)] = torch.tensor(resp)
            response_attn[i, : len(resp)] = 1
        for key, tensor in per_token.items():
            values = row[key]
            tensor[i, : len(values)] = torch.tensor(values, dtype=torch.float64)
    positions = torch.clip(torch.cumsum(prompt_attn, dim=-1) - 1, min=0)  # (n, P)
    response_positions = positions[:, -1:] + torch.arange(1, width_r + 1)  # (n, R)
    out.update(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": torch.cat([prompt_attn, response_attn], dim=-1),
            "position_ids": torch.cat([positions, response_positions], dim=-1),
        }
    )
    out.update(per_token)
    return out


def rows_to_batch(rows: list[dict], pad_token_id: int, source: str = "dump") -> DataProto:
    """The generate phase's output rebuilt from dump rows: the generated tensors (exactly, in their
    dumped dtypes), ``response_mask``/``rollout_log_probs`` where dumped, and every non-tensor field."""
    if not rows:
        raise ValueError(f"{source}: no rows")
    widths = {(row.get("prompt_width"), row.get("response_width")) for row in rows}
    if len(widths) != 1 or None in next(iter(widths)):
        raise ValueError(
            f"{source}: rows disagree on (prompt_width, response_width) or lack them: {sorted(widths, key=str)}"
        )
    tensors = _rebuild_generated(rows, pad_token_id)
    dtypes = rows[0].get("dtypes", {})
    for key in list(tensors):
        if key in GENERATED_PER_TOKEN and key not in rows[0]:
            del tensors[key]
            continue
        full = [row.get("padded", {}).get(key) for row in rows]
        if any(f is not None for f in full):
            if all(f is not None for f in full):  # every row overridden: the rebuilt shape may differ (3-D positions)
                tensors[key] = torch.tensor(full)
            else:
                for i, f in enumerate(full):
                    if f is not None:
                        tensors[key][i] = torch.tensor(f)
        if key in dtypes:
            tensors[key] = tensors[key].to(getattr(torch, dtypes[key]))
    non_tensors = {}
    for key in rows[0].get("non_tensor", {}):
        column = np.empty(len(rows), dtype=object)  # element-wise: lists stay lists
        for i, row in enumerate(rows):
            column[i] = row["non_tensor"].get(key)
        non_tensors[key] = column
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def write_rows(path: str, rows: list[dict]) -> str:
    """Write rows as JSONL atomically (temporary file, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_rows(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        rows = []
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
    missing = [k for k in ("prompt_ids", "response_ids", "prompt_width", "response_width") if rows and k not in rows[0]]
    if missing:
        raise ValueError(
            f"{path}: rows lack {missing}; only dumps written by hybridflow (trainer.rollout_data_dir) "
            "carry the token ids a replay needs"
        )
    return rows
