"""get_custom_reward_fn: loading a scorer from a file, binding kwargs, and clear errors."""

import pytest

from hybridflow.rewards import NaiveRewardManager, get_custom_reward_fn

SOURCE = """
import math

THRESHOLD = 3

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str == ground_truth) + bonus

def length_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) > THRESHOLD)

class Judge:
    pass

_private = lambda: 0
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_loads_default_name(reward_file):
    fn = get_custom_reward_fn(str(reward_file))
    assert fn.__name__ == "compute_score"
    assert fn("src", "a", "a") == 1.0 and fn("src", "a", "b") == 0.0


def test_loads_named_function_and_module_globals_work(reward_file):
    fn = get_custom_reward_fn(str(reward_file), name="length_score")
    assert fn("src", "abcd", "") == 1.0 and fn("src", "abc", "") == 0.0  # THRESHOLD = 3


def test_reward_kwargs_are_bound_and_overridable(reward_file):
    fn = get_custom_reward_fn(str(reward_file), reward_kwargs={"bonus": 0.5})
    assert fn.__name__ == "compute_score"
    assert fn("src", "a", "a") == 1.5
    assert fn("src", "a", "a", bonus=2.0) == 3.0  # call-time value wins


def test_no_path_means_no_custom_function():
    assert get_custom_reward_fn(None) is None
    assert get_custom_reward_fn("") is None


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope" / "reward.py"
    with pytest.raises(FileNotFoundError) as info:
        get_custom_reward_fn(str(missing))
    assert str(missing) in str(info.value)


def test_missing_function_lists_callables(reward_file):
    with pytest.raises(AttributeError) as info:
        get_custom_reward_fn(str(reward_file), name="score_fn")
    msg = str(info.value)
    assert "score_fn" in msg and str(reward_file) in msg
    # callables defined in the file, not imported ones (math) nor private ones
    assert msg.endswith("callables defined there: Judge, compute_score, length_score")


def test_not_callable(reward_file):
    with pytest.raises(TypeError, match="'THRESHOLD'.*not callable"):
        get_custom_reward_fn(str(reward_file), name="THRESHOLD")


def test_error_inside_the_file_mentions_the_file(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('setup failed')\n")
    with pytest.raises(RuntimeError, match="setup failed") as info:
        get_custom_reward_fn(str(bad))
    assert any(str(bad) in note for note in info.value.__notes__)


def test_same_basename_in_two_dirs_do_not_collide(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "r.py").write_text("def compute_score(**kw):\n    return 1.0\n")
    (tmp_path / "b" / "r.py").write_text("def compute_score(**kw):\n    return 2.0\n")
    fa = get_custom_reward_fn(str(tmp_path / "a" / "r.py"))
    fb = get_custom_reward_fn(str(tmp_path / "b" / "r.py"))
    assert fa() == 1.0 and fb() == 2.0


def test_plugs_into_the_manager(reward_file):
    import numpy as np
    import torch

    from hybridflow.protocol import DataProto

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids if i > 1)

    batch = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([[ord("q")]]),
            "responses": torch.tensor([[ord("a"), 0, 0]]),
            "attention_mask": torch.tensor([[1, 1, 0, 0]]),
        },
        non_tensors={
            "data_source": np.array(["anything"], dtype=object),
            "reward_model": np.array([{"ground_truth": "a"}], dtype=object),
        },
    )
    fn = get_custom_reward_fn(str(reward_file), reward_kwargs={"bonus": 1.0})
    reward = NaiveRewardManager(Tok(), 0, compute_score=fn)(batch)
    assert reward.tolist() == [[2.0, 0.0, 0.0]]  # exact match 1 + bonus 1 on the only valid token
