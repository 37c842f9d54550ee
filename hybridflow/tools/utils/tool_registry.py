"""veRL's older import path of the tool registry (``verl.tools.utils.tool_registry``)."""

from hybridflow.tools.tool_registry import get_tool_class, initialize_tools_from_config  # noqa: F401
