"""``Gsm8kInteraction``: a user who checks the answer and asks for another try when it is wrong
(veRL's demo interaction). The ground truth comes from ``interaction_kwargs.ground_truth``; the
score of a turn is 1.0 for the right ``#### N`` answer (strict), else 0.0. A right answer ends the
conversation; a wrong one gets ``config.hint`` (veRL's sentence by default) as the next user turn."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridflow.interactions.base import BaseInteraction
from hybridflow.rewards.scorers import gsm8k

CORRECT = "Your response is correct!"
DEFAULT_HINT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    def __init__(self, config: dict):
        super().__init__(config)
        self.hint = str(self.config.get("hint", DEFAULT_HINT))
        self._instances: dict[str, dict] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float, dict]:
        content = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._instances[instance_id]["response"] = content
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, self.hint, reward, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(
            state["response"], str(state["ground_truth"]), method="strict", format_score=0.0, score=1.0
        )

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)
