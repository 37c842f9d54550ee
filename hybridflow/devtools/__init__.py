"""Tools users run to check that hybridflow is a drop-in for veRL.

- ``check_verl_examples``: compose every ``verl.trainer.main_ppo`` command line of a veRL
  ``examples/`` directory under ``hybridflow.main_ppo`` and report OK / refused / error
  (``shell_words`` reads the scripts, ``verl_reference`` asks veRL itself).
- ``verl_parity``: run every registered policy loss and advantage estimator against veRL's.

The generators of configs/, veRL's config tree and docs/config_keys.md are maintainers' tools: ``devtools/`` at
the top of the source checkout.
"""
