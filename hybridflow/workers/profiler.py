"""torch.profiler traces of training steps: veRL's ``global_profiler.tool=torch`` and role profiler keys.

The trainer brackets every step listed in ``global_profiler.steps`` with ``start_profile`` /
``stop_profile`` on each worker group (``profile_continuous_steps``: one span for each run of
consecutive steps). A worker records when one of its roles has ``profiler.enable`` and its rank is
selected (``all_ranks``, or listed in ``ranks``). Every thread of the worker process is recorded (the hf
rollout decodes on its own thread), and each stage (``generate``, ``compute_log_prob``, ``update_actor``,
...) is a named range in the trace. Perfetto (ui.perfetto.dev) opens the files; TensorBoard's profiler plugin
reads a step folder. ``tool_config.torch.contents`` adds what veRL adds: ``cuda`` (CUDA kernels; on by
default where CUDA exists), ``memory``, ``shapes``, ``stack``; CPU activity is always recorded.

- continuous (``discrete: false``): one trace per span and rank,
  ``<save_path>/step_<N>/<role>_rank<r>.pt.trace.json``;
- ``discrete: true``: one trace per stage, ``step_<N>/<role>_<stage>_rank<r>.pt.trace.json``; the rollout's
  ``generate`` stage runs from ``prepare_rollout`` to ``release_rollout`` (or the span's end);
- ``tool_config.torch.schedule`` (``active > 0``): torch.profiler's schedule over the update's mini-batches
  (``skip_first``, then ``wait``/``warmup``/``active`` cycles, ``repeat`` times), one file per recorded
  window named by its mini-batches (``..._mb<a>-<b>.pt.trace.json``). As in veRL, a continuous trace keeps
  one window (``repeat`` 0 reads 1) and, once ``skip_first``/``wait``/``warmup`` skip ahead, loses the stages
  before the window (torch keeps only what ends in a recorded window); discrete traces apply the schedule
  to the update stages only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Sequence

import torch

from hybridflow.config.profiler import (
    TORCH_CONTENTS,
    ProfilerConfig,
    ProfilerToolConfig,
    TorchProfilerScheduleConfig,
    TorchProfilerToolConfig,
)

__all__ = [
    "CONTENTS",
    "UPDATE_STAGES",
    "merge_profilers",
    "records",
    "profiler_kwargs",
    "schedule_kwargs",
    "trace_path",
    "WorkerProfiler",
]


CONTENTS = TORCH_CONTENTS
DEFAULT_SAVE_PATH = ProfilerConfig().save_path
UPDATE_STAGES = ("update_actor", "update_critic")  # the stages whose mini-batches a schedule walks


def _torch_section(section: ProfilerConfig) -> TorchProfilerToolConfig:
    torch_cfg = section.tool_config.torch if section.tool_config is not None else None
    return torch_cfg if torch_cfg is not None else TorchProfilerToolConfig()


def _scheduled(section: ProfilerConfig) -> bool:
    schedule = _torch_section(section).schedule
    return schedule is not None and schedule.active > 0


def merge_profilers(sections: Sequence[ProfilerConfig | None]) -> ProfilerConfig:
    """The role profilers of one worker (a fused actor+rollout+ref worker has several) as one plan: on when
    any role is on; ranks and torch contents united; the first enabled role's save path and schedule.
    Discrete only when every enabled role asks for it: a continuous trace already holds every stage."""
    enabled = [s for s in sections if s is not None and s.enable]  # a section left unset (None) is off
    if not enabled:
        return ProfilerConfig()
    contents = sorted({c for s in enabled for c in _torch_section(s).contents})
    schedules = [_torch_section(s).schedule for s in enabled if _scheduled(s)]
    return ProfilerConfig(
        tool="torch",
        enable=True,
        all_ranks=any(s.all_ranks for s in enabled),
        ranks=sorted({int(r) for s in enabled for r in s.ranks}),
        save_path=enabled[0].save_path or DEFAULT_SAVE_PATH,
        tool_config=ProfilerToolConfig(
            torch=TorchProfilerToolConfig(
                contents=contents,
                discrete=all(_torch_section(s).discrete for s in enabled),
                schedule=schedules[0] if schedules else TorchProfilerScheduleConfig(),
            )
        ),
    )


def records(plan: ProfilerConfig, rank: int) -> bool:
    """Whether ``rank`` writes a trace under ``plan``."""
    return plan.enable and (plan.all_ranks or rank in plan.ranks)


def _all_threads() -> dict:
    """Record every thread of the process, not only the one that starts the profiler (the hf rollout decodes
    on an executor thread). torch's flag for it is experimental: without it, the starting thread only."""
    try:
        return {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (AttributeError, TypeError):
        return {}


def profiler_kwargs(contents: Collection[str], cuda_available: bool) -> dict:
    """``torch.profiler.profile`` arguments for veRL's ``contents`` list (empty: CPU + CUDA where present)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda_available and (not contents or "cuda" in contents):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return {
        "activities": activities,
        "with_stack": "stack" in contents,
        "record_shapes": "shapes" in contents,
        "profile_memory": "memory" in contents,
        **_all_threads(),
    }


def schedule_kwargs(schedule: TorchProfilerScheduleConfig | None, continuous: bool) -> dict | None:
    """``torch.profiler.schedule`` arguments (None: record everything). A continuous trace keeps one window
    unless ``repeat`` says more (veRL's reading: one step must not write a file per cycle)."""
    if schedule is None or schedule.active <= 0:
        return None
    repeat = schedule.repeat or (1 if continuous else 0)
    return {
        "skip_first": schedule.skip_first,
        "wait": schedule.wait,
        "warmup": schedule.warmup,
        "active": schedule.active,
        "repeat": repeat,
    }


def window_of(schedule: dict, steps_done: int) -> tuple[int, int]:
    """The mini-batches (first, last; counted from 0) of the recorded window that ends after ``steps_done``
    mini-batches. A window cut short by the end of recording holds fewer than ``active``."""
    last = max(steps_done - 1, 0)
    cycle = schedule["wait"] + schedule["warmup"] + schedule["active"]
    index = max(last - schedule["skip_first"], 0) // cycle
    first = schedule["skip_first"] + index * cycle + schedule["wait"] + schedule["warmup"]
    return min(first, last), last


def trace_path(save_path: str, step: int, role: str, rank: int, suffix: str = "") -> str:
    return os.path.join(os.path.expanduser(save_path), f"step_{step}", f"{role}_rank{rank}{suffix}.pt.trace.json")


class _ProcessProfile:
    """torch.profiler records one profile per process; roles fused into one process (colocated
    workers, the in-process backend) share it: the first role to start opens it (its name, its schedule),
    the last to leave closes it. ``written``: the files of the windows saved so far."""

    profiler = None
    users = 0
    schedule: dict | None = None
    written: list[str] = []
    saved_at = 0  # mini-batches done when the last window was written

    @classmethod
    def join(cls, plan: ProfilerConfig, path_of, schedule: dict | None) -> None:
        """``path_of(suffix)``: the file of a window (suffix "" when unscheduled)."""
        if cls.profiler is None:
            cls.schedule, cls.written, cls.saved_at = schedule, [], 0

            def write(prof) -> None:
                suffix = ""
                if schedule is not None and prof.step_num > 0:
                    if prof.step_num == cls.saved_at:
                        return  # the end of recording right after a saved window: an empty one, not written
                    cls.saved_at = prof.step_num
                    first, last = window_of(schedule, prof.step_num)
                    suffix = f"_mb{first}" if first == last else f"_mb{first}-{last}"
                path = path_of(suffix)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                prof.export_chrome_trace(path)
                cls.written.append(path)

            kwargs = profiler_kwargs(_torch_section(plan).contents, torch.cuda.is_available())
            if schedule is not None:
                kwargs["schedule"] = torch.profiler.schedule(**schedule)
            cls.profiler = torch.profiler.profile(on_trace_ready=write, **kwargs)
            cls.profiler.record_steps = False  # a step() is a mini-batch here, not an RL step: no ProfilerStep rows
            cls.profiler.__enter__()
        cls.users += 1

    @classmethod
    def mini_batch_done(cls) -> None:
        if cls.profiler is not None and cls.schedule is not None:
            cls.profiler.step()

    @classmethod
    def leave(cls) -> list[str]:
        cls.users -= 1
        if cls.users > 0:
            return []
        profiler, cls.profiler = cls.profiler, None
        profiler.__exit__(None, None, None)  # writes the open window (or the whole unscheduled trace)
        written, cls.written, cls.schedule = cls.written, [], None
        return written


class WorkerProfiler:
    """A worker's torch.profiler recorder, held as a member. ``plan``: its roles' ``profiler`` sections
    merged (``merge_profilers``); ``role`` names the trace files; ``rank``: this worker's rank. The worker's
    registered ``start_profile`` / ``stop_profile`` delegate here; its stages run inside ``stage(name)``; its
    update loop calls ``mini_batch_done`` after each optimizer step."""

    def __init__(self, plan: ProfilerConfig, rank: int, role: str):
        self.plan, self.rank, self.role = plan, rank, role
        torch_cfg = _torch_section(plan)
        self.discrete = bool(torch_cfg.discrete)
        self.schedule = schedule_kwargs(torch_cfg.schedule, continuous=not self.discrete)
        self.recording = False
        self.step: int | None = None
        self._written: list[str] = []  # discrete: the stage files of this span
        self._open_stage: contextlib.ExitStack | None = None  # a stage held open across calls (generate)

    def _path_of(self, name: str):
        save_path = self.plan.save_path or DEFAULT_SAVE_PATH
        return lambda suffix: trace_path(save_path, int(self.step), name, self.rank, suffix)

    def start(self, profile_step: int) -> bool:
        """Start recording (on selected ranks); True where this rank records."""
        if not records(self.plan, self.rank):
            return False
        if self.recording:
            raise RuntimeError(f"start_profile(step {profile_step}) while this worker is still recording")
        self.step, self.recording, self._written = int(profile_step), True, []
        if not self.discrete:
            _ProcessProfile.join(self.plan, self._path_of(self.role), self.schedule)
        return True

    @contextlib.contextmanager
    def stage(self, name: str):
        """One stage of the worker (a named range of the trace; with ``discrete``, a trace of its own)."""
        if not self.recording:
            yield
            return
        if not self.discrete or _ProcessProfile.profiler is not None:  # (another role's stage is recording)
            with torch.profiler.record_function(name):
                yield
            return
        schedule = self.schedule if name in UPDATE_STAGES else None
        _ProcessProfile.join(self.plan, self._path_of(f"{self.role}_{name}"), schedule)
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            self._written += _ProcessProfile.leave()

    def open_stage(self, name: str) -> None:
        """Begin a stage that ends in a later call (``close_stage``, or the span's end): generation runs
        from prepare_rollout to release_rollout."""
        self.close_stage()
        if self.recording:
            self._open_stage = contextlib.ExitStack()
            self._open_stage.enter_context(self.stage(name))

    def close_stage(self) -> None:
        stack, self._open_stage = self._open_stage, None
        if stack is not None:
            stack.close()

    def mini_batch_done(self) -> None:
        """After each optimizer step of an update: advances the schedule, where one applies."""
        if self.recording:
            _ProcessProfile.mini_batch_done()

    def stop(self) -> list[str]:
        """Stop recording; the trace files this call wrote (none on ranks that do not record, and none
        where another role of the process still records into the shared continuous trace)."""
        if not self.recording:
            return []
        self.close_stage()
        self.recording = False
        if self.discrete:
            written, self._written = self._written, []
            return written
        return _ProcessProfile.leave()
