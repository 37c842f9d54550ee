"""Simulated users for multi-turn rollouts (veRL's ``verl.interactions`` module paths).

``BaseInteraction`` (``base``) is the contract; interactions are configured by a veRL-format yaml
(``utils.interaction_registry``). Built in: ``gsm8k_interaction.Gsm8kInteraction``.
"""

from hybridflow.interactions.base import BaseInteraction

__all__ = ["BaseInteraction"]
