"""Supervised fine-tuning dataset over parquet (veRL's ``SFTDataset`` keys).

The prompt is rendered with the chat template (one user turn, generation prompt added), the response
is followed by eos, and the pair is RIGHT-padded to ``max_length``.

``loss_mask[t] == 1`` exactly where token ``t`` is a response token (eos included): it marks the
*targets*. With next-token logits ``logits[:, :-1]`` predicting ``input_ids[:, 1:]``, weight the loss
with ``loss_mask[:, 1:]``. (veRL's SFTDataset stores the mask shifted one to the left instead.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from hybridflow.config.convert import as_section
from hybridflow.config.sft_trainer import SFTDataConfig
from hybridflow.data.rl_dataset import pad_ids, position_ids_from_mask, read_parquet_rows, require_chat_template
from hybridflow.data.row_limit import limit_rows

SFT_TRUNCATIONS = ("error", "left", "right")


def sft_data_config(config: Mapping | SFTDataConfig | None) -> SFTDataConfig:
    """The SFT ``data`` section as its typed ``SFTDataConfig`` (a DictConfig or dict is converted, keys and
    types checked; absent: the defaults), with the values this dataset cannot work with refused by key."""
    cfg = as_section(config, SFTDataConfig, "data")
    if cfg.truncation not in SFT_TRUNCATIONS:
        raise ValueError(f"data.truncation must be one of {SFT_TRUNCATIONS} for SFT, got {cfg.truncation!r}")
    if int(cfg.max_length) <= 0:
        raise ValueError(f"data.max_length must be positive, got {cfg.max_length}")
    return cfg


def lookup(row: dict, key: str, dict_keys: Sequence[str], what: str, idx: int) -> Any:
    """``row[key][k1][k2]...``; a missing step names the row and the path walked so far."""
    val, path = row[key], key
    for k in dict_keys:
        if not isinstance(val, Mapping) or k not in val:
            raise KeyError(f"{what} of row {idx}: {path} has no key {k!r}")
        val, path = val[k], f"{path}.{k}"
    return val


class SFTDataset(Dataset):
    """(prompt, response) pairs for SFT. ``config`` is the ``data`` section: an ``SFTDataConfig``, or a
    DictConfig / dict read into one. ``use_chat_template=False``: the prompt column's text as it is.
    ``max_samples`` > 0: only the first that many rows."""

    def __init__(
        self,
        parquet_files,
        tokenizer,
        config: Mapping | SFTDataConfig | None = None,
        use_chat_template: bool = True,
        max_samples: int = -1,
    ):
        self.config = sft_data_config(config)
        self.use_chat_template = use_chat_template
        self.tokenizer = tokenizer
        self.max_length = int(self.config.max_length)
        self.truncation = self.config.truncation
        if self.use_chat_template:
            require_chat_template(tokenizer)
        rows = read_parquet_rows(parquet_files, required_column=self.config.prompt_key)
        rows = limit_rows(rows, max_samples, what=str(parquet_files))  # the first rows (veRL's SFT data: no shuffle)
        if self.config.response_key not in rows[0]:
            raise KeyError(
                f"SFT data {parquet_files} has no column {self.config.response_key!r} (response_key); "
                f"its columns are: {list(rows[0])}"
            )
        self.prompts = [
            lookup(r, self.config.prompt_key, self.config.prompt_dict_keys or (), "prompt", i)
            for i, r in enumerate(rows)
        ]
        self.responses = [
            lookup(r, self.config.response_key, self.config.response_dict_keys or (), "response", i)
            for i, r in enumerate(rows)
        ]

    def __len__(self) -> int:
        return len(self.prompts)

    def _prompt_text(self, prompt) -> str:
        if not self.use_chat_template:
            return str(prompt)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **dict(self.config.apply_chat_template_kwargs)
        )

    def __getitem__(self, idx: int) -> dict:
        encode = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        prompt_ids = encode(self._prompt_text(self.prompts[idx]))
        response_ids = encode(str(self.responses[idx]) + self.tokenizer.eos_token)
        ids = prompt_ids + response_ids
        is_response = [0] * len(prompt_ids) + [1] * len(response_ids)
        if len(ids) > self.max_length:
            if self.truncation == "error":
                raise ValueError(
                    f"SFT row {idx} has {len(ids)} tokens (prompt {len(prompt_ids)} + response "
                    f"{len(response_ids)}) > max_length={self.max_length}; set data.truncation to left or right"
                )
            cut = slice(len(ids) - self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
            ids, is_response = ids[cut], is_response[cut]
        input_ids, attention_mask = pad_ids(ids, self.max_length, self.tokenizer.pad_token_id, left=False)
        loss_mask = torch.zeros(self.max_length, dtype=torch.long)
        loss_mask[: len(is_response)] = torch.tensor(is_response, dtype=torch.long)
        return {
            "input_ids": input_ids,  # (L,)
            "attention_mask": attention_mask,  # (L,)
            "position_ids": position_ids_from_mask(attention_mask),  # (L,)
            "loss_mask": loss_mask,  # (L,) 1 on response tokens
        }
