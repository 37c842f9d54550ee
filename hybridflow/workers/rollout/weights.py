"""Moving weights from the trainer into a rollout engine: buckets, names, and a strict loader.

The trainer yields its full (unsharded) tensors one at a time; ``buckets`` groups them into lists of
about ``bucket_bytes`` so the engine receives a few large messages instead of hundreds of small ones,
while no rank ever holds more than one bucket beyond its own shard. ``StrictWeightLoader`` copies
buckets into a torch module in place and, once the update is finished, checks that every tensor of the
module was given (a renamed or missing parameter fails loudly instead of leaving stale weights).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import torch

from hybridflow.utils.param_names import strip_wrapper_prefixes


def buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream of (name, tensor) into lists of at most ``bucket_bytes`` (a larger tensor goes
    alone in its own bucket). The stream is consumed lazily: one bucket is materialised at a time."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    bucket, size = [], 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class StrictWeightLoader:
    """Load buckets of full tensors into ``module`` in place; ``finish()`` checks nothing was missed.

    Tied weights (lm_head sharing the embedding) count as loaded when either name was given.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self._loaded: set[int] = set()
        self.count = 0

    @torch.no_grad()
    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        targets = self.module.state_dict(keep_vars=True)  # name -> Parameter/buffer, tied aliases included
        n = 0
        try:
            for name, tensor in named_tensors:
                key = _resolve(name, targets)
                target = targets[key]
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"weight update: shape mismatch for {name!r}: model {tuple(target.shape)}, "
                        f"given {tuple(tensor.shape)}"
                    )
                target.copy_(tensor)
                self._loaded.add(target.data_ptr())
                n += 1
        except Exception:
            self._loaded, self.count = set(), 0  # a failed update is abandoned; the next one starts afresh
            raise
        self.count += n
        return n

    def finish(self) -> int:
        """End of one update: raise if some tensor of the module received nothing; returns the count."""
        targets = self.module.state_dict(keep_vars=True)
        missing = [k for k, t in targets.items() if t.data_ptr() not in self._loaded]
        count, self._loaded, self.count = self.count, set(), 0
        if missing:
            raise KeyError(
                f"weight update gave no tensor for {len(missing)} entries of the rollout model, e.g. {missing[:5]}"
            )
        return count


def _resolve(name: str, targets: Mapping[str, torch.Tensor]) -> str:
    if name in targets:
        return name
    stripped = strip_wrapper_prefixes(name, peft=True)
    if stripped in targets:
        return stripped
    raise KeyError(f"weight update: {name!r} is not a tensor of the rollout model")
