"""veRL's ``verl.tools.sandbox_fusion_tools.SandboxFusionTool`` name, served by the local sandbox.

veRL sends the code to a SandboxFusion HTTP service; hybridflow runs it in its own local sandbox (see
``code_tool``). The veRL config keys are accepted: ``default_timeout``, ``memory_limit_mb``,
``default_language`` and ``num_workers`` mean the same; ``sandbox_fusion_url``, ``rate_limit`` and
``enable_global_rate_limit`` configure the remote service and are reported as not used (one warning per
tool), never silently dropped.
"""

from __future__ import annotations

import logging

from hybridflow.tools.code_tool import CodeInterpreterTool
from hybridflow.utils.tool_schemas import OpenAIFunctionToolSchema

logger = logging.getLogger(__name__)
REMOTE_ONLY_KEYS = ("sandbox_fusion_url", "rate_limit", "enable_global_rate_limit")


class SandboxFusionTool(CodeInterpreterTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema)
        unused = [k for k in REMOTE_ONLY_KEYS if self.config.get(k) not in (None, "")]
        if unused:
            logger.warning(
                "SandboxFusionTool %r: %s configure veRL's remote SandboxFusion service and are not used; "
                "hybridflow runs the code in its local sandbox",
                self.name,
                ", ".join(unused),
            )
