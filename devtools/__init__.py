"""Tools that only maintainers run, from a source checkout (not installed with the package).

- ``config_yaml``: configs/*.yaml from the typed sections of hybridflow/config/
  (``python -m devtools.config_yaml [--check]``);
- ``config_tree``: veRL's component tree under hybridflow/trainer/config/ from configs/ppo_trainer.yaml;
- ``config_table``: docs/config_keys.md, every key and its status, against veRL's key lists (``verl_keys/``);
- ``extract_verl_keys``: write the key list of a veRL config tree into ``verl_keys/``.

What users run stays in the package: ``python -m hybridflow.devtools.check_verl_examples`` and
``python -m hybridflow.devtools.verl_parity``.
"""
