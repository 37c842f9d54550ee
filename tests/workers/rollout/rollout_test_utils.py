"""Helpers shared by the rollout tests: left-padded prompt batches and the rollout config."""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.protocol import DataProto

PAD_ID, EOS_ID = 0, 2  # the tiny tokenizer's <|endoftext|> and <|im_end|>

TEXTS = ["hello", "1+2=", "what is 3*4?", "a", "The sum of 17 and 25", "x"]


def rollout_config(**overrides):
    config = {
        "name": "hf",
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "do_sample": True,
        "response_length": 8,
        "ignore_eos": False,
        "micro_batch_size": None,
        "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False},
    }
    config.update(overrides)
    return config


def make_prompts(tokenizer, texts=TEXTS, meta_info=None) -> DataProto:
    """A dataloader-style batch: LEFT-padded ids, mask, positions (veRL: cumsum(mask) - 1, clipped at 0)."""
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    position_ids = torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": position_ids},
        non_tensors={"data_source": np.array([f"src{i}" for i in range(len(texts))], dtype=object)},
        meta_info=dict(meta_info or {}),
    )


def with_meta(prompts: DataProto, **meta) -> DataProto:
    """The same prompts with other meta_info (rollouts must not depend on anything else)."""
    return DataProto.from_dict(
        tensors={k: prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids")},
        non_tensors=dict(prompts.non_tensor_batch),
        meta_info=meta,
    )
