"""``global_profiler.tool=torch`` (veRL's keys): the listed steps, and only those, leave a torch.profiler
Chrome trace per recording rank; tools hybridflow does not drive are refused by name."""

from __future__ import annotations

import json
import os

import pytest

from hybridflow.config import ConfigError, ProfilerConfig
from hybridflow.config.convert import as_section
from hybridflow.trainer.ppo.profiling import profile_span, profiled_steps
from hybridflow.workers.profiler import merge_profilers, profiler_kwargs, records, trace_path


def role_profiler(section, path: str) -> ProfilerConfig:
    """A role's profiler section as a user's mapping, read into its class at the door."""
    return as_section(section, ProfilerConfig, path)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_profile_spans_per_step_and_continuous():
    steps = frozenset({2, 3, 5})
    assert [profile_span(s, steps, False) for s in (1, 2, 3, 5)] == [
        (False, False),
        (True, True),
        (True, True),
        (True, True),
    ]
    # continuous: 2-3 is one span (start before 2, stop after 3); 5 alone
    assert [profile_span(s, steps, True) for s in (1, 2, 3, 4, 5)] == [
        (False, False),
        (True, False),
        (False, True),
        (False, False),
        (True, True),
    ]
    assert profiled_steps({"tool": "torch", "steps": [1, 4], "profile_continuous_steps": True}) == (
        frozenset({1, 4}),
        True,
    )
    assert profiled_steps({"tool": None, "steps": [1]}) == (frozenset(), False)  # no tool: nothing recorded
    assert profiled_steps({"tool": "torch", "steps": None}) == (frozenset(), False)


def test_role_sections_merge_and_select_ranks():
    off = merge_profilers(
        [role_profiler({"enable": False, "all_ranks": True}, "actor.profiler"), role_profiler(None, "ref.profiler")]
    )  # a role without the section: off
    assert not records(off, 0)
    sections = [
        role_profiler(
            {"enable": True, "ranks": [1], "save_path": "/a", "tool_config": {"torch": {"contents": ["shapes"]}}},
            "actor.profiler",
        ),
        role_profiler(
            {"enable": True, "ranks": [3], "tool_config": {"torch": {"contents": ["stack"]}}}, "ref.profiler"
        ),
        role_profiler(
            {"enable": False, "ranks": [2], "tool_config": {"torch": {"contents": ["memory"]}}}, "rollout.profiler"
        ),
    ]
    assert all(isinstance(s, ProfilerConfig) for s in sections)
    plan = merge_profilers(sections)
    assert [records(plan, r) for r in range(4)] == [False, True, False, True] and plan.save_path == "/a"
    assert plan.tool_config.torch.contents == ["shapes", "stack"]  # the disabled role adds nothing
    assert all(records(merge_profilers([role_profiler({"enable": True, "all_ranks": True}, "p")]), r) for r in range(3))
    assert profiler_kwargs(plan.tool_config.torch.contents, cuda_available=False)["record_shapes"] is True
    kwargs = profiler_kwargs(frozenset(), cuda_available=True)
    assert len(kwargs["activities"]) == 2 and not kwargs["with_stack"]  # empty contents: CPU + CUDA
    assert len(profiler_kwargs(frozenset({"memory"}), cuda_available=True)["activities"]) == 1  # cuda not asked


def test_unknown_torch_contents_are_refused_by_the_typed_section():
    with pytest.raises(ConfigError, match=r"profiler.tool_config.torch.contents: unknown entries \['gpu'\]"):
        role_profiler({"enable": True, "tool_config": {"torch": {"contents": ["gpu"]}}}, "actor.profiler")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.profiler.ranks\[0\] must be an integer"):
        role_profiler({"enable": True, "ranks": ["zero"]}, "actor_rollout_ref.actor.profiler")


def test_listed_steps_write_a_trace_per_rank(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from tests.trainer.e2e_helpers import base_overrides

    save = tmp_path / "profile"
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", steps=3, backend="inprocess")
    overrides += [
        "trainer.test_freq=-1",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={save}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[shapes]",
    ]
    run_ppo(load_config("ppo_trainer", overrides))
    assert sorted(os.listdir(save)) == ["step_2"]  # steps 1 and 3 were not recorded
    (name,) = os.listdir(save / "step_2")
    assert name.endswith("_rank0.pt.trace.json")
    with open(save / "step_2" / name) as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name") for e in events}
    assert any(n and n.startswith("aten::") for n in names)  # the step's torch ops are in it
    assert any("Input Dims" in (e.get("args") or {}) for e in events)  # contents=[shapes] recorded shapes
    assert trace_path(str(save), 2, name.split("_rank")[0], 0) == str(save / "step_2" / name)


@pytest.mark.parametrize("tool", ["nsys", "npu", "torch_memory"])
def test_tools_hybridflow_does_not_drive_are_refused_by_name(tool, tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config.loader import ConfigError, load_config
    from tests.trainer.e2e_helpers import base_overrides

    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    with pytest.raises(ConfigError, match=f"global_profiler.tool.*{tool}"):
        load_config("ppo_trainer", [*overrides, f"global_profiler.tool={tool}"])
