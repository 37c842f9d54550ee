"""veRL's ``fsdp_config.model_dtype``: the weights a role loads and keeps. bf16 for the actor means bf16
weights, gradients and AdamW moments (no float32 masters, so no ``ComputeWeights`` casts), as veRL trains
them; the reference policy and the critic read their own key. In-process run on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import build_trainer, checked_config
from hybridflow.trainer.config_checks import validate_ppo_config
from hybridflow.utils.environ import restored_environ
from hybridflow.workers.engine import EngineSpec, TrainEngine
from tests.trainer.e2e_helpers import base_overrides
from tests.workers.actor.ppo_batch import tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_half_precision_weights_train_as_they_are_on_one_rank():
    spec = EngineSpec(strategy="fsdp", device="cpu", param_dtype=torch.bfloat16)
    assert TrainEngine(tiny_causal_lm(), spec).precision.casts  # float32 masters: bf16 copies to compute
    half = TrainEngine(tiny_causal_lm().to(torch.bfloat16), spec)
    assert not half.precision.casts  # the weights are the compute dtype already: nothing to cast or keep
    assert {p.dtype for p in half.module.parameters()} == {torch.bfloat16}


def test_model_dtype_bf16_loads_and_trains_the_actor_and_the_reference_in_bf16(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2, backend="inprocess") + [
        "actor_rollout_ref.actor.use_kl_loss=True",  # a reference policy of its own
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
        "actor_rollout_ref.ref.fsdp_config.model_dtype=bfloat16",
    ]
    config = checked_config(load_config("ppo_trainer", overrides))
    assert any("fsdp_config.model_dtype=bf16 on cpu" in n for n in validate_ppo_config(config))
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
        trainer.init_workers()
        try:
            worker = trainer.actor_rollout_wg.workers[0]._roles["actor_rollout"]
            actor = worker.actor_engine.module
            initial = {n: p.detach().clone() for n, p in actor.named_parameters()}
            assert {p.dtype for p in actor.parameters()} == {torch.bfloat16}
            assert not worker.actor_engine.precision.casts
            metrics = trainer.fit()
            assert {p.dtype for p in actor.parameters()} == {torch.bfloat16}
            moments = [s["exp_avg"] for s in worker.actor_engine.optimizer.state.values()]
            assert moments and {m.dtype for m in moments} == {torch.bfloat16}
            moved = [n for n, p in actor.named_parameters() if not torch.equal(p, initial[n])]
            assert moved  # the policy trained
            ref = worker.ref_engine.module  # the reference policy: a role of the same worker here
            assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
            for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
                assert math.isfinite(metrics[key]), key
        finally:
            trainer.shutdown_workers()


def test_model_dtype_bf16_for_the_critic(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", steps=1, backend="inprocess")
    config = checked_config(load_config("ppo_trainer", [*overrides, "critic.fsdp.model_dtype=bf16"]))
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
        trainer.init_workers()
        try:
            critic = trainer.critic_wg.workers[0]._roles["critic"].engine
            assert {p.dtype for p in critic.module.parameters()} == {torch.bfloat16} and not critic.precision.casts
            actor = trainer.actor_rollout_wg.workers[0]._roles["actor_rollout"].actor_engine.module
            assert {p.dtype for p in actor.parameters()} == {torch.float32}  # each role reads its own key
            metrics = trainer.fit()
            for key in ("critic/vf_loss", "critic/grad_norm", "critic/values/mean"):
                assert math.isfinite(metrics[key]), key
        finally:
            trainer.shutdown_workers()
