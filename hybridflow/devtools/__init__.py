"""Developer tools that keep hybridflow a drop-in for veRL (run from a source checkout).

- ``extract_verl_keys``: write the key list of a veRL config tree (the reference data under
  ``verl_keys/``, which the config tests compare our yaml against).
- ``config_table``: the markdown table of every config key and its status (docs/config_keys.md).
- ``check_verl_examples``: compose every ``verl.trainer.main_ppo`` command line of a veRL
  ``examples/`` directory under ``hybridflow.main_ppo`` and report OK / refused / error.
"""
