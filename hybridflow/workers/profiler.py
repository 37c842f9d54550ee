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
from dataclasses import dataclass

import torch

from hybridflow.single_controller.base import Dispatch, register

CONTENTS = ("cuda", "memory", "shapes", "stack", "cpu")


@dataclass(frozen=True)
class ProfileSettings:
    enable: bool = False
    all_ranks: bool = False
    ranks: tuple[int, ...] = ()
    save_path: str = "outputs/profile"
    contents: frozenset[str] = frozenset()

    @classmethod
    def from_sections(cls, sections: list[dict]) -> "ProfileSettings":
        """The role ``profiler`` sections of one worker (a fused actor+rollout+ref worker has several)
        as one setting: on when any role is on; ranks, contents united; the first enabled save path."""
        enabled = [s for s in sections if s and s.get("enable")]
        if not enabled:
            return cls()
        contents: set[str] = set()
        for section in enabled:
            torch_cfg = ((section.get("tool_config") or {}).get("torch") or {})
            unknown = set(torch_cfg.get("contents") or ()) - set(CONTENTS)
            if unknown:
                raise ValueError(f"profiler.tool_config.torch.contents: unknown entries {sorted(unknown)}; "
                                 f"choose from {list(CONTENTS)}")
            contents |= set(torch_cfg.get("contents") or ())
        return cls(enable=True, all_ranks=any(bool(s.get("all_ranks")) for s in enabled),
                   ranks=tuple(sorted({int(r) for s in enabled for r in (s.get("ranks") or ())})),
                   save_path=str(enabled[0].get("save_path") or cls.save_path), contents=frozenset(contents))

    def selects(self, rank: int) -> bool:
        return self.enable and (self.all_ranks or rank in self.ranks)


def profiler_kwargs(contents: frozenset[str], cuda_available: bool) -> dict:
    """``torch.profiler.profile`` arguments for veRL's ``contents`` list (empty: CPU + CUDA where present)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda_available and (not contents or "cuda" in contents):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return {"activities": activities, "with_stack": "stack" in contents, "record_shapes": "shapes" in contents,
            "profile_memory": "memory" in contents}


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
    def join(cls, settings: ProfileSettings, step: int, role: str, rank: int) -> None:
        if cls.profiler is None:
            cls.profiler = torch.profiler.profile(**profiler_kwargs(settings.contents, torch.cuda.is_available()))
            cls.profiler.__enter__()
            cls.path = trace_path(settings.save_path, step, role, rank)
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


class ProfilerHost:
    """Mixed into role workers. Needs from the host: ``rank``, ``role`` (names the file) and
    ``_profiler_sections()`` (its roles' ``profiler`` config sections)."""

    _recording = False

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, profile_step: int) -> bool:
        """Start recording (on selected ranks); True where this rank records."""
        settings = ProfileSettings.from_sections(self._profiler_sections())
        if not settings.selects(self.rank):
            return False
        if self._recording:
            raise RuntimeError(f"start_profile(step {profile_step}) while this worker is still recording")
        _ProcessProfile.join(settings, int(profile_step), str(getattr(self, "role", "worker")), self.rank)
        self._recording = True
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> str | None:
        """Stop recording; the trace's path where this call wrote it (None elsewhere)."""
        if not self._recording:
            return None
        self._recording = False
        return _ProcessProfile.leave()
