"""Tool-call parsers: the model's response tokens -> (text without the calls, function calls).

``rollout.multi_turn.format`` picks one by name from ``TOOL_PARSERS``; ``hermes`` (Qwen2.5 / NousHermes:
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``) is here, the other model families'
formats of veRL 0.9 (qwen3_coder, gpt-oss, glm, seed, minimax, kimi, deepseek_v4, gemma4) in ``tool_formats``.
Another format plugs in with ``@register_tool_parser("name")`` on a ``ToolParser`` subclass (veRL's
``ToolParser.register`` works too). A call that cannot be decoded is not a call: it stays out of the list and is
counted in ``malformed`` so the loop can report it.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from hybridflow.config.errors import ConfigError
from hybridflow.utils.registry import Registry

logger = logging.getLogger(__name__)


@dataclass
class FunctionCall:
    """One parsed call: ``arguments`` is the JSON text of the arguments (as OpenAI's API gives it)."""

    name: str
    arguments: str
    tool_call_id: str | None = None


@dataclass
class ParsedResponse:
    content: str
    calls: list[FunctionCall] = field(default_factory=list)
    malformed: int = 0  # call blocks found but not decodable

    def __iter__(self):  # veRL's parsers return (content, calls)
        return iter((self.content, self.calls))


class ToolParser:
    """Base class. ``parse(text)`` does the work (``parse(text, tools)`` where ``uses_tools``: the arguments are
    typed by the tools' OpenAI schemas); ``parse_ids(ids, tools)`` is what the agent loops call;
    ``extract_tool_calls(ids, tools)`` is veRL's async entry. ``keeps_special_tokens``: the format's markers
    are special tokens, so the text is decoded with them."""

    keeps_special_tokens = False
    uses_tools = False

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        """Extra token ids that end a generation so the parser can run (none: the model's EOS does)."""
        return []

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=not self.keeps_special_tokens)

    def parse(self, text: str) -> ParsedResponse:
        raise NotImplementedError

    def parse_ids(self, ids: list[int], tools: list[dict] | None = None) -> ParsedResponse:
        text = self.decode(ids)
        return self.parse(text, list(tools or [])) if self.uses_tools else self.parse(text)

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> ParsedResponse:
        return self.parse_ids(responses_ids, tools)

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer) -> ToolParser:
        return TOOL_PARSERS[name](tokenizer)

    @classmethod
    def register(cls, name: str):
        return register_tool_parser(name)


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("tool-call format (rollout.multi_turn.format)")


def check_tool_parser(name: str, key: str) -> None:
    """Start-up check: ConfigError naming ``key`` unless ``name`` is a registered tool-call format."""
    if name not in TOOL_PARSERS:
        raise ConfigError(
            f"{key}={name!r} is not a registered tool-call format; known: {', '.join(TOOL_PARSERS.names())} "
            "(a parser of yours registers with hybridflow.agent_loop.tool_parser.register_tool_parser)"
        )


def register_tool_parser(name: str):
    return TOOL_PARSERS.register(name)


@register_tool_parser("hermes")
class HermesToolParser(ToolParser):
    """Calls are JSON objects ``{"name": str, "arguments": object}`` between <tool_call> and </tool_call>."""

    start, end = "<tool_call>", "</tool_call>"
    pattern = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedResponse:
        if self.start not in text or self.end not in text:
            return ParsedResponse(text)
        calls, malformed = [], 0
        for block in self.pattern.findall(text):
            try:
                call = json.loads(block)
                name, arguments = call["name"], call["arguments"]
                if not isinstance(name, str):
                    raise TypeError("name is not a string")
            except (ValueError, KeyError, TypeError) as e:
                malformed += 1
                logger.debug("undecodable tool call %r: %s", block, e)
                continue
            calls.append(FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
        return ParsedResponse(self.pattern.sub("", text), calls, malformed)
