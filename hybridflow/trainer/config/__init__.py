"""veRL's config tree (``actor/dp_actor.yaml``, ``rollout/rollout.yaml``, ...), which a veRL config composes with
``hydra.searchpath: [pkg://hybridflow.trainer.config]``; generated from configs/ppo_trainer.yaml by
``python -m devtools.config_tree``. veRL's classes at this path (``AlgoConfig``, ...) are served by
``hybridflow.compat``."""
