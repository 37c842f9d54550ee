"""``hf`` rollout engine: transformers ``generate`` on a plain (unsharded) causal LM.

Runs everywhere (CPU included). Generation is one batched ``generate`` call per chunk of
``micro_batch_size`` rows (all rows when unset); masks and positions are built with tensor ops.

Why the generate kwargs are spelled out: transformers fills every generation option left ``None``
from the model's ``generation_config.json`` and then from its global defaults (``top_k=50``), and
chat checkpoints ship ``repetition_penalty``/``top_k``/``top_p`` there. An RL rollout must sample
from exactly the policy the trainer scores (softmax(logits / temperature), with only the filters the
config asks for), so every sampling option is passed explicitly and the model's logits-shaping
options are neutralised.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.rollout.base import (
    BaseRollout,
    NamedTensors,
    assemble_rollout_output,
    iter_named_tensors,
    pad_responses,
    register_rollout,
    response_mask_through_eos,
)
from hybridflow.workers.rollout.sampling import (
    SamplingParams,
    as_id_list,
    resolve_sampling,
    sampling_params_from_config,
)

# logits-shaping options a checkpoint's generation_config may set, and the value that turns each off
_NEUTRAL_GENERATION_OPTIONS = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_p": 0.0,
    "min_length": 0,
    "min_new_tokens": 0,
}

# prefixes wrappers add to parameter names (torch.compile, DDP, FSDP1)
_WRAPPER_PREFIXES = ("_orig_mod.", "module.", "_fsdp_wrapped_module.")


@register_rollout("hf")
class HFRollout(BaseRollout):
    """Generate with ``module.generate``.

    Args:
        module: a transformers causal LM, used for inference only (eval mode, no grad).
        config: the rollout config section (veRL keys: temperature, top_k, top_p, do_sample,
            response_length, ignore_eos, micro_batch_size, val_kwargs).
        pad_token_id, eos_token_id: defaults for every call (meta_info may override them).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        config: Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | list[int],
    ):
        self.module = module
        self.train_params, self.val_params = sampling_params_from_config(config)
        self.micro_batch_size = config.get("micro_batch_size", None)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_id = as_id_list(eos_token_id)
        model_gen_config = getattr(module, "generation_config", None)
        self._neutral_options = {
            key: neutral
            for key, neutral in _NEUTRAL_GENERATION_OPTIONS.items()
            if getattr(model_gen_config, key, None) not in (None, neutral)
        }

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        config: Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | list[int],
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
    ) -> "HFRollout":
        """Load a separate inference copy of the model from a Hugging Face directory."""
        from transformers import AutoModelForCausalLM

        module = AutoModelForCausalLM.from_pretrained(model_path).to(device=device, dtype=dtype)
        return cls(module.eval(), config, pad_token_id, eos_token_id)

    # ------------------------------------------------------------------------------- generate

    def generate_kwargs(self, params: SamplingParams, eos_ids: list[int], pad_id: int) -> dict[str, Any]:
        """The full set of ``generate`` options for one call (see the module docstring for why)."""
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.response_length,
            pad_token_id=pad_id,
            # ignore_eos: an empty list stops on nothing (None would be filled from the model's
            # generation_config, i.e. stop on its eos)
            eos_token_id=[] if params.ignore_eos else eos_ids,
            num_beams=1,
            num_return_sequences=1,
            use_cache=True,
            **self._neutral_options,
        )
        if params.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(
                do_sample=True,
                temperature=params.temperature,
                top_k=max(params.top_k, 0),  # 0 disables top-k; None would mean "model default"
                top_p=params.top_p,
            )
        return kwargs

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        params = resolve_sampling(self.train_params, self.val_params, meta)
        eos_ids = as_id_list(meta["eos_token_id"]) if meta.get("eos_token_id") is not None else self.eos_token_id
        pad_id = int(meta["pad_token_id"]) if meta.get("pad_token_id") is not None else self.pad_token_id
        kwargs = self.generate_kwargs(params, eos_ids, pad_id)

        idx = prompts.batch["input_ids"]  # (B, P)
        attention_mask = prompts.batch["attention_mask"]  # (B, P)
        prompt_length = idx.size(1)
        device = next(self.module.parameters()).device
        chunk = self.micro_batch_size or idx.size(0)

        was_training = self.module.training
        self.module.eval()
        responses, lengths = [], []
        try:
            with torch.no_grad():
                for ids, mask in zip(idx.split(chunk), attention_mask.split(chunk)):
                    out = self.module.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
                    generated = out[:, prompt_length:]  # (b, r), r <= R
                    lengths.append(torch.full((ids.size(0),), generated.size(1), dtype=torch.long))
                    responses.append(pad_responses(generated, params.response_length, pad_id))
        finally:
            self.module.train(was_training)

        responses = torch.cat(responses).to(idx.device)  # (B, R)
        # a row that ended early is padded after its EOS; cut at the produced length too, so that a
        # stop for any other reason never counts pad tokens as response
        response_mask = response_mask_through_eos(
            responses, [] if params.ignore_eos else eos_ids, valid_lengths=torch.cat(lengths)
        )
        return assemble_rollout_output(
            prompts, responses, response_mask, extra_meta={"generated_tokens": int(response_mask.sum())}
        )

    # ---------------------------------------------------------------------------- weights

    @torch.no_grad()
    def load_weights(self, named_tensors: NamedTensors) -> int:
        """Copy full weights into the module in place (dtype/device converted by ``copy_``).

        Strict like ``load_state_dict``: an unknown name or a missing tensor raises. Tied weights
        (lm_head sharing the embedding) count as loaded when either name was given.
        """
        targets = self.module.state_dict(keep_vars=True)  # name -> Parameter/buffer, tied aliases included
        loaded_ptrs, count = set(), 0
        for name, tensor in iter_named_tensors(named_tensors):
            key = _resolve_name(name, targets)
            target = targets[key]
            if target.shape != tensor.shape:
                raise ValueError(f"shape mismatch for {name!r}: model {tuple(target.shape)}, given {tuple(tensor.shape)}")
            target.copy_(tensor)
            loaded_ptrs.add(target.data_ptr())
            count += 1
        missing = [k for k, t in targets.items() if t.data_ptr() not in loaded_ptrs]
        if missing:
            raise KeyError(f"load_weights got no tensor for {len(missing)} entries, e.g. {missing[:5]}")
        return count


def _resolve_name(name: str, targets: Mapping[str, torch.Tensor]) -> str:
    if name in targets:
        return name
    stripped = name
    while stripped.startswith(_WRAPPER_PREFIXES):
        stripped = stripped.split(".", 1)[1]
    if stripped in targets:
        return stripped
    raise KeyError(f"load_weights: {name!r} is not a tensor of the rollout model")
