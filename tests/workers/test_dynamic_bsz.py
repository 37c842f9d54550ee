"""Dynamic batch size (micro-batches by token budget) and trainer.balance_batch: the config keys reach the
workers, the result does not depend on how the batch is cut, rows come back in their original order,
and balancing gives every data-parallel rank the same rows count and nearly the same tokens."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.balance import balanced_order, seqlen_balance_metrics
from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.critic import DataParallelPPOCritic
from hybridflow.workers.utils import micro_batches
from tests.workers.actor.ppo_batch import actor_config, flat_params, ppo_batch, tiny_causal_lm, tiny_value_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# ------------------------------------------------------------------------------------------------
# trainer.balance_batch
# ------------------------------------------------------------------------------------------------


def test_balanced_order_hand_example_and_metrics():
    seqlens = [10, 10, 8, 5, 5, 2, 1, 1]  # 42 tokens; as they arrive rank 0 gets 33, rank 1 gets 9
    order = balanced_order(seqlens, 2)
    assert sorted(order) == list(range(8))
    chunks = [order[:4], order[4:]]  # DP_COMPUTE_PROTO: rank r gets the r-th contiguous chunk
    loads = [sum(seqlens[i] for i in c) for c in chunks]
    assert loads == [21, 21]  # a perfect split exists: {10, 8, 2, 1} and {10, 5, 5, 1}
    m = seqlen_balance_metrics(seqlens, 2, order)
    assert (m["global_seqlen/min"], m["global_seqlen/max"], m["global_seqlen/minmax_diff"]) == (9, 33, 24)
    assert (m["global_seqlen/balanced_min"], m["global_seqlen/balanced_max"], m["global_seqlen/mean"]) == (21, 21, 21)
    assert balanced_order(seqlens, 1) is None and balanced_order(seqlens, 3) is None  # 8 rows do not split in 3


def test_balanced_order_random_batches_are_near_equal():
    gen = np.random.default_rng(0)
    for k in (2, 4):
        seqlens = [int(x) for x in gen.integers(1, 512, size=64)]
        order = balanced_order(seqlens, k)
        size = 64 // k
        loads = [sum(seqlens[i] for i in order[r * size : (r + 1) * size]) for r in range(k)]
        # Karmarkar-Karp on 64 items: spread far below one average item
        assert max(loads) - min(loads) <= max(seqlens) // 4, loads


def test_trainer_balance_batch_reorders_rows_and_logs():
    from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer

    seqlens = [10, 10, 8, 5, 5, 2, 1, 1]
    mask = torch.tensor([[1] * n + [0] * (10 - n) for n in seqlens])
    batch = DataProto.from_dict(
        tensors={"attention_mask": mask, "row": torch.arange(8)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(8)], dtype=object)},
    )
    trainer_like = SimpleNamespace(actor_rollout_wg=SimpleNamespace(world_size=2))
    metrics = {}
    RayPPOTrainer._balance_batch(trainer_like, batch, metrics)
    rows = batch.batch["row"].tolist()
    assert sorted(rows) == list(range(8)) and rows != list(range(8))
    assert list(batch.non_tensor_batch["uid"]) == [f"u{i}" for i in rows]  # still aligned
    per_rank = batch.batch["attention_mask"].sum(-1).reshape(2, 4).sum(-1).tolist()
    assert per_rank == [21, 21]
    assert metrics["global_seqlen/minmax_diff"] == 24 and metrics["global_seqlen/balanced_max"] == 21


# ------------------------------------------------------------------------------------------------
# config keys -> workers
# ------------------------------------------------------------------------------------------------


def test_config_keys_reach_the_worker_settings():
    from hybridflow.config import FSDPCriticConfig
    from hybridflow.config.convert import as_section
    from hybridflow.config.loader import load_config
    from hybridflow.config.ppo_trainer import PPOTrainerConfig
    from hybridflow.workers.actor.dp_actor import actor_section
    from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    cfg = load_config(
        "ppo_trainer",
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=777",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "critic.ppo_max_token_len_per_gpu=999",
            "critic.ppo_mini_batch_size=4",
        ],
    )
    arr = as_section(cfg, PPOTrainerConfig).actor_rollout_ref  # the typed section the worker holds
    fake_worker = SimpleNamespace(dp_size=2, config=arr)
    data = DataProto.from_dict(tensors={"x": torch.zeros(8)})
    for section in ("rollout", "ref"):  # log_prob_* interpolate from the actor's keys, as in veRL
        meta = ActorRolloutRefWorker._log_prob_meta(fake_worker, data, getattr(arr, section))
        assert meta["use_dynamic_bsz"] is True and meta["max_token_len"] == 777
    actor = DataParallelPPOActor(actor_section(cfg.actor_rollout_ref.actor).per_rank(2, rollout_n=2), tiny_causal_lm())
    assert actor.config.use_dynamic_bsz and actor.config.ppo_max_token_len_per_gpu == 777
    assert actor.config.ppo_mini_batch_size == 4  # 4 prompts x n=2 / 2 ranks
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4  # the loaded config is not touched

    critic = DataParallelPPOCritic(cfg.critic, tiny_value_model())
    assert isinstance(critic.config, FSDPCriticConfig)
    assert critic.config.use_dynamic_bsz and critic.config.ppo_max_token_len_per_gpu == 999
    assert critic.forward_max_token_len == 999  # ${critic.ppo_max_token_len_per_gpu}


# ------------------------------------------------------------------------------------------------
# invariance to the cut
# ------------------------------------------------------------------------------------------------


def _count_splits(monkeypatch):
    counts = []
    real = micro_batches.split_by_token_budget

    def spy(data, max_token_len, dp_group=None):
        out = real(data, max_token_len, dp_group)
        counts.append(len(out[0]))
        return out

    # actor and critic cut through micro_batches.split_for_forward / split_for_update
    monkeypatch.setattr(micro_batches, "split_by_token_budget", spy)
    return counts


@pytest.mark.parametrize("remove_padding", [False, True])
def test_actor_update_and_log_probs_same_however_cut(remove_padding, monkeypatch):
    counts = _count_splits(monkeypatch)
    base = tiny_causal_lm()
    data = ppo_batch(base, batch_size=8, temperature=0.9)
    results = {}
    cuts = {
        "fixed 8": {"ppo_micro_batch_size_per_gpu": 8},
        "fixed 3": {"ppo_micro_batch_size_per_gpu": 3},
        "budget 11": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 11},  # rows hold up to 11 tokens
        "budget 30": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 30},
    }
    for name, cut in cuts.items():
        model = copy.deepcopy(base)
        config = actor_config(entropy_coeff=0.01, use_kl_loss=True, use_remove_padding=remove_padding, **cut)
        actor = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=0.5))
        data.meta_info.update(
            micro_batch_size=cut.get("ppo_micro_batch_size_per_gpu", 8),
            use_dynamic_bsz=cut.get("use_dynamic_bsz", False),
            max_token_len=cut.get("ppo_max_token_len_per_gpu", 0),
        )
        log_probs, _ = actor.compute_log_prob(data)
        metrics = actor.update_policy(data)
        results[name] = (log_probs, flat_params(model), metrics["actor/pg_loss"][0])
    assert min(counts) < max(counts) and max(counts) > 1  # the budgets really cut differently

    mask = data.batch["response_mask"].bool()
    log_probs0, params0, loss0 = results["fixed 8"]
    # in the original row order: equal to the old log probs the batch was built with (noise=0.3 added)
    assert (log_probs0[mask] - data.batch["old_log_probs"][mask]).abs().max() > 0.05
    for name, (log_probs, params, loss) in results.items():
        torch.testing.assert_close(log_probs[mask], log_probs0[mask], atol=1e-5, rtol=0, msg=name)
        assert (params - params0).abs().max() < 1e-5, name
        assert loss == pytest.approx(loss0, abs=1e-6), name
    assert (params0 - flat_params(base)).abs().max() > 1e-3


def test_critic_values_same_however_cut_and_in_order():
    model = tiny_value_model(pad_token_id=0)
    data = ppo_batch(tiny_causal_lm(), batch_size=8)
    from tests.yaml_sections import critic

    base_cfg = critic(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=8, forward_micro_batch_size_per_gpu=8)
    fixed = DataParallelPPOCritic(dict(base_cfg, forward_micro_batch_size_per_gpu=8), model).compute_values(data)
    one_by_one = torch.cat([DataParallelPPOCritic(base_cfg, model).compute_values(data[i : i + 1]) for i in range(8)])
    torch.testing.assert_close(fixed, one_by_one, atol=1e-5, rtol=0)
    for packed in (False, True):
        cfg = dict(
            base_cfg,
            use_dynamic_bsz=True,
            forward_max_token_len_per_gpu=12,
            model={**base_cfg["model"], "use_remove_padding": packed},
        )
        critic = DataParallelPPOCritic(cfg, model)
        assert critic.use_remove_padding is packed
        torch.testing.assert_close(critic.compute_values(data), fixed, atol=1e-5, rtol=0)
