"""The soak benchmark's bookkeeping (benchmarks/soak.py): which executions count, how lost and repeated
samples are counted, the memory slope. Expected values are worked out by hand in the comments."""

from __future__ import annotations

import math

import soak  # benchmarks/soak.py (benchmarks/ is on pytest.ini's pythonpath)

# 2 prompts per step, 2 steps per epoch, 4 steps: epoch 0 = prompts 0-3, epoch 1 = the same prompts reshuffled
REFERENCE = {1: [0, 1], 2: [2, 3], 3: [3, 0], 4: [1, 2]}


def test_the_last_execution_of_a_step_is_the_committed_one():
    # attempt 0 ran steps 1-3 and died in 3 after the step-2 checkpoint; attempt 1 redid 3 and ran 4
    executions = [(0, 1, [0, 1]), (0, 2, [2, 3]), (0, 3, [9, 9]), (1, 3, [3, 0]), (1, 4, [1, 2])]
    committed = soak.committed_steps(executions)
    assert committed == REFERENCE
    assert soak.sample_accounting(committed, REFERENCE, steps_per_epoch=2) == {
        "lost": 0,
        "repeated": 0,
        "mismatched_steps": [],
        "missing_steps": [],
    }


def test_a_resume_that_skips_a_batch_loses_it_and_one_that_replays_a_batch_repeats_it():
    # step 2 trained step 3's prompts [3, 0] (a loader restored one batch too far). Epoch 0 (steps 1-2)
    # then holds 0, 1, 3, 0 against the expected 0, 1, 2, 3: prompt 2 lost (1), prompt 0 once too often (1)
    skipped = {1: [0, 1], 2: [3, 0], 3: [3, 0], 4: [1, 2]}
    acct = soak.sample_accounting(skipped, REFERENCE, steps_per_epoch=2)
    assert (acct["lost"], acct["repeated"], acct["mismatched_steps"]) == (1, 1, [2])
    # a step never committed (the run stopped early): its 2 prompts are lost, nothing repeated
    acct = soak.sample_accounting({1: [0, 1], 2: [2, 3], 3: [3, 0]}, REFERENCE, steps_per_epoch=2)
    assert (acct["lost"], acct["repeated"], acct["missing_steps"]) == (2, 0, [4])


def test_growth_is_the_least_squares_slope_per_100_steps():
    # RSS 500 MB at step 10 rising 0.2 MB per step: 20 MB per 100 steps
    assert math.isclose(soak.growth_per_100_steps([(s, 500 + 0.2 * (s - 10)) for s in range(10, 60)]), 20.0)
    assert math.isnan(soak.growth_per_100_steps([(5, 1.0), (5, 2.0)]))
