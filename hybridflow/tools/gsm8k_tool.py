"""``Gsm8kTool``: the model submits an answer, the tool scores it against the sample's ground truth
(veRL's demo tool, same name and schema). The ground truth arrives per trajectory through
``extra_info.tools_kwargs.<tool name>.create_kwargs.ground_truth``. Each call returns the parsed answer
and its score; the step reward is 0 for an improvement and -0.05 for a submission that did not
improve on the previous one (discouraging repeated guesses)."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridflow.rewards.scorers import gsm8k
from hybridflow.tools.base_tool import BaseTool
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema, ToolResponse

NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict] = {}

    async def create(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs
    ) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid4())
        if ground_truth is None:
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        state = self._instances[instance_id]
        answer = str(parameters.get("answer", ""))
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward}"), step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return gsm8k.compute_score(
            state["response"], str(state["ground_truth"]), method="flexible", format_score=0.0, score=1.0
        )

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)
