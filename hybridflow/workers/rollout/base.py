"""The rollout engine interface, its registry, and the output layout every engine returns.

An engine turns a batch of LEFT-padded prompts into one response per row. Whatever the engine
(``hf``: transformers ``generate``; ``vllm``), the returned DataProto has the same layout, so the
workers and the trainer never look at which engine ran:

    prompts         (B, P)    the input ids, unchanged
    responses       (B, R)    right-padded with the pad id to exactly R = response_length
    input_ids       (B, P+R)  prompts ++ responses
    attention_mask  (B, P+R)  prompt mask ++ response mask (1 up to AND including the first EOS)
    position_ids    (B, P+R)  the response continues from the last prompt position

Between training and generation the hybrid engine pushes the trainer's full weights into the
engine with ``load_weights`` (in memory, never through disk); ``sleep``/``wake_up`` release and
reacquire the engine's memory around the training phase where the engine supports it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tensordict import TensorDict

from hybridflow.protocol import DataProto
from hybridflow.utils.registry import Registry

NamedTensors = Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]


class BaseRollout(ABC):
    """A generation engine: prompts in, one sampled response per row out."""

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per prompt row; see the module docstring for the output layout."""

    @abstractmethod
    def load_weights(self, named_tensors: NamedTensors) -> int:
        """Copy full (unsharded) weights, named as in the Hugging Face model, into the engine.

        Returns the number of tensors loaded.
        """

    def sleep(self, level: int = 1) -> None:
        """Free the engine's memory while the trainer runs (no-op where there is nothing to free)."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Reacquire what ``sleep`` freed (``tags``: e.g. ["weights"] then ["kv_cache"] where supported)."""


ROLLOUT_ENGINES: Registry[type[BaseRollout]] = Registry("rollout engine")


def register_rollout(name: str):
    """Class decorator: make an engine selectable as ``actor_rollout_ref.rollout.name=<name>``."""
    return ROLLOUT_ENGINES.register(name)


def get_rollout_class(name: str) -> type[BaseRollout]:
    return ROLLOUT_ENGINES.get(name)


def iter_named_tensors(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    """Accept a state dict or an iterable of (name, tensor) pairs; DTensors are gathered to full."""
    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    for name, tensor in items:
        if hasattr(tensor, "full_tensor"):  # torch.distributed.tensor.DTensor (FSDP2 shards)
            tensor = tensor.full_tensor()
        yield name, tensor


# ----------------------------------------------------------------------------- output layout


def pad_responses(responses: torch.Tensor, length: int, pad_token_id: int) -> torch.Tensor:
    """Right-pad (or cut) (B, r) token ids to (B, length) with the pad id."""
    r = responses.size(1)
    if r >= length:
        return responses[:, :length]
    pad = responses.new_full((responses.size(0), length - r), pad_token_id)
    return torch.cat([responses, pad], dim=1)


def response_mask_through_eos(
    responses: torch.Tensor, eos_token_ids: list[int], valid_lengths: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, R) int64 mask: 1 up to and including the first EOS of each row, 0 after it.

    Rows without an EOS are 1 everywhere (cut by the length limit), except past ``valid_lengths``
    (how many tokens the engine actually produced for the row) where given. Works when pad == eos:
    everything after the first EOS is 0, whatever its value.
    """
    if eos_token_ids:
        is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device))
        # number of EOS strictly before each position: > 0 means the row has already ended
        eos_before = torch.cumsum(is_eos, dim=1) - is_eos.long()
        mask = eos_before == 0
    else:
        mask = torch.ones_like(responses, dtype=torch.bool)
    if valid_lengths is not None:
        positions = torch.arange(responses.size(1), device=responses.device)
        mask &= positions.unsqueeze(0) < valid_lengths.to(responses.device).unsqueeze(1)
    return mask.long()


def assemble_rollout_output(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    extra_tensors: Mapping[str, torch.Tensor] | None = None,
    extra_meta: Mapping[str, Any] | None = None,
) -> DataProto:
    """Build the output DataProto (layout in the module docstring) from (B, R) responses and mask.

    ``non_tensor_batch`` and ``meta_info`` of the input are kept.
    """
    idx = prompts.batch["input_ids"]  # (B, P)
    attention_mask = prompts.batch["attention_mask"]  # (B, P)
    position_ids = prompts.batch["position_ids"]  # (B, P)
    batch_size, response_length = responses.shape
    responses = responses.to(device=idx.device, dtype=idx.dtype)

    # positions continue from the last prompt position: last + 1, last + 2, ... (B, R)
    delta = torch.arange(1, response_length + 1, device=position_ids.device, dtype=position_ids.dtype)
    response_position_ids = position_ids[..., -1:] + delta

    tensors = {
        "prompts": idx,
        "responses": responses,
        "input_ids": torch.cat([idx, responses], dim=-1),  # (B, P+R)
        "attention_mask": torch.cat(
            [attention_mask, response_mask.to(device=attention_mask.device, dtype=attention_mask.dtype)], dim=-1
        ),
        "position_ids": torch.cat([position_ids, response_position_ids], dim=-1),
    }
    tensors.update(extra_tensors or {})
    meta_info = dict(prompts.meta_info)
    meta_info.update(extra_meta or {})
    return DataProto(
        batch=TensorDict(tensors, batch_size=[batch_size]),
        non_tensor_batch=dict(prompts.non_tensor_batch),
        meta_info=meta_info,
    )
