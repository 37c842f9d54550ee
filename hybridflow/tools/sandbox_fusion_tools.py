"""veRL's ``verl.tools.sandbox_fusion_tools.SandboxFusionTool`` name: the code tool, run in a SandboxFusion
service when its config names one.

With ``sandbox_fusion_url`` the model's code runs in that service (``hybridflow.rewards.sandbox_fusion``;
``rate_limit``: requests in flight at once, per process); without it, in hybridflow's local sandbox (see
``code_tool``). ``default_timeout``, ``memory_limit_mb``, ``default_language`` (python) and ``num_workers``
mean what they mean there. ``enable_global_rate_limit`` (veRL's Ray-wide token bucket) is not implemented: the
limit holds per process, and a warning says so once per tool.
"""

from __future__ import annotations

import logging

from hybridflow.rewards.sandbox import ExecResult, Limits
from hybridflow.rewards.sandbox_fusion import run_remote, shared_semaphore
from hybridflow.tools.code_tool import CodeInterpreterTool
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema

logger = logging.getLogger(__name__)


class SandboxFusionTool(CodeInterpreterTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        self.url = self.config.get("sandbox_fusion_url") or None
        if self.url is not None and not str(self.url).startswith(("http://", "https://")):
            raise ValueError(f"SandboxFusionTool {self.name!r}: sandbox_fusion_url={self.url!r} is not an http(s) URL")
        self.rate_limit = int(self.config.get("rate_limit", 10))
        if self.url and self.config.get("enable_global_rate_limit", True):
            logger.warning(
                "SandboxFusionTool %r: rate_limit=%d holds per process (veRL's Ray-wide limit, "
                "enable_global_rate_limit, is not implemented)",
                self.name,
                self.rate_limit,
            )

    def run_code(self, code: str, limits: Limits) -> ExecResult:
        if self.url is None:
            return super().run_code(code, limits)
        return run_remote(self.url, code, limits=limits, semaphore=shared_semaphore(self.url, self.rate_limit))
