"""The status of every config key: one module per config (ppo_trainer, generation, evaluation,
sft_trainer), read by ``hybridflow.config.loader`` whenever a config is loaded.

Statuses (``hybridflow.config.support``):

- honoured: hybridflow reads the key and does what veRL does with it. ``values=(...)`` narrows an
  honoured key to the values hybridflow implements; any other value is refused as not supported.
- not supported: accepted at its default (so every veRL key composes), refused by name, with the
  reason, as soon as it is set to anything else.
- accepted with note: settings that only change speed or memory on hardware or engines hybridflow
  does not use (fused CUDA kernels, NCCL timeouts, loader processes, ...); results are the same. Set
  to a non-default value, they print a note saying so.
- alias: an earlier veRL spelling (``ALIASES``), mapped onto its canonical key at load time.

A key of the yaml without a rule is an error (the config-key tests fail, and so does loading), so a
new key needs a line here. The table in docs/config_keys.md is generated from these modules
(``python -m hybridflow.devtools.config_table``; the tests say when it is stale).

Flipping a status when a feature lands is a one-line change: move the key's pattern from its
``not_supported(...)`` line to an ``honoured(...)`` line (or change that line's function name when
the whole group is now implemented), e.g. in ppo_trainer.py::

    everything_under("algorithm.filter_groups", "dynamic sampling ... is not implemented yet"),
    ->  honoured("algorithm.filter_groups.**"),

and regenerate docs/config_keys.md. A value restriction is flipped by editing ``values=``
(``honoured(f"{p}.mode", values=("sync", "async"))``).
"""

from __future__ import annotations

from hybridflow.config.keys import evaluation, generation, ppo_trainer, sft_trainer
from hybridflow.config.support import KeyTable

TABLES: dict[str, KeyTable] = {
    "ppo_trainer": ppo_trainer.TABLE,
    "generation": generation.TABLE,
    "evaluation": evaluation.TABLE,
    "sft_trainer": sft_trainer.TABLE,
}

__all__ = ["TABLES"]
