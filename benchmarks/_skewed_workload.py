"""A length-skewed rollout workload for ``async_throughput.py``: most trajectories are short, a few
are long, as in reasoning runs where a handful of responses run to the length limit.

``skewed_single_turn`` is a single-turn agent loop whose response length comes from the sample
(``extra_info.response_tokens``) and ignores EOS, so every run has the same token counts whatever the
policy learns. Ray's agent loop workers import this module through the job's
``worker_process_setup_hook`` (``register``), the driver by importing it.
"""

from __future__ import annotations

from hybridflow.agent_loop.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput

NAME = "skewed_single_turn"


class SkewedSingleTurnLoop(AgentLoopBase):
    async def run(self, sampling_params, **sample) -> AgentLoopOutput:
        tokens = int(sample["extra_info"]["response_tokens"])
        params = sampling_params.with_overrides({"response_length": tokens, "ignore_eos": True})
        out = await self.server_manager.generate(sample["request_id"], list(sample["prompt_ids"]), params)
        return AgentLoopOutput(
            prompt_ids=list(sample["prompt_ids"]),
            response_ids=out.token_ids,
            response_mask=[1] * len(out.token_ids),
            response_logprobs=out.log_probs,
            num_turns=2,
        )


def register() -> None:
    AGENT_LOOPS.register(NAME, SkewedSingleTurnLoop, override=True)


register()
