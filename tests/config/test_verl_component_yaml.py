"""A component of veRL's config tree, composed on its own as veRL's tests and users do
(``compose(config_name="dp_actor")`` under ``actor/``), reads into its config class with the defaults of
its place; keys of the whole tree it follows but does not hold take their defaults (veRL writes them as
``${oc.select:key,default}``). Inside a whole tree a missing interpolation target is still an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationKeyError

from hybridflow.config import ActorConfig, FSDPActorConfig, FSDPCriticConfig, omega_conf_to_dataclass

TREE_DIR = Path(__file__).resolve().parents[2] / "hybridflow" / "trainer" / "config"  # veRL's config tree


def composed(group: str, name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(TREE_DIR / group), version_base=None):
        return compose(config_name=name, overrides=overrides)


def test_dp_actor_yaml_composes_into_fsdp_actor_config():
    cfg = composed("actor", "dp_actor", ["ppo_micro_batch_size_per_gpu=4", "loss_agg_mode=seq-mean-token-mean"])
    actor = omega_conf_to_dataclass(cfg)
    assert type(actor) is FSDPActorConfig
    assert (actor.ppo_micro_batch_size_per_gpu, actor.loss_agg_mode) == (4, "seq-mean-token-mean")
    assert actor.optim.lr == 1e-6 and actor.optim.min_lr_ratio == 0.0  # the actor's place, not the class's 1e-3
    assert actor.rollout_n == 1 and actor.use_remove_padding is True  # followed keys: defaults at this place
    assert actor.checkpoint.load_contents == actor.checkpoint.save_contents  # a relative interpolation resolves


def test_actor_yaml_composes_into_actor_config():
    actor = omega_conf_to_dataclass(composed("actor", "actor", ["ppo_micro_batch_size_per_gpu=2"]))
    assert type(actor) is ActorConfig and actor.ppo_micro_batch_size_per_gpu == 2


def test_dp_critic_yaml_composes_into_fsdp_critic_config():
    critic = omega_conf_to_dataclass(composed("critic", "dp_critic", ["ppo_micro_batch_size_per_gpu=2"]))
    assert type(critic) is FSDPCriticConfig and critic.optim.lr == 1e-5


def test_a_missing_key_inside_a_whole_tree_still_fails():
    tree = OmegaConf.create({"actor": {"_target_": "verl.workers.config.FSDPActorConfig", "rollout_n": "${nope.n}"}})
    with pytest.raises(InterpolationKeyError):
        omega_conf_to_dataclass(tree.actor)
