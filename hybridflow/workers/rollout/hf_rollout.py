"""``HFRollout``: the batch interface (prompts DataProto in, responses out) over the hf server.

For code that holds a model and a batch and wants responses, without workers or a driver: offline
evaluation, benchmarks, notebooks. It runs the same pipeline as training (``single_turn_agent`` over
an ``HFServer`` on its own engine loop), so its outputs follow the rollout layout of
``hybridflow/agent_loop/postprocess.py`` and its sampling is the server's (reproducible per request id:
``meta_info["global_steps"]`` and the row index name the requests).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hybridflow.config.convert import as_section
from hybridflow.config.rollout import RolloutConfig, rollout_as_in_yaml
from hybridflow.protocol import DataProto
from hybridflow.rollout.sampling import as_id_list
from hybridflow.rollout.server import EngineLoop, ServerSpec
from hybridflow.workers.rollout.hf_server import HFServer


class HFRollout:
    """Generate with ``module`` (used for inference; its train/eval mode is restored after each call).

    Args:
        config: the rollout config section (veRL keys: temperature, top_k, top_p, do_sample,
            response_length, ignore_eos, val_kwargs, max_num_seqs, seed, calculate_log_probs, and
            multi_turn / agent for multi-turn rows).
        pad_token_id, eos_token_id: defaults for every call (meta_info may override them).
        tokenizer: needed by loops that template conversations (rows with ``agent_name=tool_agent``).
        chat_template_kwargs: ``data.apply_chat_template_kwargs`` for those loops (meta_info's
            ``apply_chat_template_kwargs`` overrides them per call).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        config: Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | list[int],
        tokenizer=None,
        chat_template_kwargs: Mapping | None = None,
    ):
        from hybridflow.agent_loop.base import agent_loop_settings
        from hybridflow.agent_loop.server_manager import LocalServerHandle
        from hybridflow.agent_loop.worker import AgentLoopWorker

        self.module = module
        # the door: veRL's HFRollout takes the rollout section as a mapping, read into its class here.
        # It reads micro_batch_size (here the engine batches by max_num_seqs); every call sets
        # prompt_length to its batch's width
        section = {k: v for k, v in dict(config).items() if k != "micro_batch_size"}
        section["prompt_length"] = section.get("prompt_length") or 1
        section.setdefault("response_length", 512)
        rollout = as_section(section, RolloutConfig, "actor_rollout_ref.rollout", rollout_as_in_yaml)
        self.engine_loop = EngineLoop("hf-rollout")
        spec = ServerSpec(
            model_path="",
            config=rollout,
            pad_token_id=int(pad_token_id),
            eos_token_ids=tuple(as_id_list(eos_token_id)),
            module=module,
        )
        self.server = self.engine_loop.run(_build(spec))
        self._worker = AgentLoopWorker(
            agent_loop_settings(rollout, chat_template_kwargs),
            [LocalServerHandle(self)],
            tokenizer=tokenizer,
            pad_token_id=pad_token_id,
        )

    @classmethod
    def from_pretrained(
        cls,
        model_path: str,
        config: Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | list[int],
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        tokenizer=None,
        chat_template_kwargs: Mapping | None = None,
    ) -> HFRollout:
        """Load a separate inference copy of the model from a Hugging Face directory (or a GGUF file)."""
        from hybridflow.workers.model_loading import load_model, local_model_path

        module = load_model(local_model_path(model_path, "model_path"), "causal_lm").to(device=device, dtype=dtype)
        return cls(
            module.eval(),
            config,
            pad_token_id,
            eos_token_id,
            tokenizer=tokenizer,
            chat_template_kwargs=chat_template_kwargs,
        )

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        was_training = self.module.training
        self.module.eval()
        try:
            out = self.engine_loop.run(self._worker.generate_sequences(prompts))
        finally:
            self.module.train(was_training)
        out.meta_info.pop("metrics", None)
        meta = dict(prompts.meta_info)
        meta["generated_tokens"] = int(out.batch["response_mask"].sum())
        out.meta_info = meta
        for key, value in prompts.non_tensor_batch.items():  # keep the input's per-row data
            out.non_tensor_batch.setdefault(key, value)
        return out

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy a full set of weights in (strict: an unknown name, a missing tensor or a wrong shape raises)."""
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        count = self.engine_loop.run(self.server.load_weights(items))
        self.engine_loop.run(self.server.finish_weight_update())
        return count

    def close(self) -> None:
        """Shut the server down (its requests aborted, its decode thread released), then its loop."""
        try:
            self.engine_loop.run(self.server.shutdown())
        finally:
            self.engine_loop.close()


async def _build(spec: ServerSpec) -> HFServer:
    return HFServer(spec)
