"""Which training steps ``global_profiler`` records (veRL's keys): pure helpers for the trainer's loop."""

from __future__ import annotations


def profiled_steps(global_profiler) -> tuple[frozenset[int], bool]:
    """(steps to record, one trace per run of consecutive steps); nothing unless ``tool=torch``."""
    if global_profiler is None or global_profiler.get("tool") != "torch" or not global_profiler.get("steps"):
        return frozenset(), False
    return frozenset(int(s) for s in global_profiler["steps"]), bool(global_profiler.get("profile_continuous_steps"))


def profile_span(step: int, steps: frozenset[int], continuous: bool) -> tuple[bool, bool]:
    """(start recording before ``step``, stop and write after it). Continuous: a run of consecutive
    listed steps is one span, named by its first step."""
    if step not in steps:
        return False, False
    if not continuous:
        return True, True
    return step - 1 not in steps, step + 1 not in steps
