"""veRL's ``@function_tool`` (``multi_turn.function_tool_path``): a Python function as a tool. The schema is
read from the type hints and docstring, the file runs once, the tool_agent loop calls the function with the
model's arguments and the value becomes the tool message (step rewards from a tuple)."""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from hybridflow.agent_loop import AgentLoopWorker
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.data.rl_dataset import RLHFDataset
from hybridflow.tools.function_tool import FunctionTool, function_schema, load_tools, tool_result
from hybridflow.trainer.config_checks import validate_ppo_config
from hybridflow.utils.function_tools import FunctionSpec, load_function_tools
from hybridflow.utils.tool_schemas import ToolResponse
from tests.agent_loop.chat_helpers import TOK, ScriptedChat, calc_entry, call_text, ids, response_of, run, settings

TOOLS_FILE = '''
import asyncio
from hybridflow.tools.function_tool import function_tool

@function_tool
def multiply(a: int, b: int) -> str:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return str(a * b)

@function_tool("lookup")
async def find_capital(country: str):
    """The capital of a country.

    Args:
        country: the country's English name
    """
    await asyncio.sleep(0)
    return {"capital": {"France": "Paris"}.get(country, "unknown")}, 0.5, {"found": 1.0}
'''


def write(tmp_path, text=TOOLS_FILE, name="my_tools.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_the_schema_comes_from_the_hints_and_the_docstring():
    def area(width: float, height: int) -> float:
        """The area of a rectangle.

        Args:
            width: its width in metres
            height: its height in metres
        """
        return width * height

    schema = function_schema(area, "rect_area").model_dump(exclude_none=True)["function"]
    assert schema["name"] == "rect_area" and schema["description"] == "The area of a rectangle."
    props = schema["parameters"]["properties"]
    assert props["width"] == {"type": "number", "description": "its width in metres"}
    assert props["height"]["type"] == "integer" and schema["parameters"]["required"] == ["width", "height"]

    def anything(*values: int):
        """Variadic.

        Args:
            values: numbers
        """

    with pytest.raises(ValueError, match=r"takes \['values'\], which an OpenAI tool schema cannot describe"):
        function_schema(anything, "anything")


def test_return_values_in_veRLs_shapes():
    assert tool_result("12") == (ToolResponse(text="12"), 0.0, {})
    assert tool_result({"x": 1})[0].text == json.dumps({"x": 1})
    assert tool_result(7)[0].text == "7"
    assert tool_result(("ok", None)) == (ToolResponse(text="ok"), 0.0, {})
    assert tool_result(("ok", 1, {"m": 2.0})) == (ToolResponse(text="ok"), 1.0, {"m": 2.0})
    assert tool_result(ToolResponse(text="as is"))[0].text == "as is"
    with pytest.raises(TypeError, match="a tuple of 4"):
        tool_result(("a", 1, {}, "extra"))


def test_a_file_runs_once_and_gives_its_tools(tmp_path):
    path = write(tmp_path)
    specs = load_function_tools(path)
    assert [t.name for t in specs] == ["lookup", "multiply"] and all(isinstance(t, FunctionSpec) for t in specs)
    assert load_function_tools(path) is specs  # the file is not run again (its decorators would clash)
    lookup, multiply = load_tools(None, path)  # the agent loop's tools: BaseTools over the same functions
    assert isinstance(lookup, FunctionTool) and lookup.spec is specs[0]
    assert asyncio.run(multiply.execute("i", {"a": 6, "b": 7})) == (ToolResponse(text="42"), 0.0, {})
    response, reward, metrics = asyncio.run(lookup.execute("i", {"country": "France"}))
    assert json.loads(response.text) == {"capital": "Paris"} and reward == 0.5 and metrics == {"found": 1.0}
    with pytest.raises(FileNotFoundError, match="multi_turn.function_tool_path='.*nowhere.py': no such file"):
        load_function_tools(str(tmp_path / "nowhere.py"))
    empty = write(tmp_path, "x = 1\n", "empty.py")
    with pytest.raises(ValueError, match="defines no @function_tool function"):
        load_function_tools(empty)


def test_the_dataset_counts_the_functions_schemas_in_the_prompt_length(tmp_path):
    from tests.data.test_row_limit import rl_file

    tools = write(tmp_path, TOOLS_FILE.replace("multiply", "mul3").replace('"lookup"', '"cap3"'), "counted.py")
    data = rl_file(tmp_path, ["a short question"])
    config = {"max_prompt_length": 64, "filter_overlong_prompts": True, "function_tool_path": tools}
    plain = RLHFDataset(data, TOK, {"max_prompt_length": 64, "filter_overlong_prompts": True})
    assert len(plain) == 1  # fits without the tools block
    with pytest.raises(ValueError, match="longer than max_prompt_length=64"):
        RLHFDataset(data, TOK, config)  # the tools block the rollout renders makes it too long
    assert [
        s["function"]["name"] for s in RLHFDataset(data, TOK, {**config, "max_prompt_length": 256}).tool_schemas
    ] == ["cap3", "mul3"]


def test_a_name_in_both_the_yaml_and_the_file_is_refused(tmp_path):
    clash_tools = TOOLS_FILE.replace("multiply", "calc").replace('"lookup"', '"lookup_clash"')  # names of its own
    clash = write(tmp_path, clash_tools, "clash.py")
    yaml_path = settings(tmp_path, [calc_entry()]).multi_turn.tool_config_path
    with pytest.raises(ValueError, match=r"tool name\(s\) \['calc'\] are both in"):
        load_tools(yaml_path, clash)


def test_the_tool_agent_calls_the_function_and_keeps_its_step_reward(tmp_path):
    path = write(tmp_path, TOOLS_FILE.replace("multiply", "times").replace('"lookup"', '"capital"'), "agent_tools.py")
    call = call_text("capital", country="France")
    server = ScriptedChat([call, "Paris"])
    worker = AgentLoopWorker(settings(None, None, response_length=512, function_tool_path=path), [server], TOK, 0)
    assert [t.name for t in worker.tools] == ["capital", "times"]
    out = run(worker, [{"messages": [{"role": "user", "content": "Capital of France?"}]}])
    resp, _ = response_of(out)
    tool_turn = f"\n<|im_start|>user\n<tool_response>\n{json.dumps({'capital': 'Paris'})}\n</tool_response><|im_end|>\n"
    assert ids(tool_turn)[:-1] == resp[len(ids(call)) + 1 :][: len(ids(tool_turn)) - 1]
    assert out.non_tensor_batch["tool_extra_fields"][0]["tool_rewards"] == [0.5]
    # the model saw both tools in its prompt (the test template's tools block lists name(parameters))
    prompt_text = TOK.decode(server.requests[0][1])
    assert "capital(country)" in prompt_text and "times(a, b)" in prompt_text


def test_the_config_key_is_checked_at_start_up(tmp_path):
    good = write(tmp_path, TOOLS_FILE.replace("multiply", "mul2").replace('"lookup"', '"cap2"'), "checked.py")
    base = ["actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo", "trainer.device=cpu"]
    base += ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    base += ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"]
    validate_ppo_config(
        load_config("ppo_trainer", [*base, f"actor_rollout_ref.rollout.multi_turn.function_tool_path={good}"])
    )
    missing = f"actor_rollout_ref.rollout.multi_turn.function_tool_path={tmp_path / 'absent.py'}"
    with pytest.raises(ConfigError, match="multi_turn.function_tool_path=.*absent.py.*no such file"):
        validate_ppo_config(load_config("ppo_trainer", [*base, missing]))
