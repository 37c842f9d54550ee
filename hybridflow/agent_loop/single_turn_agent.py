"""``single_turn_agent``: one generation from the dataset's prompt tokens; the simplest trajectory."""

from __future__ import annotations

from hybridflow.agent_loop.base import AgentLoopBase, AgentLoopOutput, register
from hybridflow.rollout.sampling import SamplingParams


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    async def run(self, sampling_params: SamplingParams, **sample) -> AgentLoopOutput:
        prompt_ids = list(sample["prompt_ids"])
        params = (
            sampling_params.with_overrides({"response_length": self.settings.response_length})
            if sampling_params.response_length > self.settings.response_length
            else sampling_params
        )
        out = await self.server_manager.generate(sample["request_id"], prompt_ids, params)
        response = out.token_ids[: self.settings.response_length]
        log_probs = out.log_probs[: len(response)] if out.log_probs is not None else None
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response,
            response_mask=[1] * len(response),
            response_logprobs=log_probs,
            num_turns=2,  # user + assistant, as veRL counts
        )
