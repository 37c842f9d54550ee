"""veRL 0.9's reward-loop manager interface, so a veRL user's manager class runs here unchanged but for imports.

veRL 0.9 scores through ``RewardManagerBase`` subclasses: built as ``cls(config=, tokenizer=, compute_score=, ...)``
and asked ``await manager.run_single(row)`` for each sample (a one-row ``DataProto``), which returns
``{"reward_score": float, "reward_extra_info": {...}}``. ``RewardManagerBase`` here is that interface;
``LoopRewardManager`` drives such a class in hybridflow's manager interface: a batch's rows are awaited together
(each under ``reward.score_timeout_s``), the score lands on the row's last valid response token as with every
other manager, and the extra info becomes the batch's extra columns. A class registered by name
(``@register_reward_manager``) or loaded from a file (``reward.reward_manager.source=importlib``) is wrapped
when it is a ``RewardManagerBase``.

A veRL file imports ``from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase`` and
``from verl import DataProto``; here those are ``hybridflow.rewards.loop_manager`` and ``hybridflow.protocol``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any

import torch

from hybridflow.rewards.bad_samples import ScorerTimeoutError
from hybridflow.rewards.rule_manager import RuleRewardManager

__all__ = ["RewardManagerBase", "LoopRewardManager", "is_loop_manager"]

# what veRL's reward loop passes besides config, tokenizer and compute_score (hybridflow serves no reward router)
_LOOP_KWARGS = {"reward_router_address": None, "reward_model_tokenizer": None}


class _RunningLoop:
    """A manager's ``self.loop``: the event loop its ``run_single`` runs on (veRL's managers call
    ``self.loop.run_in_executor``); resolved at each use, as a manager is built outside any loop."""

    def __getattr__(self, name: str):
        return getattr(asyncio.get_running_loop(), name)


class RewardManagerBase(ABC):
    """veRL 0.9's reward-loop manager: ``run_single(data)`` scores one sample (a one-row DataProto)."""

    _class_initialized = False

    def __init__(self, config, tokenizer, compute_score: Callable[..., Any] | None):
        self.config = config
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.loop = _RunningLoop()
        self.init_class(config, tokenizer)

    @classmethod
    def init_class(cls, config, tokenizer) -> None:
        """State shared by every instance of the class, set up once."""
        if cls._class_initialized:
            return
        cls._class_initialized = True

    @abstractmethod
    async def run_single(self, data) -> dict:
        """``{"reward_score": float, "reward_extra_info": dict}`` for the one sample in ``data``."""

    @classmethod
    def assemble_rm_scores(cls, data, scores: list[float]) -> torch.Tensor:
        """(B, R) float32 with each row's score on its last valid response token, zeros elsewhere."""
        prompt_length = data.batch["prompts"].size(1)
        lengths = data.batch["attention_mask"][:, prompt_length:].sum(dim=1)
        out = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        out[torch.arange(out.size(0), device=out.device), (lengths - 1).clamp(min=0)] = out.new_tensor(scores)
        return out


def is_loop_manager(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, RewardManagerBase)


def _run(coroutine: Coroutine) -> Any:
    """Run ``coroutine`` to its end from synchronous code, also where this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="hybridflow-reward-loop")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class LoopRewardManager(RuleRewardManager):
    """A ``RewardManagerBase`` class in hybridflow's manager interface (see the module docstring)."""

    streams = True  # each row is scored alone: with reward.num_workers, as each trajectory finishes

    def __init__(
        self,
        manager_cls: type,
        tokenizer,
        num_examine: int,
        compute_score: Callable | None = None,
        config=None,
        **settings,
    ):
        # settings: RuleRewardManager's (reward_fn_key, bad_sample_score, score_timeout_s) and reward.reward_kwargs,
        # which the class reads in config.reward.reward_kwargs as veRL's managers do
        super().__init__(tokenizer, num_examine, compute_score, **settings)
        accepted = inspect.signature(manager_cls.__init__).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        extra = {k: v for k, v in _LOOP_KWARGS.items() if takes_any or k in accepted}
        self.inner = manager_cls(config=config, tokenizer=tokenizer, compute_score=self.compute_score, **extra)
        self.name = manager_cls.__name__

    def _score_rows(self, data, todo, data_sources, solution_strs, ground_truths, extra_infos) -> list:
        rows = [_verl_row(data[i : i + 1]) for i in todo]
        return _run(self._score_all(rows))

    async def _score_all(self, rows) -> list:
        results = await asyncio.gather(*(self._score_one(row) for row in rows), return_exceptions=True)
        out = []
        for position, result in enumerate(results):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                out.append(self._scorer_failed(position, result))
            else:
                out.append(result)
        return out

    async def _score_one(self, row) -> dict:
        call = self.inner.run_single(row)
        try:
            result = await (call if self.score_timeout_s is None else asyncio.wait_for(call, self.score_timeout_s))
        except TimeoutError:
            raise ScorerTimeoutError(
                f"{self.name}.run_single did not return within reward.score_timeout_s={self.score_timeout_s:g} s"
            ) from None
        if not isinstance(result, dict) or "reward_score" not in result:
            raise ValueError(f"{self.name}.run_single returned {result!r}, not a dict with 'reward_score'")
        return {"score": result["reward_score"], **dict(result.get("reward_extra_info") or {})}


def _verl_row(row):
    """A one-row DataProto as veRL's reward loop hands it over: the number of turns also as ``__num_turns__``."""
    turns = row.non_tensor_batch.get("num_turns")
    if turns is not None and "__num_turns__" not in row.non_tensor_batch:
        row.non_tensor_batch["__num_turns__"] = turns
    return row
