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
    folder = _profiled_run(
        tiny_model_dir, tiny_data_dir, tmp_path, "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[shapes]",
        steps=3,
    )  # fmt: skip
    save = os.path.dirname(folder)
    assert sorted(os.listdir(save)) == ["step_2"]  # steps 1 and 3 were not recorded
    (name,) = os.listdir(folder)
    assert name.endswith("_rank0.pt.trace.json")
    events = _events(os.path.join(folder, name))
    names = {e.get("name") for e in events}
    assert any(n and n.startswith("aten::") for n in names)  # the step's torch ops are in it
    assert any("Input Dims" in (e.get("args") or {}) for e in events)  # contents=[shapes] recorded shapes
    assert trace_path(save, 2, name.split("_rank")[0], 0) == os.path.join(folder, name)


@pytest.mark.parametrize("tool", ["nsys", "npu", "torch_memory"])
def test_tools_hybridflow_does_not_drive_are_refused_by_name(tool, tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config.loader import ConfigError, load_config
    from tests.trainer.e2e_helpers import base_overrides

    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    with pytest.raises(ConfigError, match=f"global_profiler.tool.*{tool}"):
        load_config("ppo_trainer", [*overrides, f"global_profiler.tool={tool}"])


# --------------------------------------------------------------------------- stages, threads, schedule, discrete


def test_a_schedule_window_is_named_by_its_mini_batches():
    from hybridflow.config.profiler import TorchProfilerScheduleConfig
    from hybridflow.workers.profiler import schedule_kwargs, window_of

    # skip 1, then cycles of wait 1 + warmup 1 + active 2: recorded windows are mini-batches 3-4, 7-8, ...
    s = schedule_kwargs(TorchProfilerScheduleConfig(skip_first=1, wait=1, warmup=1, active=2), continuous=False)
    assert s == {"skip_first": 1, "wait": 1, "warmup": 1, "active": 2, "repeat": 0}
    assert window_of(s, 5) == (3, 4) and window_of(s, 9) == (7, 8)
    assert window_of(s, 4) == (3, 3)  # recording stopped after mini-batch 3: a window of one
    # a continuous trace keeps one window unless repeat says more; active 0 records everything
    assert schedule_kwargs(TorchProfilerScheduleConfig(active=2), continuous=True)["repeat"] == 1
    assert schedule_kwargs(TorchProfilerScheduleConfig(active=2, repeat=3), continuous=True)["repeat"] == 3
    assert schedule_kwargs(TorchProfilerScheduleConfig(), continuous=True) is None


def test_a_negative_schedule_value_is_refused_naming_the_key():
    from hybridflow.config.profiler import TorchProfilerScheduleConfig

    with pytest.raises(ConfigError, match=r"schedule: warmup=-1 must be whole numbers >= 0"):
        TorchProfilerScheduleConfig(warmup=-1)


def _profiled_run(tiny_model_dir, tiny_data_dir, tmp_path, *extra, backend: str = "inprocess", steps: int = 2) -> str:
    """The folder of step 2 of a GRPO run profiled on the actor+rollout worker (4 mini-batches per update)."""
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from tests.trainer.e2e_helpers import base_overrides

    save = tmp_path / "profile"
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, steps=steps, backend=backend, mini_batch=1
    )  # 4 prompts x 2 samples, 1 prompt a mini-batch: 4 optimizer steps an update
    overrides += [
        "trainer.test_freq=-1",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={save}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.all_ranks=True",
        "actor_rollout_ref.rollout.profiler.enable=True",
        "actor_rollout_ref.rollout.profiler.all_ranks=True",
        *extra,
    ]
    run_ppo(load_config("ppo_trainer", overrides))
    return str(save / "step_2")


# both roles of the actor+rollout worker ask for a trace per stage
DISCRETE = tuple(f"actor_rollout_ref.{role}.profiler.tool_config.torch.discrete=True" for role in ("actor", "rollout"))


def _events(path: str) -> list[dict]:
    with open(path) as f:
        return json.load(f)["traceEvents"]


def _ranges(events) -> set[str]:
    return {e["name"] for e in events if e.get("cat") == "user_annotation"}


def _optimizer_steps(events) -> int:
    return sum(1 for e in events if str(e.get("name", "")).startswith("Optimizer.step#"))


def test_a_continuous_trace_holds_every_stage_and_the_rollouts_decode_thread(tiny_model_dir, tiny_data_dir, tmp_path):
    folder = _profiled_run(tiny_model_dir, tiny_data_dir, tmp_path)
    assert os.listdir(folder) == ["actor_rollout_rank0.pt.trace.json"]
    events = _events(os.path.join(folder, "actor_rollout_rank0.pt.trace.json"))
    assert {"generate", "compute_log_prob", "update_actor"} <= _ranges(events)
    # the hf rollout decodes on its own thread: its ops are recorded beside the training thread's
    threads = {e["tid"] for e in events if str(e.get("name", "")).startswith("aten::")}
    assert len(threads) >= 2
    assert _optimizer_steps(events) == 4  # the whole update


def test_a_schedule_keeps_the_update_window_it_names(tiny_model_dir, tiny_data_dir, tmp_path):
    # veRL 0.9's torch-profile example: warmup 1, active 2, repeat 1 over the update's mini-batches
    sched = "actor_rollout_ref.actor.profiler.tool_config.torch.schedule"
    folder = _profiled_run(
        tiny_model_dir, tiny_data_dir, tmp_path, f"{sched}.warmup=1", f"{sched}.active=2", f"{sched}.repeat=1"
    )
    assert os.listdir(folder) == ["actor_rollout_rank0_mb1-2.pt.trace.json"]
    events = _events(os.path.join(folder, "actor_rollout_rank0_mb1-2.pt.trace.json"))
    assert _optimizer_steps(events) == 2  # mini-batches 1 and 2 of 0-3
    assert "generate" not in _ranges(events)  # the window starts after the stages before the update
    assert not any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)  # a step is a mini-batch


def test_discrete_writes_a_trace_per_stage_and_schedules_the_update_only(tiny_model_dir, tiny_data_dir, tmp_path):
    folder = _profiled_run(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        *DISCRETE,
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.skip_first=3",
        "actor_rollout_ref.actor.profiler.tool_config.torch.schedule.active=1",
    )
    assert sorted(os.listdir(folder)) == [
        "actor_rollout_compute_log_prob_rank0.pt.trace.json",
        "actor_rollout_generate_rank0.pt.trace.json",
        "actor_rollout_update_actor_rank0_mb3.pt.trace.json",
    ]
    generate = _events(os.path.join(folder, "actor_rollout_generate_rank0.pt.trace.json"))
    assert "generate" in _ranges(generate) and _optimizer_steps(generate) == 0
    update = _events(os.path.join(folder, "actor_rollout_update_actor_rank0_mb3.pt.trace.json"))
    assert _optimizer_steps(update) == 1  # the last of the 4 mini-batches


def test_profiling_a_run_with_a_reward_model_records_the_policy_worker(tiny_model_dir, tiny_data_dir, tmp_path):
    # the reward model's worker has no profiler (veRL's reward model profiler keys are refused): it is skipped
    from tests.trainer.test_ppo_e2e import _save_tiny_reward_model

    rm_dir = _save_tiny_reward_model(tiny_model_dir, os.path.join(str(tmp_path), "rm"))
    folder = _profiled_run(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        "reward_model.enable=True",
        f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=4",
    )
    assert os.listdir(folder) == ["actor_rollout_rank0.pt.trace.json"]


@pytest.mark.slow
def test_ray_workers_write_per_stage_traces_with_the_decode_thread(
    tiny_model_dir, tiny_data_dir, ray_session, tmp_path
):
    """The same on a Ray worker process: the stage spans cross calls (generate: prepare_rollout to
    release_rollout) and the hf rollout's decode thread is recorded there too."""
    folder = _profiled_run(tiny_model_dir, tiny_data_dir, tmp_path, *DISCRETE, backend="ray")
    assert sorted(os.listdir(folder)) == [
        "actor_rollout_compute_log_prob_rank0.pt.trace.json",
        "actor_rollout_generate_rank0.pt.trace.json",
        "actor_rollout_update_actor_rank0.pt.trace.json",
    ]
    generate = _events(os.path.join(folder, "actor_rollout_generate_rank0.pt.trace.json"))
    # the decode's forwards (on the engine's executor thread) are in it, not only the weight push
    assert any(e.get("name") in ("aten::linear", "aten::addmm", "aten::mm") for e in generate)
    update = _events(os.path.join(folder, "actor_rollout_update_actor_rank0.pt.trace.json"))
    assert _optimizer_steps(update) == 4


def test_a_discrete_role_beside_a_continuous_one_in_the_same_worker_is_noted(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config.loader import load_config
    from hybridflow.trainer.config_checks import validate_ppo_config
    from tests.trainer.e2e_helpers import base_overrides

    enabled = [f"actor_rollout_ref.{role}.profiler.enable=True" for role in ("actor", "rollout")]
    base = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess") + enabled

    def notes(*extra):
        return [n for n in validate_ppo_config(load_config("ppo_trainer", [*base, *extra])) if "discrete" in n]

    (note,) = notes(DISCRETE[1])  # veRL's torch-profile example: discrete on the rollout only
    assert note.startswith(
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True gives no trace per stage"
    )
    assert "the actor profiler of the same worker process records one continuous trace" in note
    assert notes(*DISCRETE) == [] and notes() == []
