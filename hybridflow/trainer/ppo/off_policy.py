"""Which finished groups a step may train: the off-policy bound of veRL's V1 sampler (``trainer.v1.sampler``),
one policy for every asynchronous schedule (the ``Rollouter`` asks it).

A model version is a weight sync: ``versions_per_cycle`` actor updates (V1 ``separate_async``:
``parameter_sync_step`` mini-batch updates; otherwise 1). A group's span counts the versions from the one
it started generating with to the one it is trained at, both included (veRL's
``global_steps - prompt_global_steps + 1``):

- ``drop``: a finished group whose span exceeds ``max_off_policy_threshold`` is evicted, and one new
  prompt replaces it;
- ``wait``: the trainer waits while a group still generating has reached the threshold, so that it is
  trained rather than dropped;
- threshold ``None``: no bound (only the start budget limits how far generation runs ahead).

``async_training.mode=fully_async``'s lag bound is ``wait`` with threshold ``staleness_bound + 1``.
A sampler of your own (``custom_sampler.path/name``) subclasses ``OffPolicySampler`` and overrides
``stale``, ``blocks`` or ``order``; it is built with the keyword arguments below plus ``sampler_kwargs``.
"""

from __future__ import annotations

import numpy as np

from hybridflow.utils.import_utils import load_class

STRATEGIES = ("drop", "wait")


class OffPolicySampler:
    def __init__(self, threshold: int | None, strategy: str = "wait", versions_per_cycle: int = 1, **kwargs):
        if threshold is not None and (isinstance(threshold, bool) or int(threshold) != threshold or threshold < 1):
            raise ValueError(
                f"trainer.v1.sampler.max_off_policy_threshold must be an integer >= 1 or null, got {threshold}"
            )
        if strategy not in STRATEGIES:
            raise ValueError(f"trainer.v1.sampler.max_off_policy_strategy={strategy!r} is not one of drop, wait")
        self.threshold, self.strategy, self.versions_per_cycle = threshold, strategy, int(versions_per_cycle)

    def span(self, started_version: int, actor_version: int) -> int:
        c = self.versions_per_cycle
        return actor_version // c - started_version // c + 1

    def stale(self, started_version: int, actor_version: int) -> bool:
        """A finished group to evict (``drop``)."""
        return (
            self.strategy == "drop"
            and self.threshold is not None
            and self.span(started_version, actor_version) > self.threshold
        )

    def blocks(self, started_version: int, actor_version: int) -> bool:
        """A group still generating that the trainer waits for (``wait``)."""
        return (
            self.strategy == "wait"
            and self.threshold is not None
            and self.span(started_version, actor_version) >= self.threshold
        )

    def order(self, ready: list) -> list:
        """The finished groups (``FinishedGroup``) in the order a step takes them: oldest weights first, then
        prompt order (so a group that made the trainer wait is trained at once)."""
        return sorted(ready, key=lambda g: (g.started_at_version, g.group.gen_index, g.group.position))


def build_sampler(settings, versions_per_cycle: int) -> OffPolicySampler:
    """``trainer.v1.sampler`` (a ``ReplaySamplerConfig``): the built-in sampler or the user's class."""
    cls = OffPolicySampler
    if settings.custom_sampler.path and settings.custom_sampler.name:
        reference = f"{settings.custom_sampler.path}:{settings.custom_sampler.name}"
        cls = load_class(reference, "trainer.v1.sampler.custom_sampler")
        if not (isinstance(cls, type) and issubclass(cls, OffPolicySampler)):
            raise TypeError(
                f"trainer.v1.sampler.custom_sampler {reference!r} must subclass {OffPolicySampler.__qualname__}"
            )
    threshold, strategy = settings.max_off_policy_threshold, settings.max_off_policy_strategy
    return cls(threshold, strategy, versions_per_cycle, **dict(settings.sampler_kwargs or {}))


def trajectory_version_metrics(batch, actor_version: int, versions_per_cycle: int = 1) -> dict[str, float]:
    """veRL's ``training/off_policy/*``: versions a trajectory's tokens span (1: one version), and how
    far it lags the trainer's weights by its newest (``trajectory_staleness``) and oldest tokens (``_worst``)."""
    low, high = (batch.non_tensor_batch.get(f"{k}_weight_version") for k in ("min", "max"))
    if low is None or high is None or any(v is None for v in (*low, *high)):
        return {}
    c, now = versions_per_cycle, actor_version // versions_per_cycle
    low, high = np.asarray(low, dtype=np.int64) // c, np.asarray(high, dtype=np.int64) // c
    out = {}
    for name, values in (
        ("trajectory_spans", high - low + 1),
        ("trajectory_staleness", now - high),
        ("trajectory_staleness_worst", now - low),
    ):
        for stat in ("mean", "max", "min"):
            out[f"training/off_policy/{name}/{stat}"] = float(getattr(values, stat)())
    return out
