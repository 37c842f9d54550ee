"""The model families' tool-call formats (rollout.multi_turn.format, veRL 0.9's parser names): each response
below is written out as the model family writes a call (its chat template's own tool-call rendering), and the
expected calls are read off it by hand. A qwen3_coder call also drives a tool_agent trajectory end to end."""

from __future__ import annotations

import json

import pytest

from hybridflow.agent_loop.tool_formats import json_or_text, kimi_tool_name, typed_value
from hybridflow.agent_loop.tool_parser import TOOL_PARSERS, check_tool_parser
from hybridflow.config.errors import ConfigError
from hybridflow.models.tiny import build_tiny_tokenizer
from tests.agent_loop.chat_helpers import EOS, TOK, ids, response_of, run
from tests.agent_loop.test_tool_agent import QUESTION, worker_for

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "threshold": {"type": "number"},
                "hours": {"type": "array"},
                "code": {"type": "string"},
            },
            "required": ["city"],
        },
    },
}


def parse(name: str, text: str, tools=None):
    parser = TOOL_PARSERS[name](TOK)
    return parser.parse(text, tools) if parser.uses_tools else parser.parse(text)


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def test_every_veRL_format_name_is_registered():
    for name in ("hermes", "qwen3_coder", "gpt-oss", "glm", "seed", "minimax", "kimi", "deepseek_v4", "gemma4"):
        check_tool_parser(name, "actor_rollout_ref.rollout.multi_turn.format")
    with pytest.raises(ConfigError, match="multi_turn.format='llama3_json' is not a registered tool-call format"):
        check_tool_parser("llama3_json", "actor_rollout_ref.rollout.multi_turn.format")


def test_qwen3_coder_types_each_parameter_by_the_tool_schema():
    text = (
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
        "<parameter=threshold>\n2.5\n</parameter>\n<parameter=hours>\n[6, 18]\n</parameter>\n"
        "<parameter=code>\n007\n</parameter>\n<parameter=extra>\nnull\n</parameter>\n</function>\n</tool_call>"
        "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    )
    parsed = parse("qwen3_coder", text, [WEATHER])
    assert parsed.content == "Let me check.\n" and parsed.malformed == 0
    assert calls_of(parsed) == [
        (
            "get_weather",
            {
                "city": "New York",
                "days": 3,
                "metric": True,
                "threshold": 2.5,
                "hours": [6, 18],
                "code": "007",  # a string stays a string
                "extra": None,
            },
        ),
        ("get_weather", {"city": "Paris"}),
    ]
    # without the schema every value is text; a truncated call still yields what was written; no call: as is
    assert calls_of(parse("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=n>\n3", None)) == [("f", {"n": "3"})]
    assert parse("qwen3_coder", "no call here", [WEATHER]).calls == []
    assert parse("qwen3_coder", "<tool_call>nothing</tool_call>", [WEATHER]).malformed == 1


def test_typed_values_by_hand():
    assert typed_value("12", {"type": "integer"}) == 12 and typed_value("x12", {"type": "integer"}) == "x12"
    assert typed_value("4.0", {"type": "number"}) == 4 and typed_value("0.25", {"type": "number"}) == 0.25
    assert typed_value("false", {"type": "boolean"}) is False and typed_value("NULL", {"type": "string"}) is None
    assert typed_value("{'a': 1}", {"type": "object"}) == {"a": 1}  # a Python literal, never code
    assert typed_value("__import__('os')", {"type": "object"}) == "__import__('os')"
    assert json_or_text(' {"a": [1]} ') == {"a": [1]} and json_or_text(" plain ") == "plain"


def test_gpt_oss_harmony_calls_ignore_the_analysis_channel():
    text = (
        "<|channel|>analysis<|message|>The user wants weather; to=functions.fake is only thought.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Oslo"}<|call|>'
    )
    parsed = parse("gpt-oss", text)
    assert calls_of(parsed) == [("get_weather", {"city": "Oslo"})] and parsed.malformed == 0
    # the recipient in the role header; the first message without <|start|>assistant (the prompt ends with it)
    header = '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": 1}<|call|>'
    assert calls_of(parse("gpt-oss", header)) == [("lookup", {"q": 1})]
    first = '<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"q": 2}<|call|>'
    assert calls_of(parse("gpt-oss", first)) == [("lookup", {"q": 2})]
    final = "<|channel|>analysis<|message|>easy<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>"
    assert parse("gpt-oss", final).content == "It is 4." and parse("gpt-oss", final).calls == []
    bad = "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{not json<|call|>"
    assert parse("gpt-oss", bad).malformed == 1


def test_glm_seed_and_minimax_xml_calls():
    glm = (
        "<think>need data</think>Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Rome</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    )
    parsed = parse("glm", glm)
    assert calls_of(parsed) == [("get_weather", {"city": "Rome", "days": 2})] and parsed.content == "Checking."
    seed = (
        "ok<seed:tool_call>\n<function=get_weather>\n<parameter=city>Lima</parameter>\n"
        "<parameter=hours>[1, 2]</parameter>\n</function>\n</seed:tool_call>"
    )
    assert calls_of(parse("seed", seed)) == [("get_weather", {"city": "Lima", "hours": [1, 2]})]
    assert parse("seed", seed).content == "ok"
    minimax = (
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Kyiv</parameter>\n</invoke>\n'
        '<invoke name="get_time">\n<parameter name="zone">"UTC"</parameter>\n</invoke>\n</minimax:tool_call>'
    )
    assert calls_of(parse("minimax", minimax)) == [("get_weather", {"city": "Kyiv"}), ("get_time", {"zone": "UTC"})]


def test_kimi_calls_keep_their_ids_and_names_resolve_against_the_tools():
    text = (
        "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Lagos"}<|tool_call_end|><|tool_call_begin|>functions.weather-lookup:1'
        '<|tool_call_argument_begin|>{"city": "Accra"}<|tool_call_end|><|tool_calls_section_end|>'
    )
    parsed = parse("kimi", text, [WEATHER])
    assert parsed.content == "Sure."
    assert calls_of(parsed) == [("get_weather", {"city": "Lagos"}), ("get_weather", {"city": "Accra"})]
    assert [c.tool_call_id for c in parsed.calls] == ["functions.get_weather:0", "functions.weather-lookup:1"]
    assert kimi_tool_name("functions.search:3", {}, None) == "search"  # no tools known: the id's name


def test_formats_with_special_token_markers_decode_them_and_stop_on_their_tokens():
    tok = build_tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|observation|>", "<tool_call>", "</tool_call>"]})
    glm = TOOL_PARSERS["glm"](tok)
    assert glm.stop_token_ids == [tok.convert_tokens_to_ids("<|observation|>")]
    ids_ = tok("<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", add_special_tokens=False)
    assert calls_of(glm.parse_ids(ids_["input_ids"])) == [("f", {"a": 1})]
    assert TOOL_PARSERS["kimi"](TOK).stop_token_ids == [TOK.convert_tokens_to_ids("<|im_end|>")]
    assert TOOL_PARSERS["seed"](TOK).stop_token_ids == []


def test_tool_agent_calls_the_tool_a_qwen3_coder_response_names(tmp_path):
    call = "<tool_call>\n<function=calc>\n<parameter=expr>\n347*82\n</parameter>\n</function>\n</tool_call>"
    worker, server = worker_for(tmp_path, [call, "#### 28454"], format="qwen3_coder")
    out = run(worker, [{"messages": QUESTION}])
    resp, mask = response_of(out)
    turn1 = ids(call) + [EOS]
    tool = ids("\n<|im_start|>user\n<tool_response>\n28454\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert resp == turn1 + tool + ids("#### 28454") + [EOS]  # the calculator ran on the parsed argument
    assert mask == [1] * len(turn1) + [0] * len(tool) + [1] * (len(resp) - len(turn1) - len(tool))
    assert out.meta_info["metrics"]["agent/tool_calls"] == [1.0]


def test_deepseek_v4_dsml_and_gemma4_calls():
    d = "｜DSML｜"
    text = (
        f'plan</think>I will look it up.\n\n<{d}tool_calls>\n<{d}invoke name="get_weather">\n'
        f'<{d}parameter name="city" string="true">2024</{d}parameter>\n'
        f'<{d}parameter name="days" string="false">5</{d}parameter>\n</{d}invoke>\n</{d}tool_calls>'
    )
    parsed = parse("deepseek_v4", text)
    assert parsed.content == "I will look it up."  # reasoning and the blank line before the calls dropped
    assert calls_of(parsed) == [("get_weather", {"city": "2024", "days": 5})]  # string="true" keeps text
    assert parse("deepseek_v4", "thinking</think>Hello").content == "Hello"
    gemma = '<|tool_call>call:get_weather{city:<|"|>São Paulo, BR<|"|>,days:3,metric:true,ratio:0.5}<tool_call|>'
    assert calls_of(parse("gemma4", "Checking. " + gemma)) == [
        ("get_weather", {"city": "São Paulo, BR", "days": 3, "metric": True, "ratio": 0.5})
    ]
    assert parse("gemma4", "Checking. " + gemma).content == "Checking. "


def test_the_content_of_a_special_token_format_has_no_end_of_turn_token():
    kimi = TOOL_PARSERS["kimi"](TOK)
    parsed = kimi.parse_ids(ids("The answer is 4.") + [EOS])
    assert parsed.content == "The answer is 4." and parsed.calls == []
