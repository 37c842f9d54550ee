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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agent_loop.trace import trace_store
from hybridflow.config.base import to_dict
from hybridflow.config.convert import as_section
from hybridflow.config.errors import ConfigError
from hybridflow.config.rollout import MultiTurnConfig, RolloutConfig, TraceConfig, rollout_as_in_yaml
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.utils.registry import Registry


@dataclass(frozen=True)
class AgentLoopSettings:
    """What agent loops read, taken from the typed rollout section by ``agent_loop_settings`` (the worker
    narrows ``prompt_length`` / ``response_length`` to each call's)."""

    prompt_length: int
    response_length: int
    default_agent_loop: str = "single_turn_agent"
    num_workers: int = 1
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent_loop_config_path: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)  # data.apply_chat_template_kwargs
    over_sample_rate: float = 0.0  # training calls keep the first int(N * (1 - rate)) trajectories (over_sample.py)
    trace: TraceConfig | None = None  # rollout.trace (trace.py); None: nothing traced
    trace_uri: str | None = None  # its store, resolved on the driver (trace.trace_store)
    rollout: RolloutConfig | None = None  # the whole typed section
    extra: dict = field(default_factory=dict)  # anything else a user's loop may want; "rollout": the section, plain


def agent_loop_settings(
    rollout: RolloutConfig | Mapping, chat_template_kwargs: Mapping | None = None, run_dir: str | None = None
) -> AgentLoopSettings:
    """The settings of ``rollout`` (a ``RolloutConfig``; a DictConfig or dict is read into one).
    ``run_dir``: given by the one caller that traces (main_ppo, ``trainer.default_local_dir``): with a
    ``rollout.trace.backend`` the trajectories are traced, to the store ``trace_store`` picks there."""
    rollout = as_section(rollout, RolloutConfig, "actor_rollout_ref.rollout", rollout_as_in_yaml)
    traced = run_dir is not None and rollout.trace.backend is not None
    return AgentLoopSettings(
        prompt_length=rollout.prompt_length,
        response_length=rollout.response_length,
        default_agent_loop=rollout.agent.default_agent_loop,
        num_workers=rollout.agent.num_workers,
        multi_turn=rollout.multi_turn,
        agent_loop_config_path=rollout.agent.agent_loop_config_path or None,
        chat_template_kwargs=dict(chat_template_kwargs or {}),
        over_sample_rate=rollout.over_sample_rate,
        trace=rollout.trace if traced else None,
        trace_uri=trace_store(rollout.trace, run_dir) if traced else None,
        rollout=rollout,
        extra={"rollout": to_dict(rollout)},
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
            raise ValueError(
                f"response_mask has {len(self.response_mask)} entries for {len(self.response_ids)} response tokens"
            )
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries for {len(self.response_ids)} response "
                "tokens"
            )


class AgentLoopBase(ABC):
    """One instance per trajectory. ``server_manager.generate`` is the only way to the model.

    Built by the agent loop worker as ``cls(settings, server_manager, tokenizer, tools=[...],
    interactions={...}, **kwargs)``: ``tools`` are the worker's tool objects (``multi_turn.tool_config_path``),
    ``interactions`` its interactions by name (``multi_turn.interaction_config_path``), ``kwargs`` the
    loop's entry in ``rollout.agent.agent_loop_config_path``, if any.
    """

    def __init__(self, settings: AgentLoopSettings, server_manager, tokenizer, tools=None, interactions=None, **kwargs):
        self.settings = settings
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.tool_list = list(tools or [])
        self.interaction_map = dict(interactions or {})
        self.loop_kwargs = kwargs  # from the agent loop config file entry, if any

    @property
    def rollout_config(self):
        """The typed rollout section (veRL loops read ``self.rollout_config.response_length``)."""
        rollout = self.settings.rollout
        return rollout if rollout is not None else rollout_as_in_yaml()  # settings built by hand: the yaml's

    async def apply_chat_template(
        self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of ``messages`` rendered with the tokenizer's chat template (and
        ``data.apply_chat_template_kwargs``): the usual first step of a loop's prompt."""
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.settings.chat_template_kwargs,
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @abstractmethod
    async def run(self, sampling_params: SamplingParams, **sample) -> AgentLoopOutput:
        """Run one trajectory. ``sample`` holds ``prompt_ids``, ``request_id`` and the dataset row's
        non-tensor fields (``raw_prompt``, ``extra_info``, ``tools_kwargs``, ``interaction_kwargs``, ...)."""


AGENT_LOOPS: Registry[type[AgentLoopBase]] = Registry("agent loop")


def check_agent_loop(name: str, key: str, configured=()) -> None:
    """Start-up check: ConfigError naming ``key`` unless ``name`` is a registered agent loop or one of the
    ``configured`` ones (agent.agent_loop_config_path's)."""
    if name not in AGENT_LOOPS and name not in configured:
        raise ConfigError(
            f"{key}={name!r} is not a registered agent loop; known: {', '.join(AGENT_LOOPS.names())} "
            "(or add it to agent.agent_loop_config_path)"
        )


def register(agent_name: str):
    """Class decorator: ``@register("my_agent")`` makes a loop selectable by ``agent_name``."""
    return AGENT_LOOPS.register(agent_name)
