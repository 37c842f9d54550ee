"""``BaseInteraction``: a simulated user in a multi-turn rollout (veRL's ``verl.interactions.base``).

The ``tool_agent`` loop asks the interaction for the user's next turn whenever the model ends a turn
without a tool call. Per trajectory (``instance_id`` = the trajectory's request id):

1. ``start_interaction(instance_id, **interaction_kwargs)``: ``interaction_kwargs`` is the sample's
   ``extra_info.interaction_kwargs`` (its ``name`` picks the interaction; the rest, e.g. a ground truth,
   is the interaction's business);
2. ``generate_response(instance_id, messages, **interaction_kwargs)`` -> (should_terminate_sequence,
   response_content, current_turn_score, additional_data): the user's reply is appended as a user turn
   (tokens with mask 0) unless the sequence terminates; the score becomes one of the trajectory's
   ``turn_scores``;
3. ``finalize_interaction(instance_id)`` when the trajectory ends, however it ends.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4


class BaseInteraction:
    def __init__(self, config: dict[str, Any]):
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id or str(uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float, dict[str, Any]]:
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, *args, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, *args, **kwargs) -> None:
        pass
