"""``CodeInterpreterTool``: runs the model's Python code in hybridflow's local sandbox
(``hybridflow.rewards.sandbox``: separate limited process, namespaces where the machine
allows, rlimits, wall-clock kill) and returns what it printed.

config: ``default_timeout`` (s, 10), ``memory_limit_mb`` (1024), ``num_workers`` (sandbox runs at
once per agent loop worker, 4), ``default_language`` (only ``python``). A call may pass ``timeout``
(capped at ``default_timeout``). A run that fails (exception, timeout, memory) returns its stderr and
reason to the model as text; it is the model's code that failed, not the tool.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hybridflow.rewards.sandbox import ExecResult, Limits, run_python
from hybridflow.tools.base_tool import BaseTool
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema, ToolResponse


class CodeInterpreterTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.default_timeout = float(self.config.get("default_timeout", 10))
        self.memory_limit_mb = int(self.config.get("memory_limit_mb", 1024))
        language = str(self.config.get("default_language", "python"))
        if language != "python":
            raise ValueError(
                f"{type(self).__name__}: default_language={language!r}: only python runs in the local sandbox"
            )
        self._slots = asyncio.Semaphore(max(1, int(self.config.get("num_workers", 4))))

    def run_code(self, code: str, limits: Limits) -> ExecResult:
        """One run of the model's code (a blocking call, made off the event loop)."""
        return run_python(code, limits=limits)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ValueError("missing argument 'code'")
        language = parameters.get("language", "python")
        if language != "python":
            raise ValueError(f"language {language!r} is not supported; only python")
        timeout = min(float(parameters.get("timeout", self.default_timeout)), self.default_timeout)
        limits = Limits(timeout_s=timeout, memory_mb=self.memory_limit_mb)
        async with self._slots:
            result = await asyncio.get_running_loop().run_in_executor(None, lambda: self.run_code(code, limits))
        if result.reason == "ok" and result.returncode == 0:
            return ToolResponse(text=result.stdout), 0.0, {"reason": "ok", "wall_s": result.wall_s}
        text = (result.stdout + result.stderr).strip()
        return (
            ToolResponse(text=f"{text}\n[{result.reason}]".strip()),
            0.0,
            {"reason": result.reason, "wall_s": result.wall_s},
        )
