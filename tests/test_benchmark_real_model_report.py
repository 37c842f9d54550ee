"""The arithmetic and verdicts behind ``benchmarks/real_model.py`` (fast; the script's real run is in
tests/test_benchmarks_smoke.py, marked slow). Expected values are derived by hand in the comments."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "_real_model_report.py")
_spec = importlib.util.spec_from_file_location("benchmarks_real_model_report", PATH)
report = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))  # dataclasses look it up there
_spec.loader.exec_module(report)


def test_flop_and_byte_counts():
    # 6 FLOPs per parameter per token: 6 * 135e6 * 1000 = 8.1e11
    assert report.train_flops(135_000_000, 1000) == 8.1e11
    # (2, 3) @ (3, 4): 2*4 outputs, each 3 multiplies + 3 adds = 48
    assert report.matmul_flops(2, 3, 4) == 48
    # fp32 weights + grads + Adam m + v: 4 * 4 bytes per parameter
    assert report.training_state_bytes(1000) == 16_000
    assert report.tokens_per_second(300, 1.5) == 200 and math.isnan(report.tokens_per_second(3, 0))


@pytest.mark.parametrize(
    "value, op, target, passed",
    [(0.8, ">=", 0.8, True), (0.79, ">=", 0.8, False), (2.0, "<=", 2.0, True), (2.01, "<=", 2.0, False)],
)
def test_goal_verdicts_at_the_boundary(value, op, target, passed):
    goal = report.Goal("ratio", value, op, target)
    assert goal.passed is passed
    assert goal.line().endswith("PASS" if passed else "MISS") and f"goal {op} {target:g}" in goal.line()


def test_a_goal_with_an_unknown_comparison_is_refused_by_name():
    with pytest.raises(ValueError, match="goal 'sync'.*'>'"):
        report.Goal("sync", 1.0, ">", 2.0)


def test_overrides_are_replaced_in_place_of_duplicates():
    base = ["a.b=1", "c=2", "a.b=3", "d=[1,2]"]
    assert report.replace_overrides(base, ["a.b=9", "e=x=y"]) == ["c=2", "d=[1,2]", "a.b=9", "e=x=y"]


def test_median_and_markdown():
    assert report.median([3, 1, 2]) == 2 and report.median([4, 1, 3, 2]) == 2.5 and math.isnan(report.median([]))
    table = report.markdown_table(["row", "s", "n"], [["a", 0.12345, 12345.6], ["b", 2.0, 7]])
    assert table.splitlines() == ["| row | s | n |", "|---|---|---|", "| a | 0.123 | 12,346 |", "| b | 2 | 7 |"]
