"""veRL's ``optim.override_optimizer_config``: keyword arguments of AdamW that replace or add to the section's
own, for the actor and critic engines and the SFT trainer; a name AdamW does not take is refused by key."""

from __future__ import annotations

import pytest
import torch

from hybridflow.config.convert import as_section
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.optimizer import FSDPOptimizerConfig
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.workers.engine import EngineSpec, TrainEngine
from tests.workers.actor.ppo_batch import tiny_causal_lm


def test_the_engine_builds_adamw_with_the_overrides():
    engine = TrainEngine(tiny_causal_lm(), EngineSpec(strategy="none", device="cpu"))
    optim = FSDPOptimizerConfig(lr=1e-3, betas=(0.9, 0.95), override_optimizer_config={"eps": 1e-5, "amsgrad": True})
    optimizer, _ = engine.setup_optimizer(optim, total_steps=10)
    group = optimizer.param_groups[0]
    assert group["eps"] == 1e-5 and group["amsgrad"] is True
    assert group["lr"] == 1e-3 and group["betas"] == (0.9, 0.95)  # the section's own values stay
    engine.module(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    assert all("max_exp_avg_sq" in s for s in optimizer.state.values())  # amsgrad's state: the option reached AdamW
    # an override of a section key wins over it, as in veRL's builder
    replaced = FSDPOptimizerConfig(lr=1e-3, override_optimizer_config={"lr": 5e-4, "betas": [0.8, 0.9]})
    group = TrainEngine(tiny_causal_lm(), EngineSpec(strategy="none", device="cpu")).setup_optimizer(replaced, 10)[0]
    assert group.param_groups[0]["lr"] == 5e-4 and group.param_groups[0]["betas"] == (0.8, 0.9)


def test_the_keys_load_and_an_unknown_argument_is_refused():
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.actor.optim.override_optimizer_config={eps:1e-6}"])
    assert cfg.actor_rollout_ref.actor.optim.override_optimizer_config == {"eps": 1e-6}
    sft = load_config("sft_trainer", ["optim.override_optimizer_config={fused:false}"])
    assert sft.optim.override_optimizer_config == {"fused": False}
    bad = load_config("ppo_trainer", ["critic.optim.override_optimizer_config={bf16_stochastic_round:true}"])
    with pytest.raises(ConfigError, match=r"override_optimizer_config has \['bf16_stochastic_round'\]"):
        as_section(bad, PPOTrainerConfig)  # the typed sections the run is built from
