"""Tools, interactions and agent loops from veRL-format files: class names as veRL writes them, file
paths, refusals with reasons; the calculator, the code tool, the hermes parser and truncation."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from hybridflow.agent_loop import AGENT_LOOPS, AgentLoopBase, AgentLoopWorker
from hybridflow.agent_loop.loop_config import load_agent_loop_config
from hybridflow.agent_loop.tool_calls import truncate_text
from hybridflow.agent_loop.tool_parser import TOOL_PARSERS, ToolParser, register_tool_parser
from hybridflow.interactions.base import BaseInteraction
from hybridflow.interactions.gsm8k_interaction import Gsm8kInteraction
from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config
from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.calculator_tool import CalculatorTool, evaluate, format_number
from hybridflow.tools.gsm8k_tool import Gsm8kTool
from hybridflow.utils.import_utils import load_class
from hybridflow.utils.tool_config import check_tool_config, initialize_tools_from_config
from tests.agent_loop.chat_helpers import CALC_SCHEMA, TOK, ScriptedChat, calc_entry, settings, write_tools_yaml

VERL_GSM8K_TOOL = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k."
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""


def test_verl_tool_yaml_loads_with_verl_class_names(tmp_path):
    path = tmp_path / "gsm8k_tool_config.yaml"
    path.write_text(VERL_GSM8K_TOOL)
    (tool,) = initialize_tools_from_config(str(path))
    assert isinstance(tool, Gsm8kTool) and tool.name == "calc_gsm8k_reward"
    assert tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)["function"]["parameters"]["required"] == [
        "answer"
    ]
    assert check_tool_config(str(path)) == ["calc_gsm8k_reward"]
    from hybridflow.tools.base_tool import BaseTool as Base  # veRL's import path: hybridflow.tools.base_tool.BaseTool

    assert isinstance(tool, Base) and load_class("verl.tools.base_tool.BaseTool") is BaseTool


def test_tool_classes_from_files_and_refusals(tmp_path):
    module = tmp_path / "my_tools.py"
    module.write_text(
        textwrap.dedent("""
        from hybridflow.tools.base_tool import BaseTool
        from hybridflow.tools.schemas import ToolResponse

        class Echo(BaseTool):
            async def execute(self, instance_id, parameters, **kwargs):
                return ToolResponse(text=parameters["text"] * self.config["times"]), 0.0, {}
    """)
    )
    schema = {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "d",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }
    # relative file path: resolved against the yaml's folder
    path = write_tools_yaml(
        str(tmp_path / "tools.yaml"),
        [{"class_name": "my_tools.py:Echo", "config": {"type": "native", "times": 2}, "tool_schema": schema}],
    )
    (echo,) = initialize_tools_from_config(path)
    assert asyncio.run(echo.execute("i", {"text": "ab"}))[0].text == "abab"

    refusals = {
        "verl.tools.mcp_search_tool.MCPSearchTool": ("mcp", "MCP tools are not supported"),
        "verl.tools.image_zoom_in_tool.ImageZoomInTool": ("native", "image tools are not supported"),
        "verl.tools.geo3k_tool.Geo3kTool": ("native", "image inputs are not supported"),
        "verl.tools.search_tool.SearchTool": ("native", "retrieval server"),
    }
    for class_name, (kind, reason) in refusals.items():
        bad = write_tools_yaml(
            str(tmp_path / "bad.yaml"), [{"class_name": class_name, "config": {"type": kind}, "tool_schema": schema}]
        )
        with pytest.raises(NotImplementedError, match=reason):
            check_tool_config(bad)
    dup = write_tools_yaml(str(tmp_path / "dup.yaml"), [calc_entry(), calc_entry()])
    with pytest.raises(ValueError, match="tool name 'calc' is used by tools\\[0\\] and tools\\[1\\]"):
        initialize_tools_from_config(dup)
    with pytest.raises(ImportError, match="hybridflow has no 'hybridflow.tools.nope'"):
        load_class("verl.tools.nope.Nope", "tool class")
    with pytest.raises(FileNotFoundError, match="tool_config_path"):
        initialize_tools_from_config(str(tmp_path / "missing.yaml"))


def test_interactions_from_yaml_names_and_gsm8k_scoring(tmp_path):
    path = tmp_path / "i.yaml"
    path.write_text(
        "interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n"
        "  - name: other\n    class_name: hybridflow.interactions.base.BaseInteraction\n    config: {a: 1}\n"
    )
    found = initialize_interactions_from_config(str(path))
    assert set(found) == {"gsm8k", "other"}  # no name: class name without 'Interaction', lower case
    assert isinstance(found["gsm8k"], Gsm8kInteraction) and found["other"].config == {"a": 1, "name": "other"}
    assert isinstance(found["gsm8k"], BaseInteraction)
    path.write_text(
        "interaction:\n  - {name: x, class_name: hybridflow.interactions.base.BaseInteraction}\n"
        "  - {name: x, class_name: hybridflow.interactions.base.BaseInteraction}\n"
    )
    with pytest.raises(ValueError, match="duplicate interaction name 'x'"):
        initialize_interactions_from_config(str(path))

    gsm = Gsm8kInteraction({"name": "gsm8k"})

    async def talk():
        iid = await gsm.start_interaction("r1", ground_truth="72")
        wrong = await gsm.generate_response(iid, [{"role": "assistant", "content": "#### 71"}])
        right = await gsm.generate_response(
            iid, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 72"}]
        )
        await gsm.finalize_interaction(iid)
        return wrong, right

    wrong, right = asyncio.run(talk())
    assert wrong[0] is False and wrong[2] == 0.0 and "incorrect" in wrong[1]
    assert right[:3] == (True, "Your response is correct!", 1.0) and gsm._instances == {}


def test_calculator_by_hand():
    assert format_number(evaluate("347*82")) == "28454"  # 347 * 82 = 27760 + 694
    assert format_number(evaluate("(12+3)/4")) == "3.75" and format_number(evaluate("7/7")) == "1"
    assert format_number(evaluate("-2**3 + 10 % 4")) == "-6"  # -(2**3) + 2
    for bad, why in [
        ("__import__('os')", "unsupported element"),
        ("2**1000", "exponent"),
        ("1/0", "division by zero"),
        ("x+1", "unsupported element"),
        ("2+", "not an arithmetic expression"),
        ("9" * 300, "longer than"),
    ]:
        with pytest.raises(ValueError, match=why):
            evaluate(bad)
    from hybridflow.tools.schemas import OpenAIFunctionToolSchema

    tool = CalculatorTool({}, OpenAIFunctionToolSchema.model_validate(CALC_SCHEMA))
    assert tool.argument == "expr" and asyncio.run(tool.execute("i", {"expr": "6*7"}))[0].text == "42"


def test_code_tool_runs_in_the_sandbox():
    from hybridflow.tools.code_tool import CodeInterpreterTool
    from hybridflow.tools.schemas import OpenAIFunctionToolSchema

    schema = OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": "code_interpreter",
                "description": "run",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
            },
        }
    )
    tool = CodeInterpreterTool({"default_timeout": 2}, schema)
    ok = asyncio.run(tool.execute("i", {"code": "print(6*7)"}))
    assert ok[0].text == "42\n" and ok[2]["reason"] == "ok"
    failed = asyncio.run(tool.execute("i", {"code": "import socket; socket.socket()"}))
    assert failed[2]["reason"] != "ok" and failed[0].text  # denied inside the sandbox; the model sees why


def test_hermes_parser_and_parser_registry():
    parser = TOOL_PARSERS["hermes"](TOK)
    text = (
        'I will compute.<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call>'
        '<tool_call>\nnot json\n</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    parsed = parser.parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calc", '{"expr": "1+2"}'), ("b", "{}")]
    assert parsed.malformed == 1 and parsed.content == "I will compute."
    assert parser.parse("no calls").calls == [] and ToolParser.get_tool_parser("hermes", TOK).__class__ is type(parser)

    @register_tool_parser("pipe_test")
    class Pipe(ToolParser):
        def parse(self, text):
            from hybridflow.agent_loop.tool_parser import FunctionCall, ParsedResponse

            name, _, args = text.partition("|")
            return ParsedResponse("", [FunctionCall(name, args)] if args else [])

    try:
        assert TOOL_PARSERS["pipe_test"](TOK).parse('calc|{"expr": "2"}').calls[0].name == "calc"
    finally:
        TOOL_PARSERS._entries.pop("pipe_test")
    with pytest.raises(KeyError, match="unknown tool-call format.*hermes"):
        TOOL_PARSERS["llama3_json"]


def test_truncation_sides_by_hand():
    text = "abcdefghij"  # 10 characters, limit 4
    assert truncate_text(text, 4, "left") == ("(truncated)...ghij", True)
    assert truncate_text(text, 4, "right") == ("abcd...(truncated)", True)
    assert truncate_text(text, 4, "middle") == ("ab...(truncated)...ij", True)
    assert truncate_text(text, 10, "middle") == (text, False)


def test_agent_loop_config_file_registers_user_loops(tmp_path):
    module = tmp_path / "my_loop.py"
    module.write_text(
        textwrap.dedent("""
        from hybridflow.agent_loop import AgentLoopBase, AgentLoopOutput

        class Fixed(AgentLoopBase):
            def __init__(self, *args, answer, **kwargs):
                super().__init__(*args, **kwargs)
                self.answer = answer

            async def run(self, sampling_params, **sample):
                ids = [int(c) for c in str(self.answer)]
                return AgentLoopOutput(sample["prompt_ids"], ids, [1] * len(ids), None, num_turns=2)
    """)
    )
    (tmp_path / "loops.yaml").write_text("- name: fixed\n  _target_: my_loop.py:Fixed\n  answer: 123\n")
    specs = load_agent_loop_config(str(tmp_path / "loops.yaml"))
    assert specs["fixed"][1] == {"answer": 123} and issubclass(specs["fixed"][0], AgentLoopBase)
    assert "fixed" not in AGENT_LOOPS  # the file's loops live in the worker, not in the global registry
    s = settings(tmp_path, [calc_entry()], prompt_length=4)
    s = type(s)(**{**s.__dict__, "agent_loop_config_path": str(tmp_path / "loops.yaml")})
    worker = AgentLoopWorker(s, [ScriptedChat([])], TOK, pad_token_id=0)
    from tests.agent_loop.chat_helpers import batch_of

    batch = batch_of([{"messages": [{"role": "user", "content": "x"}], "agent_name": "fixed"}], prompt_length=4)
    out = asyncio.run(worker.generate_sequences(batch))
    assert out.batch["responses"][0, :3].tolist() == [1, 2, 3]
    (tmp_path / "bad.yaml").write_text("- name: x\n  _target_: hybridflow.tools.base_tool.BaseTool\n")
    with pytest.raises(TypeError, match="not an AgentLoopBase subclass"):
        load_agent_loop_config(str(tmp_path / "bad.yaml"))


def test_a_tool_file_with_interpolations_is_refused_naming_it(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - class_name: ${oc.env:TOOL_CLASS}\n    config: {}\n")
    with pytest.raises(ValueError, match="tools.yaml.*interpolations are not supported"):
        initialize_tools_from_config(str(path))
