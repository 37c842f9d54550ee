"""One visible path through a step: the call chain from ``train_step`` to the engine's decode step and
to the policy loss stays short (benchmarks/step_frames.py measures it; docs/architecture.md lists it)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# measured on the in-process backend (before issue 34: 17 frames to each, 15 and 10 without the dispatch)
MAX_FRAMES = {"decode": 12, "loss": 14}
MAX_OWN_FRAMES = {"decode": 10, "loss": 7}


def _step_frames():
    path = os.path.join(ROOT, "benchmarks", "step_frames.py")
    spec = importlib.util.spec_from_file_location("step_frames", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_reaches_the_decode_step_and_the_loss_in_few_frames(restore_env):
    restore_env("HYBRIDFLOW_DEVICE", "MKL_NUM_THREADS")  # the in-process run sets them for its workers
    frames = _step_frames()
    chains = frames.measure()
    assert set(chains) == {"decode", "loss"}
    for target, parts in chains.items():
        listing = dict(parts)  # shown when a bound is passed: where the new frames are
        assert parts["driver"][0] == "trainer.ppo.ray_trainer:train_step", listing
        assert frames.depth(parts) <= MAX_FRAMES[target], listing
        assert frames.depth(parts, machinery=False) <= MAX_OWN_FRAMES[target], listing
