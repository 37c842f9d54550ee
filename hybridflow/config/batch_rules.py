"""The batch-size rules of the sections that cut a batch (actor, critic, ref; the rollout's and the reward
model's log-prob / score passes): how a global size becomes a per-rank one, and the checks that it splits
evenly. Pure functions over values; every message names the full keys (``path`` is where the section sits).

Sizes: ``ppo_mini_batch_size`` counts prompts for the whole job (x rollout.n samples, split over the
data-parallel ranks); ``*_micro_batch_size`` (deprecated) is global, ``*_micro_batch_size_per_gpu``
per rank; with dynamic batch size a token budget per rank replaces the micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.errors import ConfigError

__all__ = [
    "Problems",
    "data_parallel_size",
    "per_rank_micro_batch",
    "check_token_budget",
    "check_update_batches",
    "check_sp_needs_remove_padding",
    "per_rank_mini_batch",
]


@dataclass
class Problems:
    """Errors and notes collected over several rules, so that one check reports every problem at once."""

    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def raise_errors(self) -> list[str]:
        """ConfigError with one error per line when there are any; else the notes."""
        if self.errors:
            raise ConfigError("\n".join(self.errors))
        return self.notes


def _positive(p: Problems, key: str, value) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        p.errors.append(f"{key} must be a positive integer, got {value!r}")
        return None
    return value


def data_parallel_size(p: Problems, path: str, world: int, sp: int) -> int | None:
    """World size / the section's Ulysses size (the ranks of an SP group share one data-parallel slot)."""
    if world % sp:
        p.errors.append(f"world size {world} is not divisible by {path}.ulysses_sequence_parallel_size ({sp})")
        return None
    return world // sp


def per_rank_mini_batch(path: str, mini: int, n: int, dp: int) -> int:
    """veRL's normalisation of ``ppo_mini_batch_size``: prompts for the job -> samples per rank."""
    samples = mini * n
    if samples % dp:
        raise ConfigError(
            f"{path}.ppo_mini_batch_size ({mini}) * rollout.n ({n}) = {samples} samples per optimizer "
            f"step do not split evenly over {dp} data-parallel ranks"
        )
    return samples // dp


def per_rank_micro_batch(
    p: Problems,
    path: str,
    name: str,
    total: int | None,
    per_gpu: int | None,
    dp: int,
    world: int | None = None,
    sp: int = 1,
) -> int | None:
    """The per-rank micro-batch size from the pair ``name`` (deprecated, global) / ``name_per_gpu``.
    ``world``: the number of devices, for veRL's message when the global size is below it."""
    if total is None and per_gpu is None:
        p.errors.append(f"set {path}.{name}_per_gpu (samples per forward pass on one device); it is null")
        return None
    if total is not None and per_gpu is not None:
        p.errors.append(
            f"{path}.{name} ({total}) and {path}.{name}_per_gpu ({per_gpu}) are both set; "
            f"set only {name}_per_gpu ({name} is deprecated)"
        )
        return None
    if per_gpu is not None:
        return _positive(p, f"{path}.{name}_per_gpu", per_gpu)
    if _positive(p, f"{path}.{name}", total) is None:
        return None
    p.notes.append(f"{path}.{name} is deprecated: set {path}.{name}_per_gpu = {name} / data-parallel size")
    if total < dp and world is not None:  # veRL's rule, in its words
        p.errors.append(
            f"{path}.{name} ({total}) x ulysses_sequence_parallel_size ({sp}) must be >= the number of "
            f"devices ({world})"
        )
        return None
    if total % dp:
        p.errors.append(f"{path}.{name} ({total}) is not divisible by the data-parallel size ({dp})")
        return None
    return total // dp


def check_token_budget(p: Problems, path: str, key: str, budget: int, sp: int, longest: int | None) -> None:
    """With dynamic batch size one sequence must still fit in the per-device token budget times the SP
    size (an SP group shares each sequence). ``longest``: data.max_prompt_length + data.max_response_length."""
    if _positive(p, f"{path}.{key}", budget) is None or not longest:
        return
    if budget * sp < longest:
        p.errors.append(
            f"{path}.{key} ({budget}) * ulysses_sequence_parallel_size ({sp}) is smaller than one "
            f"sequence: data.max_prompt_length + data.max_response_length = {longest}"
        )


def check_update_batches(
    p: Problems,
    path: str,
    *,
    mini: int,
    micro: int | None,
    micro_per_gpu: int | None,
    dynamic: bool,
    max_token_len: int,
    n: int,
    world: int,
    sp: int,
    train_batch_size: int | None,
    longest: int | None,
) -> None:
    """Mini-batches (one optimizer step each) and micro-batches (one forward/backward each) of an
    actor or critic update."""
    dp = data_parallel_size(p, path, world, sp)
    if dp is None or _positive(p, f"{path}.ppo_mini_batch_size", mini) is None:
        return
    if train_batch_size is not None:
        if train_batch_size < mini:
            p.errors.append(
                f"data.train_batch_size ({train_batch_size}) must be >= {path}.ppo_mini_batch_size ({mini})"
            )
        elif train_batch_size % mini:
            p.notes.append(
                f"data.train_batch_size ({train_batch_size}) is not a multiple of {path}.ppo_mini_batch_size "
                f"({mini}): the last mini-batch of every step has {train_batch_size % mini} prompts"
            )
    try:
        per_rank = per_rank_mini_batch(path, mini, n, dp)
    except ConfigError as e:
        p.errors.append(str(e))
        return
    if dynamic:
        check_token_budget(p, path, "ppo_max_token_len_per_gpu", max_token_len, sp, longest)
        return
    per_gpu = per_rank_micro_batch(p, path, "ppo_micro_batch_size", micro, micro_per_gpu, dp, world, sp)
    if per_gpu and per_rank % per_gpu:
        p.errors.append(
            f"{path}.ppo_mini_batch_size ({mini}) * rollout.n ({n}) / {dp} data-parallel ranks = {per_rank} "
            f"samples per rank is not divisible by {path}.ppo_micro_batch_size_per_gpu ({per_gpu})"
        )


def check_sp_needs_remove_padding(p: Problems, path: str, sp: int, model_path: str, remove_padding: bool) -> None:
    """Ulysses sequence parallelism slices packed sequences: it needs the padding-free forward."""
    if sp > 1 and not remove_padding:
        p.errors.append(f"{path}.ulysses_sequence_parallel_size={sp} needs {model_path}.use_remove_padding=True")
