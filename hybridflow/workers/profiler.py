"""torch.profiler traces of training steps: veRL's ``global_profiler.tool=torch`` and role profiler keys.

The trainer brackets every step listed in ``global_profiler.steps`` with ``start_profile`` /
``stop_profile`` on each worker group (``profile_continuous_steps``: one trace for each run of
consecutive steps). A worker records when one of its roles has ``profiler.enable`` and its rank is
selected (``all_ranks``, or listed in ``ranks``), and writes one Chrome trace per profiled span and rank:
``<profiler.save_path>/step_<N>/<role>_rank<r>.pt.trace.json``. Perfetto (ui.perfetto.dev) opens the
file; TensorBoard's profiler plugin reads the step folder. ``tool_config.torch.contents`` adds what veRL
adds: ``cuda`` (CUDA kernels; on by default where CUDA exists), ``memory``, ``shapes``, ``stack``; CPU
activity is always recorded.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

import torch

from hybridflow.config.profiler import TORCH_CONTENTS, ProfilerConfig, ProfilerToolConfig, TorchProfilerToolConfig

__all__ = ["CONTENTS", "merge_profilers", "records", "profiler_kwargs", "trace_path", "WorkerProfiler"]

CONTENTS = TORCH_CONTENTS
DEFAULT_SAVE_PATH = ProfilerConfig().save_path


def _torch_contents(section: ProfilerConfig) -> list[str]:
    torch_cfg = section.tool_config.torch if section.tool_config is not None else None
    return list(torch_cfg.contents) if torch_cfg is not None else []


def merge_profilers(sections: Sequence[ProfilerConfig | None]) -> ProfilerConfig:
    """The role profilers of one worker (a fused actor+rollout+ref worker has several) as one plan: on when
    any role is on; ranks and torch contents united; the first enabled role's save path."""
    enabled = [s for s in sections if s is not None and s.enable]  # a section left unset (None) is off
    if not enabled:
        return ProfilerConfig()
    contents = sorted({c for s in enabled for c in _torch_contents(s)})
    return ProfilerConfig(
        tool="torch",
        enable=True,
        all_ranks=any(s.all_ranks for s in enabled),
        ranks=sorted({int(r) for s in enabled for r in s.ranks}),
        save_path=enabled[0].save_path or DEFAULT_SAVE_PATH,
        tool_config=ProfilerToolConfig(torch=TorchProfilerToolConfig(contents=contents)),
    )


def records(plan: ProfilerConfig, rank: int) -> bool:
    """Whether ``rank`` writes a trace under ``plan``."""
    return plan.enable and (plan.all_ranks or rank in plan.ranks)


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
    }


def trace_path(save_path: str, step: int, role: str, rank: int) -> str:
    return os.path.join(os.path.expanduser(save_path), f"step_{step}", f"{role}_rank{rank}.pt.trace.json")


class _ProcessProfile:
    """torch.profiler records one profile per process; roles fused into one process (colocated
    workers, the in-process backend) share it: the first role to start opens it, the last to stop
    writes it under the first role's name."""

    profiler = None
    users = 0
    path: str | None = None

    @classmethod
    def join(cls, plan: ProfilerConfig, step: int, role: str, rank: int) -> None:
        if cls.profiler is None:
            cls.profiler = torch.profiler.profile(**profiler_kwargs(_torch_contents(plan), torch.cuda.is_available()))
            cls.profiler.__enter__()
            cls.path = trace_path(plan.save_path or DEFAULT_SAVE_PATH, step, role, rank)
        cls.users += 1

    @classmethod
    def leave(cls) -> str | None:
        cls.users -= 1
        if cls.users > 0:
            return None
        profiler, path, cls.profiler, cls.path = cls.profiler, cls.path, None, None
        profiler.__exit__(None, None, None)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        profiler.export_chrome_trace(path)
        return path


class WorkerProfiler:
    """A worker's torch.profiler recorder, held as a member. ``plan``: its roles' ``profiler`` sections
    merged (``merge_profilers``); ``role`` names the trace file; ``rank``: this worker's rank. The worker's
    registered ``start_profile`` / ``stop_profile`` delegate here."""

    def __init__(self, plan: ProfilerConfig, rank: int, role: str):
        self.plan, self.rank, self.role = plan, rank, role
        self.recording = False

    def start(self, profile_step: int) -> bool:
        """Start recording (on selected ranks); True where this rank records."""
        if not records(self.plan, self.rank):
            return False
        if self.recording:
            raise RuntimeError(f"start_profile(step {profile_step}) while this worker is still recording")
        _ProcessProfile.join(self.plan, int(profile_step), self.role, self.rank)
        self.recording = True
        return True

    def stop(self) -> str | None:
        """Stop recording; the trace's path where this call wrote it (None elsewhere)."""
        if not self.recording:
            return None
        self.recording = False
        return _ProcessProfile.leave()
