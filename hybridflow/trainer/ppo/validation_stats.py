"""Statistics of validation with several responses per prompt (veRL's ``process_validation_metrics``).

For each data source and each per-sample variable (the reward, and whatever the scorer returned
beside it: ``acc``, ``pred``, ...) and each prompt: the mean and std over the prompt's N responses,
and for subset sizes k = 2, 4, 8, ..., N the expected best / worst value among k responses and the
value of the majority answer among k (when the scorer returns ``pred``), estimated by bootstrap
(1000 draws of k responses with replacement). The numbers are then averaged over prompts.

The draws are those of numpy's legacy generator seeded with ``seed`` (as veRL's ``np.random.seed``),
taken from a private ``RandomState`` so the global numpy state is left alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from numbers import Real
from typing import Any

import numpy as np

__all__ = ["bootstrap_metric", "calc_maj_val", "process_validation_metrics", "subset_sizes"]

N_BOOTSTRAP = 1000


def _bootstrap_indices(n_data: int, subset_size: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """(n_bootstrap, subset_size) indices drawn with replacement; the same draws for the same arguments."""
    return np.random.RandomState(seed).choice(n_data, size=(n_bootstrap, subset_size), replace=True)


def _object_array(data: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(data), dtype=object)  # one object per item, even for dicts or lists
    arr[:] = list(data)
    return arr


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """(mean, std) over ``n_bootstrap`` random subsets of ``subset_size`` items (with replacement) of
    each ``reduce_fn(subset)``; every function sees the same subsets."""
    if len(data) == 0:
        raise ValueError("bootstrap_metric needs at least one data point")
    items = _object_array(data)
    indices = _bootstrap_indices(len(items), subset_size, n_bootstrap, seed)
    out = []
    for fn in reduce_fns:
        results = np.asarray([fn(items[row]) for row in indices], dtype=np.float64)
        out.append((float(results.mean()), float(results.std())))
    return out


def calc_maj_val(data: Sequence[dict], vote_key: str, val_key: str) -> Any:
    """``val_key`` of the first item voting for the most common ``vote_key`` (ties: the answer seen first)."""
    votes: dict[Any, list] = {}
    for item in data:
        votes.setdefault(item[vote_key], []).append(item[val_key])
    winner = max(votes, key=lambda vote: len(votes[vote]))  # max keeps the first of equal counts
    return votes[winner][0]


def _majority_values(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``calc_maj_val`` for every row at once. codes, values: (B, k) answer ids and values.

    The winner is the answer with most votes, ties going to the one seen first; its first occurrence
    is the first position whose answer count equals the row's largest count."""
    counts = (codes[:, :, None] == codes[:, None, :]).sum(-1)  # (B, k) votes for each position's answer
    first = (counts == counts.max(axis=1, keepdims=True)).argmax(axis=1)  # (B,)
    return values[np.arange(len(values)), first]


def subset_sizes(n: int) -> list[int]:
    """k = 2, 4, 8, ... below n, then n itself (nothing for a single response)."""
    if n <= 1:
        return []
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n]


def _is_number(value: Any) -> bool:
    return isinstance(value, (Real, np.number)) and not isinstance(value, str)


def _prompt_stats(values: list, preds: list | None, seed: int, cache: dict) -> dict[str, float]:
    """mean@N, std@N, best@k/*, worst@k/*, maj@k/* of one prompt's N values."""
    n = len(values)
    vals = np.asarray(values, dtype=np.float64)
    stats = {f"mean@{n}": float(vals.mean())}
    if n == 1:
        return stats
    stats[f"std@{n}"] = float(vals.std())
    codes = None
    if preds is not None:
        ids: dict = {}
        codes = np.asarray([ids.setdefault(p, len(ids)) for p in preds])
    for k in subset_sizes(n):
        if (n, k) not in cache:
            cache[(n, k)] = _bootstrap_indices(n, k, N_BOOTSTRAP, seed)
        idx = cache[(n, k)]  # (1000, k)
        draws = vals[idx]
        for name, picked in (("best", draws.max(axis=1)), ("worst", draws.min(axis=1))):
            stats[f"{name}@{k}/mean"], stats[f"{name}@{k}/std"] = float(picked.mean()), float(picked.std())
        if codes is not None:
            maj = _majority_values(codes[idx], draws)
            stats[f"maj@{k}/mean"], stats[f"maj@{k}/std"] = float(maj.mean()), float(maj.std())
    return stats


def _fill_failed_sessions(groups: dict, expected_acc_counts: dict) -> None:
    """Sources that report ``acc``: sessions that never produced a result count as acc 0;
    ``acc_success_only`` keeps the mean over the sessions that did."""
    acc_sources = {
        src
        for src, by_uid in groups.items()
        if any(v is not None for var2vals in by_uid.values() for v in var2vals.get("acc", []))
    }
    for (source, uid), expected in expected_acc_counts.items():
        if source not in acc_sources:
            continue
        var2vals = groups[source][uid]
        observed = [v for v in var2vals.get("acc", []) if v is not None]
        var2vals["acc_success_only"] = observed
        var2vals["acc"] = observed + [0.0] * max(expected - len(observed), 0)


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Any],
    infos_dict: dict[str, Sequence[Any]],
    seed: int = 42,
    expected_acc_counts: dict[tuple[str, Any], int] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {variable: {metric: value}}}`` averaged over prompts (one ``uid`` per prompt).

    ``infos_dict`` maps each variable to one value per sample (aligned with ``data_sources`` and
    ``sample_uids``). None values are left out; variables that are not numbers (a ``pred`` string)
    get no statistics, but ``pred`` drives the majority vote of the numeric ones. Metrics: mean@N,
    std@N, best@k/{mean,std}, worst@k/{mean,std}, maj@k/{mean,std} (see ``subset_sizes``).
    """
    n_samples = len(data_sources)
    for key, values in [("sample_uids", sample_uids), *infos_dict.items()]:
        if len(values) != n_samples:
            raise ValueError(f"process_validation_metrics: {key} has {len(values)} values for {n_samples} samples")
    groups: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # source -> uid -> var -> values
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        for var, values in infos_dict.items():
            groups[source][uid][var].append(values[i])
    if expected_acc_counts:
        _fill_failed_sessions(groups, expected_acc_counts)

    cache: dict = {}
    per_prompt: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # source -> var -> metric -> [..]
    for source, by_uid in groups.items():
        for var2vals in by_uid.values():
            preds = var2vals.get("pred")
            for var, raw in var2vals.items():
                values = [v for v in raw if v is not None]
                if not values or not all(_is_number(v) for v in values):
                    continue
                usable_preds = (
                    preds
                    if (preds is not None and len(preds) == len(values) and all(p is not None for p in preds))
                    else None
                )
                for name, value in _prompt_stats(values, usable_preds, seed, cache).items():
                    per_prompt[source][var][name].append(value)
    return {
        source: {
            var: {name: float(np.mean(vals)) for name, vals in metrics.items()} for var, metrics in var2metrics.items()
        }
        for source, var2metrics in per_prompt.items()
    }
