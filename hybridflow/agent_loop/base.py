"""What an agent loop is: one trajectory, written as an async function over the rollout server.

An agent loop gets the sample (its prompt token ids and whatever the dataset row carries: raw chat
messages, ``tools_kwargs``, ``interaction_kwargs``, ...) and the sampling parameters, talks to the
server through ``server_manager.generate(request_id, prompt_ids, sampling_params)`` as many times as
it likes, and returns an ``AgentLoopOutput``: the prompt, the response token ids (the model's own
tokens and whatever it appended: tool results, user turns), and ``response_mask`` saying which
response tokens the model sampled (1) and which it did not (0). Only the rollout knows this, so the
driver never rebuilds it.

Loops register by name (``@register("my_agent")``) and are chosen per sample by the dataset's
``agent_name`` column, else ``rollout.agent.default_agent_loop``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from hybridflow.utils.registry import Registry
from hybridflow.workers.rollout.sampling import SamplingParams


@dataclass(frozen=True)
class AgentLoopSettings:
    """The rollout settings agent loops read, validated once from the config."""

    prompt_length: int
    response_length: int
    default_agent_loop: str = "single_turn_agent"
    num_workers: int = 1
    multi_turn: dict = field(default_factory=dict)  # rollout.multi_turn section, plain
    extra: dict = field(default_factory=dict)  # anything else a user's loop may want (plain dict)

    @classmethod
    def from_rollout_config(cls, rollout: dict) -> "AgentLoopSettings":
        agent = rollout.get("agent") or {}
        return cls(
            prompt_length=int(rollout["prompt_length"]),
            response_length=int(rollout["response_length"]),
            default_agent_loop=str(agent.get("default_agent_loop") or "single_turn_agent"),
            num_workers=max(1, int(agent.get("num_workers") or 1)),
            multi_turn=dict(rollout.get("multi_turn") or {}),
            extra={"rollout": rollout},
        )


@dataclass
class AgentLoopOutput:
    """One finished trajectory. ``response_mask`` and ``response_logprobs`` align with ``response_ids``
    (log-probs are 0 where the mask is 0)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None
    num_turns: int = 0
    reward_score: float | None = None  # a score the loop computed itself (tool / interaction), if any
    metrics: dict[str, float] = field(default_factory=dict)  # per-trajectory numbers, averaged per step
    extra_fields: dict[str, Any] = field(default_factory=dict)  # per-sample values for non_tensor_batch

    def __post_init__(self):
        if len(self.response_mask) != len(self.response_ids):
            raise ValueError(f"response_mask has {len(self.response_mask)} entries for {len(self.response_ids)} response tokens")
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(f"response_logprobs has {len(self.response_logprobs)} entries for {len(self.response_ids)} response tokens")


class AgentLoopBase(ABC):
    """One instance per trajectory. ``server_manager.generate`` is the only way to the model."""

    def __init__(self, settings: AgentLoopSettings, server_manager, tokenizer, **kwargs):
        self.settings = settings
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.loop_kwargs = kwargs  # from the agent loop config file entry, if any

    @abstractmethod
    async def run(self, sampling_params: SamplingParams, **sample) -> AgentLoopOutput:
        """Run one trajectory. ``sample`` holds ``prompt_ids``, ``request_id`` and the dataset row's
        non-tensor fields (``raw_prompt``, ``extra_info``, ``tools_kwargs``, ...)."""


AGENT_LOOPS: Registry[type[AgentLoopBase]] = Registry("agent loop")


def register(agent_name: str):
    """Class decorator: ``@register("my_agent")`` makes a loop selectable by ``agent_name``."""
    return AGENT_LOOPS.register(agent_name)
