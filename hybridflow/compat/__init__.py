"""veRL's import paths, served at the edge: ``hybridflow.workers.config``, ``hybridflow.utils.reward_score``,
``hybridflow.trainer.ppo.core_algos``, ... exist only so that code written against veRL keeps working after
switching ``verl`` for ``hybridflow``. They are one table (``paths``), served by an import hook (``finder``)
that ``import hybridflow`` installs; no file of the core holds them and the core never imports through them.
"""
