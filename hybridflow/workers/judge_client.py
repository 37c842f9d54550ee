"""RolloutJudge: the driver's side of a generative reward model, ``judge(prompts) -> verdicts``.

Each prompt becomes one request to the judge's rollout servers (the ``JudgeWorker`` ranks), routed
least-loaded by the agent loop's ``ServerManager``, all in flight at once; the answers are decoded
with the judge's own tokenizer. With ``chat_template`` (the default) a prompt is wrapped in the judge
tokenizer's chat template as one user message, as veRL's GenRM example sends a chat request (a
tokenizer without a template encodes it as it is); without, the raw text is the judge's prompt. A prompt longer than
``rollout.prompt_length`` tokens is not sent: its verdict is None.

The requests run on an event loop thread of the client's own; the driver waits under the judge
group's watchdog deadline, so a judge that stops answering is reported like any stuck worker.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from hybridflow.agent_loop.server_manager import SERVER_HANDLE, ServerHandle, ServerManager
from hybridflow.config.rollout import RolloutConfig
from hybridflow.rollout.sampling import SamplingParams, rollout_sampling
from hybridflow.rollout.server import EngineLoop
from hybridflow.single_controller.base import wait_with_deadline


class RolloutJudge:
    """``servers``: one handle per judge engine; ``group``: the judge workers (wake/sleep, watchdog)."""

    def __init__(
        self,
        servers: Sequence[ServerHandle],
        tokenizer,
        sampling: SamplingParams,
        prompt_length: int,
        group=None,
        free_cache_engine: bool = False,
    ):
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.prompt_length = int(prompt_length)
        self.group = group
        self.free_cache_engine = bool(free_cache_engine) and group is not None
        self._servers = ServerManager(list(servers), logprobs=False)
        self._calls = itertools.count()
        self._loop = EngineLoop("hybridflow-genrm-judge")

    @classmethod
    def from_group(cls, group, role: str | None, tokenizer, rollout: RolloutConfig) -> RolloutJudge:
        """A judge over every rank of ``group`` (JudgeWorkers; ``role`` inside a fused worker), sampling as
        ``rollout`` says (the typed ``reward.reward_model.rollout``)."""
        sampling, _ = rollout_sampling(rollout)
        return cls(
            group.handles(SERVER_HANDLE, role),
            tokenizer,
            sampling,
            rollout.prompt_length,
            group=group,
            free_cache_engine=rollout.free_cache_engine,
        )

    def encode(self, prompt: str, chat_template: bool = True) -> list[int]:
        tok = self.tokenizer
        if chat_template and getattr(tok, "chat_template", None):
            prompt = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
        return list(tok.encode(prompt, add_special_tokens=False))

    def __call__(self, prompts: Sequence[str], chat_template: bool = True) -> list[str | None]:
        ids = [self.encode(p, chat_template) for p in prompts]
        call = next(self._calls)

        async def one(i: int, prompt_ids: list[int]) -> str | None:
            if len(prompt_ids) > self.prompt_length or not prompt_ids:
                return None
            request_id = f"genrm-{call}-{i}"
            try:
                out = await self._servers.generate(request_id, prompt_ids, self.sampling)
            finally:
                self._servers.release(request_id)
            return self.tokenizer.decode(out.token_ids, skip_special_tokens=True)

        async def run_all():
            return await asyncio.gather(*(one(i, x) for i, x in enumerate(ids)))

        if self.free_cache_engine:
            self.group.wake_judge()
        try:
            future = self._loop.submit(run_all())
            return list(
                wait_with_deadline([future], None, group=self.group, what=f"genrm judge: {len(prompts)} verdicts")[0]
            )
        finally:
            if self.free_cache_engine:
                self.group.sleep_judge()

    def close(self) -> None:
        self._loop.close()
