"""A role's ``profiler`` section (veRL's ProfilerConfig): which ranks of the role write traces, and with
which tool. hybridflow implements the torch tool; the others are refused when chosen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridflow.config.base import BaseConfig, doc, undeclared

__all__ = ["ProfilerConfig"]


@dataclass
class ProfilerConfig(BaseConfig):
    """``<role>.profiler``: the role's profiling switch; steps and the tool come from global_profiler."""

    _target_: str = doc("verl.utils.profiler.ProfilerConfig", "the class this section is read into")
    tool: Optional[str] = doc(None, "profiler tool (follows global_profiler.tool): torch, or null for none")
    enable: bool = doc(False, "profile this role")
    all_ranks: bool = doc(False, "profile every rank of the role (else only those in ranks)")
    ranks: list[int] = doc([], "the ranks to profile when all_ranks is false")
    save_path: Optional[str] = doc("outputs/profile", "directory of the traces (follows global_profiler.save_path)")
    relocate_results: bool = doc(False, "move the traces after the run (not implemented)")
    finish_hook_cmd: Optional[str] = doc(None, "a command run when profiling ends (not implemented)")
    finish_hook_all_ranks: bool = doc(False, "run finish_hook_cmd on every rank (not implemented)")
    finish_hook_ranks: list[int] = doc([], "ranks that run finish_hook_cmd (not implemented)")
    tool_config: dict = undeclared("per-tool settings: nsys, npu, torch (contents, discrete, schedule), ...")
