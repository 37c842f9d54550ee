"""JudgeWorker: serves a generative reward model (an LLM judge), or a distillation teacher, on a rollout engine.

The judge is ``reward.reward_model.model_path`` on the engine ``reward.reward_model.rollout.name``
(hf or vllm), built from the same ``ServerSpec`` and ``ROLLOUT_SERVERS`` registry as the policy's
rollout, on an ``EngineLoop`` of this process (veRL's reward loop serves its reward model as rollout
replicas too). It never receives weights: the judge is fixed. The driver reaches each rank's server
with the group's ``handles(SERVER_HANDLE, role)``, exactly as the agent loop reaches the policy's
(``server_generate`` for a remote worker, ``.server`` / ``.engine_loop`` in process).

Built from ``model_path``, the typed ``reward.reward_model.rollout`` section and ``trust_remote_code``.
``rollout.max_model_len`` null means prompt_length + response_length, as veRL sizes it.

A distillation teacher is the same worker (``path_key`` names its model key in errors); the driver
calls ``score_tokens`` on a batch of the student's samples, split across the teacher's ranks.
"""

from __future__ import annotations

import atexit
import dataclasses

import torch

import hybridflow.workers.rollout  # noqa: F401  (the engines package: registers hf and vllm)
from hybridflow.config.rollout import RolloutConfig
from hybridflow.protocol import DataProto
from hybridflow.rollout.sampling import model_eos_token_ids
from hybridflow.rollout.server import EngineLoop, ServerSpec, rollout_server_class
from hybridflow.single_controller.base import Dispatch, Worker, register
from hybridflow.single_controller.base.worker import default_device_backend
from hybridflow.utils.determinism import apply_full_determinism
from hybridflow.utils.torch_dtypes import resolve_dtype
from hybridflow.workers.model_loading import load_model, load_tokenizer, local_model_path

MODEL_PATH_KEY = "reward.reward_model.model_path"


def judge_engine_config(rollout: RolloutConfig) -> RolloutConfig:
    """The reward.reward_model.rollout section as the engines read it (max_model_len filled in)."""
    if rollout.max_model_len is None:
        rollout = dataclasses.replace(rollout, max_model_len=rollout.prompt_length + rollout.response_length)
    return rollout


class JudgeWorker(Worker):
    """One judge engine per rank (see the module docstring)."""

    def __init__(
        self, model_path: str, rollout: RolloutConfig, trust_remote_code: bool = False, path_key: str = MODEL_PATH_KEY
    ):
        super().__init__()
        self.model_path, self.rollout, self.trust_remote_code = model_path, rollout, bool(trust_remote_code)
        self.path_key = path_key
        self.device, _ = default_device_backend()
        self.server = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        path = local_model_path(self.model_path, self.path_key)
        trust = self.trust_remote_code
        rollout = judge_engine_config(self.rollout)
        apply_full_determinism([rollout])  # its full_determinism: kernels and seed, as the policy's rollout worker
        name = rollout.name
        server_cls = rollout_server_class(name, "rollout.name")  # an unknown engine fails here, naming the known ones
        self.tokenizer = load_tokenizer(path, trust)
        eos = tuple(model_eos_token_ids(path, self.tokenizer))
        pad = self.tokenizer.pad_token_id
        dtype = resolve_dtype(rollout.dtype, str(self.device))
        module = None
        if server_cls.needs_module:
            module = (
                load_model(path, "causal_lm", trust_remote_code=trust)
                .to(device=self.device, dtype=getattr(torch, dtype))
                .eval()
            )
        spec = ServerSpec(
            model_path=path,
            config=rollout,
            pad_token_id=int(eos[0] if pad is None else pad),
            eos_token_ids=eos,
            device=str(self.device),
            dtype=dtype,
            trust_remote_code=trust,
            module=module,
        )
        self.engine_loop = EngineLoop(f"judge-engine-rank{self.rank}")

        async def build():
            return server_cls(spec)

        self.server = self.engine_loop.run(build())
        atexit.register(self.shutdown_judge)  # before the engine loop stops: engines with processes stop them
        if rollout.free_cache_engine:
            self.engine_loop.run(self.server.sleep())

    async def server_generate(self, prompt_ids, params, request_id: str, logprobs: bool = False):
        """One judge request (a RayServerHandle's call, on the rollout concurrency group's event loop)."""
        return await self.engine_loop.wrap(self.server.generate(prompt_ids, params, request_id, logprobs))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def score_tokens(self, data: DataProto) -> DataProto:
        """The model's log-probs at each response position of ``data`` (the student's samples):
        ``teacher_ids`` / ``teacher_log_probs`` (B, R, K), K = ``meta_info["topk"]`` or 1 (the sampled
        token); zero past each response's end."""
        topk = int(data.meta_info["topk"])
        b = data.batch
        responses, width = b["responses"], b["responses"].size(1)
        prompt_mask = b["attention_mask"][:, : b["input_ids"].size(1) - width].bool()
        lengths = b["attention_mask"][:, -width:].sum(-1).tolist()
        sequences = [
            b["input_ids"][i, : prompt_mask.size(1)][prompt_mask[i]].tolist() + responses[i, :n].tolist()
            for i, n in enumerate(lengths)
        ]
        scored = self.engine_loop.run(self.server.score(sequences, topk))
        ids = torch.zeros(*responses.shape, max(topk, 1), dtype=torch.long)
        log_probs = torch.zeros(ids.shape)
        for i, ((top, values), n) in enumerate(zip(scored, lengths)):
            start = int(prompt_mask[i].sum()) - 1  # the row that predicts the first response token
            ids[i, :n], log_probs[i, :n] = top[start : start + n], values[start : start + n]
        return DataProto.from_dict({"teacher_ids": ids, "teacher_log_probs": log_probs})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_judge(self) -> None:
        """Reacquire the engine's memory before a batch of verdicts (rollout.free_cache_engine)."""
        self.engine_loop.run(self.server.wake_up())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_judge(self) -> None:
        """Free the engine's memory while the policy trains (a no-op where the engine cannot)."""
        self.engine_loop.run(self.server.sleep())

    def release_engines(self) -> None:
        self.shutdown_judge()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown_judge(self) -> None:
        """Release the engine (its processes, its memory); idempotent."""
        server, self.server = self.server, None
        if server is not None and self.engine_loop.loop.is_running():
            try:
                self.engine_loop.run(server.shutdown(), timeout=60)
            finally:
                self.engine_loop.close()
            atexit.unregister(self.shutdown_judge)
