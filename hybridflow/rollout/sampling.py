"""Sampling parameters of a rollout, read once from the typed rollout section and resolved per call.

The rollout section (``RolloutConfig``: ``temperature``, ``top_k``, ``top_p``, ``do_sample``,
``response_length``, ``ignore_eos``, ``val_kwargs``) gives two frozen ``SamplingParams`` at
construction: one for training rollouts and one for validation. Each call to
``generate_sequences`` then picks one of them (``meta_info["validate"]``) and applies whatever
overrides the caller put in ``meta_info``. Engines only ever see the resolved values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from hybridflow.config.rollout import RolloutConfig

# meta_info keys a caller may use to override the configured values for one call
OVERRIDABLE = ("do_sample", "temperature", "top_k", "top_p", "response_length", "ignore_eos", "stop_token_ids")


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and how much. ``top_k <= 0`` and ``top_p >= 1`` disable those filters;
    ``do_sample=False`` or ``temperature <= 0`` means greedy decoding."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    response_length: int = 512
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] | None = None  # None: the engine's EOS ids

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0

    def with_overrides(self, overrides: Mapping[str, Any]) -> SamplingParams:
        """A copy with the known keys of ``overrides`` applied (``None`` values are ignored)."""
        known = {f.name for f in fields(self)}
        picked = {k: overrides[k] for k in known if k in overrides and overrides[k] is not None}
        return _coerce(replace(self, **picked))


def _coerce(p: SamplingParams) -> SamplingParams:
    # yaml/CLI values arrive as strings or floats now and then ("1", 0.0); normalise once here
    return SamplingParams(
        do_sample=bool(p.do_sample),
        temperature=float(p.temperature),
        top_k=int(p.top_k) if p.top_k is not None else -1,
        top_p=float(p.top_p) if p.top_p is not None else 1.0,
        response_length=int(p.response_length),
        ignore_eos=bool(p.ignore_eos),
        stop_token_ids=tuple(as_id_list(p.stop_token_ids)) if p.stop_token_ids is not None else None,
    )


def rollout_sampling(rollout: RolloutConfig) -> tuple[SamplingParams, SamplingParams]:
    """(train, validation) parameters of the typed rollout section.

    Validation takes ``val_kwargs``'s filters and temperature and keeps the training
    ``response_length`` and ``ignore_eos``.
    """
    train = _coerce(
        SamplingParams(
            do_sample=rollout.do_sample,
            temperature=rollout.temperature,
            top_k=rollout.top_k,
            top_p=rollout.top_p,
            response_length=rollout.response_length,
            ignore_eos=rollout.ignore_eos,
        )
    )
    val = rollout.val_kwargs
    return train, train.with_overrides(
        {"do_sample": val.do_sample, "temperature": val.temperature, "top_k": val.top_k, "top_p": val.top_p}
    )


def resolve_sampling(train: SamplingParams, val: SamplingParams, meta_info: Mapping[str, Any]) -> SamplingParams:
    """Parameters for one ``generate_sequences`` call: validation or training, then meta_info overrides
    (``eos_token_id`` in meta_info, veRL's spelling, sets the stop ids)."""
    base = val if meta_info.get("validate", False) else train
    overrides = {k: meta_info[k] for k in OVERRIDABLE if k in meta_info}
    if meta_info.get("eos_token_id") is not None and "stop_token_ids" not in overrides:
        overrides["stop_token_ids"] = meta_info["eos_token_id"]
    return base.with_overrides(overrides)


def as_id_list(token_ids: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """EOS may be one id or several (e.g. Qwen's <|endoftext|> and <|im_end|>)."""
    if token_ids is None:
        return []
    if isinstance(token_ids, int):
        return [token_ids]
    return [int(t) for t in token_ids]


def request_seed(base_seed: int, request_id: str) -> int:
    """A stable 63-bit seed per (engine seed, request id) (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(f"{base_seed}:{request_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def model_eos_token_ids(model_path: str | None, tokenizer) -> list[int]:
    """Every id that ends a response: the model's ``generation_config.json`` ``eos_token_id`` (one id or
    several, e.g. Llama 3's ``<|eot_id|>`` besides ``<|end_of_text|>``), then the tokenizer's EOS if not
    among them. Chat models often stop at a token the tokenizer does not call EOS; ``HF generate``
    stops at the generation config's ids, so the rollout engines must too."""
    ids: list[int] = []
    if model_path:
        from transformers import GenerationConfig

        try:
            ids = as_id_list(GenerationConfig.from_pretrained(model_path).eos_token_id)
        except (OSError, ValueError):  # no generation_config.json: the tokenizer decides
            ids = []
    for t in as_id_list(getattr(tokenizer, "eos_token_id", None)):
        if t not in ids:
            ids.append(t)
    if not ids:
        raise ValueError(
            f"no EOS token id for {model_path!r}: neither generation_config.json nor the tokenizer names one"
        )
    return ids
