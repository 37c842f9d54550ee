"""End-to-end (in-process, tiny model): rollout correction in decoupled and bypass mode, and dynamic
sampling (filter_groups) with a reward that makes some groups uniform.

On the CPU the rollout engine samples exactly the trained policy (log-prob gap < 1e-3), so the
correction tests add a known, seeded gap to the rollout's log-probs right after generation: the
importance weights and rejections then have something to act on, and their values can be predicted.
"""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.trainer.ppo import ray_trainer
from hybridflow.trainer.ppo.rollout_source import SyncRolloutSource
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

GAP_STD = 1.0  # std of the log-prob gap added to the rollout's log-probs


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class Recorder:
    """Adds a seeded gap to rollout_log_probs after each generation and keeps copies of what the
    trainer generated and what it handed to update_actor."""

    def __init__(self, monkeypatch, gap: bool = True):
        self.generated: list[dict] = []
        self.updates: list[dict] = []
        self.scored: list[dict] = []  # uid -> [(answer, score), ...] per scored generation
        self.old_log_prob_calls = 0
        cls = ray_trainer.RayPPOTrainer
        generate = SyncRolloutSource.generate  # every generation of the step, dynamic sampling's refills too
        update, old, reward = cls._update_actor, cls._compute_old_log_prob, cls.compute_reward
        gen = torch.Generator().manual_seed(0)
        rec = self

        def wrapped_generate(source, prompts, timing, metrics, step, version):
            out = generate(source, prompts, timing, metrics, step, version)
            b = out.batch
            if gap:
                noise = torch.randn(b["rollout_log_probs"].shape, generator=gen) * GAP_STD
                b["rollout_log_probs"] = b["rollout_log_probs"] + noise * b["response_mask"]
            rec.generated.append(
                {
                    "uid": list(out.non_tensor_batch["uid"]),
                    "response_mask": b["response_mask"].clone(),
                    "ground_truth": [r["ground_truth"] for r in out.non_tensor_batch["reward_model"]],
                }
            )
            return out

        def wrapped_update(trainer, batch, metrics):
            keys = [
                k
                for k in (
                    "response_mask",
                    "old_log_probs",
                    "rollout_log_probs",
                    "rollout_is_weights",
                    "token_level_scores",
                )
                if k in batch.batch.keys()
            ]
            rec.updates.append(
                {
                    **{k: batch.batch[k].clone() for k in keys},
                    "uid": list(batch.non_tensor_batch["uid"]),
                    "ground_truth": [r["ground_truth"] for r in batch.non_tensor_batch["reward_model"]],
                }
            )
            update(trainer, batch, metrics)
            rec.updates[-1]["meta"] = dict(batch.meta_info)  # as sent to the worker

        def counting_old(trainer, batch, metrics):
            rec.old_log_prob_calls += 1
            return old(trainer, batch, metrics)

        def wrapped_reward(trainer, batch, metrics):
            reward(trainer, batch, metrics)
            groups: dict = {}
            for uid, row, score in zip(
                batch.non_tensor_batch["uid"],
                batch.non_tensor_batch["reward_model"],
                batch.batch["token_level_scores"].sum(-1).tolist(),
            ):
                groups.setdefault(uid, []).append((int(row["ground_truth"]), score))
            rec.scored.append(groups)

        monkeypatch.setattr(cls, "compute_reward", wrapped_reward)
        monkeypatch.setattr(SyncRolloutSource, "generate", wrapped_generate)
        monkeypatch.setattr(cls, "_update_actor", wrapped_update)
        monkeypatch.setattr(cls, "_compute_old_log_prob", counting_old)


def _overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2):
    return base_overrides(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        estimator="grpo",
        n=2,
        batch=4,
        steps=steps,
        world=1,
        backend="inprocess",
    ) + ["trainer.test_freq=-1", "trainer.balance_batch=False"]


def test_decoupled_rollout_correction_weights_and_rejects(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Token TIS at 1.5 plus token_k1 rejection at 4: the actor receives w = min(π_old/π_rollout, 1.5)
    and a response mask without the tokens whose ratio left [1/4, 4]; rollout_corr/* is logged."""
    rec = Recorder(monkeypatch)
    overrides = _overrides(tiny_model_dir, tiny_data_dir, tmp_path) + [
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=1.5",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=4.0",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert len(steps) == 2 and len(rec.updates) == 2 and rec.old_log_prob_calls == 2
    assert len(rec.generated) == 2
    for m, generated, sent in zip(steps, rec.generated, rec.updates, strict=True):
        assert_finite(m)
        ratio = torch.exp(sent["old_log_probs"] - sent["rollout_log_probs"])
        before = generated["response_mask"].bool()
        # rejection: exactly the tokens whose ratio left [1/4, 4]
        inside = (ratio >= 0.25) & (ratio <= 4.0)
        assert torch.equal(sent["response_mask"].bool(), before & inside)
        assert (before & ~inside).any()  # a gap of std 1 takes some ratios out of the band
        # weights: truncated ratio on every response token (rejected ones drop out through the mask)
        torch.testing.assert_close(sent["rollout_is_weights"], ratio.clamp(max=1.5) * before, rtol=1e-5, atol=1e-6)
        assert "rollout_correction" not in sent["meta"]  # decoupled: the actor uses its configured loss
        expected_masked = float((before & ~inside).sum() / before.sum())
        assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(expected_masked, abs=1e-6)
        assert m["rollout_corr/rollout_is_ratio_fraction_high"] > 0 and m["rollout_corr/rollout_is_max"] == 1.5
        assert m["rollout_corr/kl"] != 0 and m["rollout_corr/chi2_token"] > 0
        assert m["training/rollout_probs_diff_mean"] > 1e-2  # the gap is visible in veRL's debug metric too
        assert m["actor/grad_norm"] > 0


def test_bypass_mode_reinforce_skips_the_old_log_prob_pass(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """bypass_mode: no old-log-prob pass, π_old = π_rollout, the actor computes weights per micro-batch
    and logs rollout_corr/* itself."""
    from hybridflow.workers.actor import dp_actor

    params = []
    original = dp_actor.DataParallelPPOActor.update_policy

    def wrapped(actor, data):
        before = torch.cat([p.detach().reshape(-1).clone() for p in actor.actor_module.parameters()])
        out = original(actor, data)
        after = torch.cat([p.detach().reshape(-1) for p in actor.actor_module.parameters()])
        params.append(float((after - before).abs().max()))
        return out

    monkeypatch.setattr(dp_actor.DataParallelPPOActor, "update_policy", wrapped)
    rec = Recorder(monkeypatch)
    overrides = _overrides(tiny_model_dir, tiny_data_dir, tmp_path) + [
        "algorithm.rollout_correction.bypass_mode=True",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert len(steps) == len(rec.updates) == 2 and rec.old_log_prob_calls == 0
    for m, sent in zip(steps, rec.updates, strict=True):
        assert_finite(m)
        assert torch.equal(sent["old_log_probs"], sent["rollout_log_probs"])
        assert "rollout_is_weights" not in sent and sent["meta"]["rollout_correction"].bypass_mode
        # from the actor (π_θ against π_rollout, per micro-batch): weights truncated at 2
        assert 0 < m["rollout_corr/rollout_is_mean"] <= 2.0 and m["rollout_corr/rollout_is_max"] <= 2.0
        assert m["rollout_corr/rollout_is_ratio_fraction_high"] > 0
        assert "actor/pg_loss" in m and m["actor/grad_norm"] > 0
    assert len(params) == 2 and all(p > 0 for p in params)  # the weights moved every step


INFORMATIVE_REWARD = '''
import zlib

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Uniform for even answers (0.5 for every response); odd answers: a pseudo-random score of the
    response text, so the two responses of a group differ unless they are identical. The value is
    also reported as the extra field 'acc', the metric the groups are filtered on."""
    value = 0.5 if int(ground_truth) % 2 == 0 else (zlib.crc32((solution_str or "").encode()) % 997) / 997
    return {"score": value, "acc": value}
'''


@pytest.mark.parametrize("gen_batch", [None, 12])
def test_filter_groups_trains_only_informative_groups(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch, gen_batch):
    """filter_groups on the reward's extra field 'acc': even-answer groups are always uniform and never trained;
    each step holds exactly train_batch_size groups; num_gen_batches counts the generations, each of
    data.gen_batch_size prompts (DAPO's generation batch; null: train_batch_size)."""
    rec = Recorder(monkeypatch, gap=False)
    reward = os.path.join(str(tmp_path), "informative_reward.py")
    with open(reward, "w") as f:
        f.write(INFORMATIVE_REWARD)
    overrides = _overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=3) + [
        f"custom_reward_function.path={reward}",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=20",
        f"data.gen_batch_size={'null' if gen_batch is None else gen_batch}",
    ]
    run_ppo(load_config("ppo_trainer", overrides))
    per_generation = gen_batch or 4

    steps = read_metrics(tmp_path)
    assert len(steps) == 3 and len(rec.updates) == 3
    generations = [int(m["training/filter_groups/num_gen_batches"]) for m in steps]
    assert sum(generations) == len(rec.scored)  # one generation per prompt batch (max_inflight 1)
    first = 0
    for m, sent, count in zip(steps, rec.updates, generations, strict=True):
        assert_finite(m)
        scored = rec.scored[first : first + count]
        first += count
        assert [len(batch) for batch in scored] == [per_generation] * count  # prompts of each generation
        # even answers are uniform (the reward says 0.5 for all); a step keeps generating while fewer
        # than 4 groups with differing scores are held, and stops at the batch that completes them
        informative = [sum(len({s for _, s in g}) > 1 for g in batch.values()) for batch in scored]
        assert all(len({s for _, s in g}) == 1 for batch in scored for g in batch.values() if g[0][0] % 2 == 0)
        assert sum(informative[:-1]) < 4 <= sum(informative), informative
        # exactly 4 groups × n=2 trained, each with differing scores, none with an even answer
        groups: dict = {}
        for uid, gt, score in zip(
            sent["uid"], sent["ground_truth"], sent["token_level_scores"].sum(-1).tolist(), strict=True
        ):
            groups.setdefault(uid, []).append((int(gt), score))
        assert len(groups) == 4 and all(len(v) == 2 for v in groups.values())
        for members in groups.values():
            assert members[0][0] % 2 == 1 and members[0][1] != members[1][1], members
        seen = per_generation * count
        assert m["training/filter_groups/groups_seen"] == seen
        assert m["training/filter_groups/kept_groups"] == 4 + m["training/filter_groups/discarded_surplus_samples"]
        assert m["training/filter_groups/evicted_samples"] == seen - m["training/filter_groups/kept_groups"]
    if gen_batch is None:
        assert max(generations) >= 2  # half the answers are even: some step needed a refill
