"""Tool-call formats of the model families veRL 0.9 parses besides hermes (``rollout.multi_turn.format``):

- ``qwen3_coder`` (Qwen3-Coder, Qwen3.5): ``<tool_call><function=NAME><parameter=KEY>value</parameter>...
  </function></tool_call>``; a value is text, read as its tool schema types it (integer, number, boolean,
  object or array; ``null`` is None);
- ``gpt-oss`` (OpenAI's harmony): ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
  <|call|>``, the recipient also in the role header; the analysis channel is reasoning, never a call;
- ``glm`` (GLM-4.5/4.6): ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>value</arg_value>...</tool_call>``;
- ``seed`` (Seed-OSS): ``<seed:tool_call><function=NAME><parameter=KEY>value</parameter></function>...``;
- ``minimax`` (MiniMax-M2): ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">value</parameter>
  </invoke>...``;
- ``kimi`` (Kimi K2): ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
  <|tool_call_argument_begin|>{...}<|tool_call_end|>...``; the call id is kept;
- ``deepseek_v4`` (DSML markup) and ``gemma4`` (``<|tool_call>call:NAME{...}<tool_call|>``).

GLM, Seed, MiniMax values are JSON where they parse as JSON, else text. The content is the text before the
first call (for gpt-oss: the final channel's message). A call block that yields no call is counted as malformed.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from hybridflow.agent_loop.tool_parser import FunctionCall, ParsedResponse, ToolParser, register_tool_parser

__all__ = [
    "Qwen3CoderToolParser",
    "GptOssToolParser",
    "GLMToolParser",
    "SeedToolParser",
    "MiniMaxToolParser",
    "KimiToolParser",
    "DeepSeekV4ToolParser",
    "Gemma4ToolParser",
]


def json_or_text(raw: str) -> Any:
    value = raw.strip()
    try:
        return json.loads(value)
    except ValueError:
        return value


def _arguments(values: dict) -> str:
    return json.dumps(values, ensure_ascii=False)


def _functions(tools: list[dict] | None) -> dict[str, dict]:
    """{tool name: its parameters' schemas} of OpenAI tool schemas."""
    out = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            out[function["name"]] = dict((function.get("parameters") or {}).get("properties") or {})
    return out


def _before(text: str, marker: str) -> str:
    at = text.find(marker)
    return text if at < 0 else text[:at]


def _token_id(tokenizer, token: str) -> list[int]:
    """``[id]`` of ``token`` where the tokenizer has it as one token, else []."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    return [token_id] if isinstance(token_id, int) and token_id >= 0 and token_id != tokenizer.unk_token_id else []


class _SpecialTokenFormat(ToolParser):
    """A format whose markers are special tokens: decoded with them (padding dropped; an end-of-turn token
    can be one of the format's markers, gpt-oss's ``<|call|>``, so it stays)."""

    keeps_special_tokens = True

    def decode(self, ids: list[int]) -> str:
        text = super().decode(ids)
        pad = self.tokenizer.pad_token
        return text.replace(pad, "") if pad else text

    def parse_ids(self, ids: list[int], tools: list[dict] | None = None) -> ParsedResponse:
        """The calls as parsed; the content without the end-of-turn token (the message a user or tool sees)."""
        parsed = super().parse_ids(ids, tools)
        eos = self.tokenizer.eos_token
        if eos:
            parsed.content = parsed.content.replace(eos, "")
        return parsed


# --------------------------------------------------------------------------- qwen3_coder


def typed_value(raw: str, schema: dict | None) -> Any:
    """A parameter's text as its JSON schema types it; text where it does not convert (or has no schema)."""
    if raw.lower() == "null":
        return None
    kind = str((schema or {}).get("type", "string")).strip().lower()
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return raw
    try:
        if kind.startswith(("int", "uint", "long", "short", "unsigned")):
            return int(raw)
        if kind.startswith(("num", "float")):
            number = float(raw)
            return int(number) if number.is_integer() else number
    except ValueError:
        return raw
    if kind in ("boolean", "bool", "binary"):
        return raw.lower() == "true"
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return ast.literal_eval(raw)  # literals only: the text is the model's
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw


@register_tool_parser("qwen3_coder")
class Qwen3CoderToolParser(ToolParser):
    uses_tools = True
    block = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
    function = re.compile(r"<function=(.*?)(?:</function>|$)", re.DOTALL)
    parameter = re.compile(r"<parameter=(.*?)(?:</parameter>|$)", re.DOTALL)

    def parse(self, text: str, tools: list[dict] | None = None) -> ParsedResponse:
        if "<tool_call>" not in text:
            return ParsedResponse(text)
        schemas, calls, malformed = _functions(tools), [], 0
        for block in self.block.findall(text):
            found = self.function.findall(block)
            malformed += not found
            for function in found:
                name, sep, body = function.partition(">")
                if not sep or not name.strip():
                    malformed += 1
                    continue
                name = name.strip()
                values = {}
                for parameter in self.parameter.findall(body):
                    key, sep, value = parameter.partition(">")
                    if not sep:
                        continue
                    value = value[1:] if value.startswith("\n") else value
                    value = value[:-1] if value.endswith("\n") else value
                    values[key.strip()] = typed_value(value, schemas.get(name, {}).get(key.strip()))
                calls.append(FunctionCall(name=name, arguments=_arguments(values)))
        return ParsedResponse(_before(text, "<tool_call>"), calls, malformed)


# --------------------------------------------------------------------------- gpt-oss


@register_tool_parser("gpt-oss")
class GptOssToolParser(_SpecialTokenFormat):
    # one harmony message: an optional role header, its channel header (a recipient may sit in either), the body
    message = re.compile(
        r"(?:<\|start\|>assistant([^<]*))?<\|channel\|>([^<]*)(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)"
        r"(<\|call\|>|<\|end\|>|<\|return\|>|$)",
        re.DOTALL,
    )
    recipient = re.compile(r"to=functions\.([^\s<]+)")

    def parse(self, text: str) -> ParsedResponse:
        calls, malformed, final, found = [], 0, None, False
        for role_header, channel_header, body, _ in self.message.findall(text):
            found = True
            target = self.recipient.search(role_header + " " + channel_header)
            channel = channel_header.split()[0] if channel_header.split() else ""
            if target is None:
                if channel == "final":
                    final = body
                continue
            try:
                arguments = json.loads(body)
                if not isinstance(arguments, dict):
                    raise TypeError("the arguments are not a JSON object")
            except (ValueError, TypeError):
                malformed += 1
                continue
            calls.append(FunctionCall(name=target.group(1), arguments=_arguments(arguments)))
        if not found:
            return ParsedResponse(text)
        return ParsedResponse(final if final is not None else "", calls, malformed)


# --------------------------------------------------------------------------- glm, seed, minimax


@register_tool_parser("glm")
class GLMToolParser(_SpecialTokenFormat):
    block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    pair = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)

    @property
    def stop_token_ids(self) -> list[int]:
        return _token_id(self.tokenizer, "<|observation|>")  # GLM hands the turn to the tool there

    def parse(self, text: str) -> ParsedResponse:
        if "<tool_call>" not in text or "</tool_call>" not in text:
            return ParsedResponse(text)
        calls, malformed = [], 0
        for block in self.block.findall(text):
            name = _before(block, "<arg_key>").strip()
            if not name:
                malformed += 1
                continue
            values = {k.strip(): json_or_text(v) for k, v in self.pair.findall(block)}
            calls.append(FunctionCall(name=name, arguments=_arguments(values)))
        content = re.sub(r"^\s*(?:<think>.*?)?</think>", "", _before(text, "<tool_call>"), flags=re.DOTALL)
        return ParsedResponse(content, calls, malformed)


class _TaggedCallsFormat(_SpecialTokenFormat):
    """Calls inside ``opening ... closing`` blocks, each an ``element`` (its name, its body) holding ``parameter``
    pairs (key, value); a value is JSON where it parses, else text. A block without an element is malformed."""

    opening = closing = ""
    block = element = parameter = re.compile("")

    def values_of(self, body: str) -> dict:
        return {key.strip(): json_or_text(value) for key, value in self.parameter.findall(body)}

    def parse(self, text: str) -> ParsedResponse:
        if self.opening not in text or self.closing not in text:
            return ParsedResponse(text)
        calls, malformed = [], 0
        for block in self.block.findall(text):
            found = self.element.findall(block)
            malformed += not found
            for name, body in found:
                calls.append(FunctionCall(name=name.strip(), arguments=_arguments(self.values_of(body))))
        return ParsedResponse(_before(text, self.opening), calls, malformed)


@register_tool_parser("seed")
class SeedToolParser(_TaggedCallsFormat):
    opening, closing = "<seed:tool_call>", "</seed:tool_call>"
    block = re.compile(r"<seed:tool_call>(.*?)</seed:tool_call>", re.DOTALL)
    element = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
    parameter = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@register_tool_parser("minimax")
class MiniMaxToolParser(_TaggedCallsFormat):
    opening, closing = "<minimax:tool_call>", "</minimax:tool_call>"
    block = re.compile(r"<minimax:tool_call>(.*?)</minimax:tool_call>", re.DOTALL)
    element = re.compile(r'<invoke name="([^"]+)">(.*?)</invoke>', re.DOTALL)
    parameter = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


# --------------------------------------------------------------------------- kimi


def kimi_tool_name(call_id: str, arguments: dict, tools: list[dict] | None) -> str:
    """The tool a Kimi call id (``functions.NAME:INDEX``) names; with the tools known, a name that is none of
    them resolves to the one tool whose name it contains, or else the one whose required arguments it has."""
    name = call_id.strip()
    name = name[len("functions.") :] if name.startswith("functions.") else name
    name = name.rsplit(":", 1)[0] if ":" in name and name.rsplit(":", 1)[1].isdigit() else name
    known = _functions(tools)
    if not known or name in known:
        return name
    compact = name.lower().replace("-", "_")
    contained = [n for n in known if n.lower() in compact]
    if len(contained) == 1:
        return contained[0]
    required = [
        t["function"]["name"]
        for t in tools or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") in known
        and set((t["function"].get("parameters") or {}).get("required") or ()) <= set(arguments)
        and (t["function"].get("parameters") or {}).get("required")
    ]  # fmt: skip
    return required[0] if len(required) == 1 else name


@register_tool_parser("kimi")
class KimiToolParser(_SpecialTokenFormat):
    uses_tools = True
    section = "<|tool_calls_section_begin|>"
    call = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL)

    @property
    def stop_token_ids(self) -> list[int]:
        return _token_id(self.tokenizer, "<|im_end|>")

    def parse(self, text: str, tools: list[dict] | None = None) -> ParsedResponse:
        if self.section not in text:
            return ParsedResponse(text)
        calls, malformed = [], 0
        for call_id, raw in self.call.findall(text):
            try:
                arguments = json.loads(raw.strip())
                if not isinstance(arguments, dict):
                    raise TypeError("the arguments are not a JSON object")
            except (ValueError, TypeError):
                malformed += 1
                continue
            name = kimi_tool_name(call_id, arguments, tools)
            calls.append(FunctionCall(name=name, arguments=_arguments(arguments), tool_call_id=call_id.strip()))
        return ParsedResponse(_before(text, self.section), calls, malformed)


# --------------------------------------------------------------------------- deepseek_v4, gemma4

_DSML = "｜DSML｜"  # DeepSeek-V4's markup token (full-width bars)


@register_tool_parser("deepseek_v4")
class DeepSeekV4ToolParser(_TaggedCallsFormat):
    """``<｜DSML｜tool_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="KEY" string="true|false">value
    </｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>``: ``string="true"`` is text, ``false`` JSON. The
    content is what follows the reasoning (after ``</think>``), without the blank line before the calls."""

    opening, closing = f"<{_DSML}tool_calls>", f"</{_DSML}tool_calls>"
    block = re.compile(rf"<{_DSML}tool_calls>(.*?)</{_DSML}tool_calls>", re.DOTALL)
    element = re.compile(rf'<{_DSML}invoke name="(.*?)">(.*?)</{_DSML}invoke>', re.DOTALL)
    parameter = re.compile(rf'<{_DSML}parameter name="(.*?)" string="(true|false)">(.*?)</{_DSML}parameter>', re.DOTALL)

    def decode(self, ids: list[int]) -> str:
        return super().decode(ids).replace("<｜end▁of▁sentence｜>", "")

    def values_of(self, body: str) -> dict:
        return {
            key: value if is_text == "true" else json_or_text(value)
            for key, is_text, value in self.parameter.findall(body)
        }

    def parse(self, text: str) -> ParsedResponse:
        parsed = super().parse(text)
        content = _before(parsed.content, self.opening).rpartition("</think>")[2]
        parsed.content = content.removesuffix("\n\n") if parsed.calls or parsed.malformed else content
        return parsed


def gemma_value(raw: str) -> Any:
    """A bare Gemma 4 argument: true, false, null, an integer or a number, else the text."""
    value = raw.strip()
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


@register_tool_parser("gemma4")
class Gemma4ToolParser(_SpecialTokenFormat):
    """``<|tool_call>call:NAME{key:<|"|>text<|"|>,count:3}<tool_call|>``; Gemma 4 goes on after a call, so
    ``<tool_call|>`` also ends the generation."""

    call = re.compile(r"<\|tool_call>call:(\w+)\{(.*?)\}<tool_call\|>", re.DOTALL)
    argument = re.compile(r'(\w+):(?:<\|"\|>(.*?)<\|"\|>|([^,}]*))', re.DOTALL)

    @property
    def stop_token_ids(self) -> list[int]:
        return _token_id(self.tokenizer, "<tool_call|>")

    def parse(self, text: str) -> ParsedResponse:
        if "<|tool_call>" not in text:
            return ParsedResponse(text)
        calls = []
        for name, body in self.call.findall(text):
            values = {
                key: text_value if text_value or bare == "" else gemma_value(bare)
                for key, text_value, bare in self.argument.findall(body)
            }
            calls.append(FunctionCall(name=name, arguments=_arguments(values)))
        malformed = text.count("<|tool_call>") - len(calls)
        return ParsedResponse(_before(text, "<|tool_call>"), calls, max(malformed, 0))
