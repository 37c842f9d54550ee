"""The overlap bound behind ``benchmarks/async_throughput.py`` (fast; the script's run is in
tests/test_benchmarks_smoke.py). Expected values are worked out by hand in the comments."""

from __future__ import annotations

import math

import async_throughput as bench  # benchmarks/ is on pytest.ini's pythonpath
import pytest


@pytest.mark.parametrize(
    "step, gen, bound",
    [
        (2.0, 1.2, 2.0 / 1.2),  # generation is the longer phase: 2.0 / 1.2 = 1.667
        (2.0, 0.5, 2.0 / 1.5),  # training (2.0 - 0.5 = 1.5 s) is the longer phase: 1.333
        (2.0, 1.0, 2.0),  # equal phases: a perfect overlap halves the step
        (2.0, 0.0, 1.0),  # nothing to overlap
    ],
)
def test_overlap_bound_is_the_step_over_its_longer_phase(step, gen, bound):
    assert bench.overlap_bound(step, gen) == pytest.approx(bound)


def test_versus_reports_ratio_bound_and_share_reached():
    # sync: 3.2 s steps, 2.0 s generating (training 1.2 s) -> bound 3.2 / 2.0 = 1.6; 14.4 / 10 samples/s = 1.44x
    # -> 1.44 / 1.6 = 90 % of the bound
    results = {
        "sync": {"samples_s": 10.0, "step_s": 3.2, "phases": {"gen": 2.0}},
        "fully_async": {"samples_s": 14.4, "step_s": 2.2, "phases": {"gen": 0.1}},
    }
    assert bench.versus(results, "fully_async", "sync") == pytest.approx((1.44, 1.6, 0.9))
    assert all(math.isnan(x) for x in bench.versus(results, "fully_async", "sync+rollout_logprobs"))


def test_cpu_per_step_leaves_out_the_last_step_which_runs_the_final_validation(tmp_path):
    cpu = bench.StepCPU(str(tmp_path / "metrics.jsonl"))
    cpu.close(0)  # stops the polling thread; the marks below stand for a run's
    # (time, CPU seconds) at the end of steps 1-4; step 4 also validated (8 CPU seconds more)
    cpu.marks = [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0), (4.0, 12.0)]
    per_step, cores = cpu.close(1)  # from the end of step 2 to the end of step 3 (step 4 left out)
    assert per_step == pytest.approx(1.0) and cores == pytest.approx(1.0)
