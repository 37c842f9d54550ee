"""The status of every config key, derived from the declarations (``hybridflow.config.key_table``)
and read by ``hybridflow.config.loader`` whenever a config is loaded.

A key's status is written where the key is declared, with its type, default and doc
(``hybridflow/config/*.py``; statuses in ``hybridflow.config.status``):

- honoured: nothing to write (``doc(0, "...")``). ``values=(...)`` narrows an honoured key to the
  values hybridflow implements, ``reason=`` says what it does (``doc("hf", "...", values=("hf",
  "vllm"), reason="...")``); any other value is refused as not supported.
- not supported: ``doc(-1, "...", refused="why")``: accepted at its default, refused by name with the
  reason as soon as it is set to anything else.
- accepted with note: ``doc(False, "...", note="why")``: settings that only change speed or memory
  on hardware or engines hybridflow does not use; a non-default value prints a note.
- a whole section: ``section(Cls, "...", refused="why")`` gives every key below it that status
  (whatever ``Cls`` declares), and ``+`` keys added below it too.
- a status at one place: a class used at several places (the rollout under
  ``actor_rollout_ref.rollout``, ``reward.reward_model.rollout`` and main_generation's ``rollout``)
  declares the status of its usual place; the ``section(...)`` of another place names the
  differences there, once: ``keys={"log_prob_micro_batch_size": noted("no log-probs are computed
  here")}``. ``keys=`` also holds patterns for keys users add with ``+`` (``"megatron.**"``).
- alias: an earlier veRL spelling (``aliases.py``), mapped onto its canonical key at load time.

Flipping a status when a feature lands is a one-line change at the key's declaration, e.g. in
hybridflow/config/trainer.py::

    val_only: bool = doc(False, "...", refused="a validation-only run is not implemented")
    ->  val_only: bool = doc(False, "...")

then regenerate docs/config_keys.md (``python -m devtools.config_table``; the tests say
when it is stale). A value restriction is flipped by editing ``values=``.
"""

from __future__ import annotations

from hybridflow.config.evaluation import EvaluationConfig
from hybridflow.config.generation import GenerationConfig
from hybridflow.config.key_table import derive_table
from hybridflow.config.keys import aliases
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.config.reasons import TARGET
from hybridflow.config.sft_trainer import SFTTrainerConfig
from hybridflow.config.status import refused
from hybridflow.config.support import KeyTable
from hybridflow.config.tree import value_kinds

__all__ = ["TABLES", "ROOT_KEYS", "ROOTS", "KINDS"]

# statuses of the whole tree: a _target_ key (any depth) names one of veRL's classes
ROOT_KEYS = {"**._target_": refused(TARGET)}

# the declaration each config file is generated from
ROOTS = {
    "ppo_trainer": PPOTrainerConfig(),
    "generation": GenerationConfig(),
    "evaluation": EvaluationConfig(),
    "sft_trainer": SFTTrainerConfig(),
}

TABLES: dict[str, KeyTable] = {
    "ppo_trainer": derive_table("ppo_trainer", ROOTS["ppo_trainer"], ROOT_KEYS, aliases.PPO_TRAINER),
    "generation": derive_table("generation", ROOTS["generation"], ROOT_KEYS, aliases.GENERATION),
    "evaluation": derive_table("evaluation", ROOTS["evaluation"], {}, aliases.EVALUATION),
    "sft_trainer": derive_table("sft_trainer", ROOTS["sft_trainer"], ROOT_KEYS, aliases.SFT_TRAINER),
}

# the kinds of value each key's declared type allows (the loader checks overrides against them)
KINDS: dict[str, dict[str, tuple[str, ...]]] = {name: value_kinds(root) for name, root in ROOTS.items()}
