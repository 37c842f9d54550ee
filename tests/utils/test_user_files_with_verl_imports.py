"""A Python file written for veRL (``from verl.utils.reward_score import gsm8k``, ``import verl.x``, an import
inside a function) loads unchanged where veRL is not installed: its veRL imports read hybridflow's paths, and
nothing named ``verl`` is left in ``sys.modules``. Expected scores come from the hand-written answers."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from hybridflow.rewards.custom import get_custom_reward_fn
from hybridflow.utils.import_utils import load_class

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="veRL itself is installed")

REWARD_FILE = """
import verl.utils.reward_score
import verl.utils.reward_score.gsm8k as gsm8k_module
from verl.utils.reward_score import gsm8k
from verl import DataProto


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    from verl.utils.reward_score.gsm8k import compute_score as strict  # imported when called, as veRL users do
    assert gsm8k is gsm8k_module is verl.utils.reward_score.gsm8k
    assert DataProto.__name__ == "DataProto"
    return strict(solution_str, ground_truth) + 10 * gsm8k.compute_score(solution_str, ground_truth)
"""

TOOL_FILE = """
from verl.tools.base_tool import BaseTool


class MyTool(BaseTool):
    pass
"""


def test_a_reward_function_written_for_verl_scores_through_hybridflows_paths(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    before = {name for name in sys.modules if name == "verl" or name.startswith("verl.")}
    fn = get_custom_reward_fn(str(path), "compute_score")
    assert fn("openai/gsm8k", "so #### 42", "42") == 11.0  # right: 1 + 10 * 1
    assert fn("openai/gsm8k", "so #### 41", "42") == 0.0
    assert {name for name in sys.modules if name == "verl" or name.startswith("verl.")} == before == set()


def test_a_class_in_a_verl_file_loads_by_path(tmp_path):
    from hybridflow.tools.base_tool import BaseTool

    path = tmp_path / "my_tool.py"
    path.write_text(TOOL_FILE)
    cls = load_class(f"{path}:MyTool")
    assert issubclass(cls, BaseTool)


def test_errors_in_the_file_keep_its_line_numbers(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("from verl.utils.reward_score import gsm8k\n\n\ndef compute_score(*a, **k):\n    return 1 / 0\n")
    fn = get_custom_reward_fn(str(path), "compute_score")
    with pytest.raises(ZeroDivisionError) as err:
        fn("s", "x", "y")
    frame = err.traceback[-1]
    assert frame.path == path and frame.lineno + 1 == 5  # pytest counts lines from 0


def test_a_verl_path_hybridflow_does_not_serve_is_named(tmp_path):
    path = tmp_path / "megatron_reward.py"
    path.write_text("from verl.models.mcore import registry\n")
    with pytest.raises(ImportError) as err:
        get_custom_reward_fn(str(path), "compute_score")
    assert "hybridflow.models" in str(err.value)
    assert any("imports from veRL, which is not installed" in note for note in err.value.__notes__)
