"""The actor and the critic take their typed section, as veRL's do (``DataParallelPPOActor(config=
FSDPActorConfig(...), actor_module=..., actor_optimizer=...)``); a DictConfig or dict is read into one at
the boundary (veRL users pass the ``actor_rollout_ref.actor`` node)."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.config import (
    ConfigError,
    CriticModelConfig,
    FSDPActorConfig,
    FSDPCriticConfig,
    FSDPOptimizerConfig,
    PolicyLossConfig,
)
from hybridflow.config.base import part_of_tree
from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.critic import DataParallelPPOCritic
from tests.workers.actor.ppo_batch import actor_config, flat_params, ppo_batch, tiny_causal_lm, tiny_value_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

LR = 0.5
CLIP = 1e-3  # far below the gradient norm: every step is clipped to it


def _typed_actor(**changes) -> FSDPActorConfig:
    return FSDPActorConfig(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=4,
        use_remove_padding=False,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        optim=FSDPOptimizerConfig(clip_grad=CLIP),
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
        **changes,
    )


def test_verl_style_construction_with_a_typed_section():
    base = tiny_causal_lm()
    data = ppo_batch(base)
    config = _typed_actor()
    model = copy.deepcopy(base)
    actor = DataParallelPPOActor(
        config=config, actor_module=model, actor_optimizer=torch.optim.SGD(model.parameters(), lr=LR)
    )
    assert actor.config is config  # used as it is, not re-read
    before = flat_params(model)
    metrics = actor.update_policy(data)
    assert sorted(k for k in metrics if k.startswith("actor/kl")) == ["actor/kl_coef", "actor/kl_loss"]
    assert metrics["actor/kl_coef"] == [0.1]
    # one SGD step of a gradient clipped to norm CLIP (optim.clip_grad, veRL 0.9.1's place) moves the
    # parameters by exactly LR * CLIP
    assert metrics["actor/grad_norm"][0] > 100 * CLIP
    assert (flat_params(model) - before).norm().item() == pytest.approx(LR * CLIP, rel=1e-3)


@pytest.mark.parametrize("form", ["dict", "DictConfig"])
def test_a_mapping_is_read_into_the_typed_section(form):
    base = tiny_causal_lm()
    data = ppo_batch(base)
    section = actor_config(
        ppo_micro_batch_size_per_gpu=4, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1, grad_clip=CLIP
    )
    if form == "DictConfig":
        section = OmegaConf.create(section)
    results = []
    for config in (section, _typed_actor()):
        model = copy.deepcopy(base)
        actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=LR))
        assert isinstance(actor.config, FSDPActorConfig)
        actor.update_policy(data)
        results.append(flat_params(model))
    assert (results[0] - flat_params(base)).norm().item() == pytest.approx(LR * CLIP, rel=1e-3)
    torch.testing.assert_close(results[0], results[1], atol=1e-7, rtol=0)


def test_a_mapping_with_a_typo_names_the_key():
    section = OmegaConf.create(actor_config(ppo_mini_batchsize=8))
    with pytest.raises(
        ConfigError,
        match="actor_rollout_ref.actor.ppo_mini_batchsize is not a key of FSDPActorConfig; "
        "did you mean ppo_mini_batch_size",
    ):
        DataParallelPPOActor(section, tiny_causal_lm())
    with pytest.raises(TypeError, match="ActorConfig"):
        DataParallelPPOActor(42, tiny_causal_lm())


def test_an_actor_without_optimizer_needs_no_update_schedule():
    """The reference policy: log-probs only, so no micro-batch size is needed; an update is refused."""
    model = tiny_causal_lm()
    data = ppo_batch(model)
    with part_of_tree():  # a section of a config tree: ppo_micro_batch_size_per_gpu may stay null
        unset, ref_section = FSDPActorConfig(), FSDPActorConfig(use_remove_padding=False)
    ref = DataParallelPPOActor(ref_section, model)
    data.meta_info.update(temperature=1.0, micro_batch_size=3)
    log_probs, _ = ref.compute_log_prob(data)
    assert log_probs.shape == data.batch["responses"].shape
    with pytest.raises(RuntimeError, match="needs an optimizer"):
        ref.update_policy(data)
    with pytest.raises(
        ValueError,
        match="set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, or "
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
    ):
        DataParallelPPOActor(unset, model, torch.optim.SGD(model.parameters(), lr=LR))


def test_verl_style_critic_with_a_typed_section():
    model = tiny_value_model()
    data = ppo_batch(tiny_causal_lm())
    config = FSDPCriticConfig(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=2,
        forward_micro_batch_size_per_gpu=3,
        cliprange_value=10.0,
        optim=FSDPOptimizerConfig(clip_grad=0.0),
        model=CriticModelConfig(use_remove_padding=False),
    )
    critic = DataParallelPPOCritic(
        config=config, critic_module=model, critic_optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    assert critic.config is config and critic.forward_micro_batch_size == 3
    data.batch["values"] = critic.compute_values(data)
    data.batch["returns"] = data.batch["values"] + torch.linspace(-1, 1, data.batch["values"].numel()).reshape(
        data.batch["values"].shape
    )
    metrics = critic.update_critic(data)
    # before the step the predictions are the values: vf_loss = 0.5 * token-mean (values - returns)^2
    mask = data.batch["response_mask"].float()
    expected = 0.5 * (((data.batch["values"] - data.batch["returns"]) ** 2) * mask).sum() / mask.sum()
    assert metrics["critic/vf_loss"][0] == pytest.approx(expected.item(), rel=1e-5)

    # the same section as a DictConfig (critic.model.use_remove_padding in its place)
    plain = DataParallelPPOCritic(
        OmegaConf.create(
            {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2, "model": {"use_remove_padding": True}}
        ),
        model,
    )
    assert isinstance(plain.config, FSDPCriticConfig) and plain.use_remove_padding
    assert plain.forward_micro_batch_size == 2  # falls back to the update's micro-batch
