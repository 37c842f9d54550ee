"""RL prompt dataset over parquet files (veRL's ``RLHFDataset`` layout and ``data.*`` keys).

Each row holds ``prompt`` (chat messages), ``data_source``, ``ability``, ``reward_model`` and
``extra_info`` (and optionally ``agent_name``, the agent loop of the sample). An item is the
chat-templated prompt tokenized and LEFT-padded to ``max_prompt_length`` (the rollout appends
responses on the right), plus every other column as is, plus what the agent loops read (veRL 0.9.1's
item): ``raw_prompt`` (the chat messages), ``tools_kwargs`` and ``interaction_kwargs`` (from
``extra_info``, ``{}`` when absent) and ``index``. With ``tool_config_path`` (veRL's
``data.tool_config_path``, by default the rollout's), overlong prompts are measured with the tool
schemas rendered in, as the multi-turn rollout will render them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from hybridflow.config.convert import as_section
from hybridflow.config.data import DataConfig
from hybridflow.data.row_limit import limit_rows
from hybridflow.utils.tool_config import tool_schemas

logger = logging.getLogger(__name__)

TRUNCATIONS = ("error", "left", "right", "middle")


# --- pure helpers (shared with the SFT dataset)


def truncate_ids(ids: Sequence[int], max_length: int, truncation: str) -> list[int]:
    """Cut ``ids`` to ``max_length``: keep the end (left), the start (right), or both halves (middle)."""
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if truncation == "left":
        return ids[len(ids) - max_length :]
    if truncation == "right":
        return ids[:max_length]
    if truncation == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + (ids[len(ids) - tail :] if tail else [])
    raise ValueError(f"truncation must be one of {TRUNCATIONS} to shorten a sequence, got {truncation!r}")


def pad_ids(ids: Sequence[int], max_length: int, pad_token_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to ``max_length`` -> (input_ids, attention_mask), both ``(max_length,)`` int64."""
    n_pad = max_length - len(ids)
    if n_pad < 0:
        raise ValueError(f"sequence of {len(ids)} tokens does not fit max_length={max_length}")
    pad, body = [pad_token_id] * n_pad, list(ids)
    input_ids = torch.tensor(pad + body if left else body + pad, dtype=torch.long)
    mask = torch.tensor([0] * n_pad + [1] * len(body) if left else [1] * len(body) + [0] * n_pad, dtype=torch.long)
    return input_ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions count real tokens only: cumsum(mask) - 1, with left padding clipped to 0."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)


def tokenizer_name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def require_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {tokenizer_name(tokenizer)!r} has no chat template; prompts are chat messages, so "
            "use an instruct/chat tokenizer or set tokenizer.chat_template"
        )


def read_parquet_rows(data_files: str | Sequence[str], required_column: str | None = None) -> list[dict]:
    """Rows of one or many parquet files as dicts; columns missing from some files become None."""
    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not files:
        raise ValueError("no data files given")
    per_file, columns = [], []
    for path in files:
        path = os.path.expanduser(str(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data file not found: {path}")
        table = pq.read_table(path)
        if required_column is not None and required_column not in table.column_names:
            raise KeyError(
                f"parquet file {path} has no column {required_column!r} (prompt_key); "
                f"its columns are: {table.column_names}"
            )
        if table.num_rows == 0:
            raise ValueError(f"parquet file {path} has no rows")
        per_file.append(table.to_pylist())
        columns += [c for c in table.column_names if c not in columns]
    return [{c: row.get(c) for c in columns} for rows in per_file for row in rows]


def collate_fn(data_list: list[dict]) -> dict:
    """Stack tensors; everything else becomes a numpy object array (one entry per sample)."""
    tensors: dict[str, list] = {}
    others: dict[str, list] = {}
    for item in data_list:
        for key, val in item.items():
            (tensors if isinstance(val, torch.Tensor) else others).setdefault(key, []).append(val)
    out: dict[str, Any] = {k: torch.stack(v) for k, v in tensors.items()}
    for key, vals in others.items():
        arr = np.empty(len(vals), dtype=object)  # element-wise, so lists stay lists (no 2-D arrays)
        for i, v in enumerate(vals):
            arr[i] = v
        out[key] = arr
    return out


# --- config


def data_config(config: Mapping | DataConfig | None) -> DataConfig:
    """The ``data`` section as its typed ``DataConfig`` (a DictConfig or dict is converted, keys and types
    checked; absent: the defaults), with the values the dataset cannot work with refused by key."""
    cfg = as_section(config, DataConfig, "data")
    if cfg.truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation must be one of {TRUNCATIONS}, got {cfg.truncation!r}")
    if int(cfg.max_prompt_length) <= 0:
        raise ValueError(f"data.max_prompt_length must be positive, got {cfg.max_prompt_length}")
    return cfg


# --- dataset


class RLHFDataset(Dataset):
    """Prompts for RL. ``config`` is the ``data`` section: a ``DataConfig``, or a DictConfig / dict (veRL's
    signature) read into one. ``max_samples`` > 0: only that many rows of the files (``row_limit``)."""

    def __init__(
        self, data_files, tokenizer, config: Mapping | DataConfig | None = None, processor=None, max_samples: int = -1
    ):
        self.config = data_config(config)
        self.tokenizer = tokenizer
        self.processor = processor  # accepted for veRL compatibility; multimodal inputs are not supported
        self.prompt_key = self.config.prompt_key
        self.max_prompt_length = int(self.config.max_prompt_length)
        self.truncation = self.config.truncation
        self.data_files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        require_chat_template(tokenizer)
        tools = (self.config.tool_config_path, self.config.function_tool_path)
        self.tool_schemas = tool_schemas(*tools) if any(tools) else None
        self.rows = read_parquet_rows(self.data_files, required_column=self.prompt_key)
        # data.train_max_samples / data.val_max_samples, before the length filter (as veRL)
        self.rows = limit_rows(self.rows, max_samples, self.config.shuffle, self.config.seed, str(self.data_files))
        if self.config.filter_overlong_prompts:
            self._filter_overlong()

    def _messages(self, row: dict) -> list[dict]:
        prompt = row[self.prompt_key]
        if isinstance(prompt, str):  # plain text prompt: one user turn
            return [{"role": "user", "content": prompt}]
        return list(prompt)

    def _render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **self.config.apply_chat_template_kwargs
        )

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _filter_overlong(self) -> None:
        lengths = [len(self._encode(self._render(self._messages(r), self.tool_schemas))) for r in self.rows]
        keep = [r for r, n in zip(self.rows, lengths) if n <= self.max_prompt_length]
        dropped = len(self.rows) - len(keep)
        if not keep:
            raise ValueError(
                f"all {len(self.rows)} prompts in {self.data_files} are longer than "
                f"max_prompt_length={self.max_prompt_length} (longest: {max(lengths)} tokens); "
                "raise data.max_prompt_length"
            )
        if dropped:
            logger.info(
                "RLHFDataset: filtered out %d of %d prompts longer than max_prompt_length=%d (longest: %d tokens)",
                dropped,
                len(self.rows),
                self.max_prompt_length,
                max(lengths),
            )
        self.rows = keep

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, idx: int) -> dict:
        row = dict(self.rows[idx])
        messages = self._messages(row)
        row.pop(self.prompt_key)
        text = self._render(messages)
        ids = self._encode(text)
        if len(ids) > self.max_prompt_length:
            if self.truncation == "error":
                raise ValueError(
                    f"prompt at row {idx} has {len(ids)} tokens > max_prompt_length={self.max_prompt_length}; "
                    "set data.truncation to left/right/middle or data.filter_overlong_prompts=True"
                )
            ids = truncate_ids(ids, self.max_prompt_length, self.truncation)
        input_ids, attention_mask = pad_ids(ids, self.max_prompt_length, self.tokenizer.pad_token_id, left=True)
        row["input_ids"] = input_ids  # (P,)
        row["attention_mask"] = attention_mask  # (P,)
        row["position_ids"] = position_ids_from_mask(attention_mask)  # (P,)
        row["raw_prompt_ids"] = ids
        row["raw_prompt"] = messages  # always, as veRL 0.9.1 (return_raw_chat): the agent loops template it
        if self.config.return_full_prompt:
            row["full_prompts"] = text
        extra = row.get("extra_info")
        extra = extra if isinstance(extra, dict) else {}
        row["index"] = idx if extra.get("index") is None else extra["index"]
        row["tools_kwargs"] = extra.get("tools_kwargs") or {}
        row["interaction_kwargs"] = extra.get("interaction_kwargs") or {}
        return row
