"""End-to-end runs of the PPO driver (``run_ppo``) on the tiny model and task, on the CPU.

One Ray session is shared by all the Ray tests (``ray_session``). The default-suite test is the
2-worker GRPO run; the longer ones (critic, reward model) are slow-marked.
"""

from __future__ import annotations

import functools
import json
import os
import time

import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import REQUIRED_STEP_METRICS, assert_finite, base_overrides, missing, read_metrics


def _checksum(wg) -> float:
    sums = wg.parameter_checksum()
    sums = sums if isinstance(sums, list) else [sums]
    assert all(s == sums[0] for s in sums), f"ranks disagree on the full weights: {sums}"
    return sums[0]


class _Capture:
    """Keeps the trainer built inside run_ppo and the actor (and critic) weight checksums: at start
    and after every step."""

    def __init__(self, monkeypatch):
        from hybridflow.trainer.ppo import ray_trainer

        self.trainer = None
        self.actor_sums: list[float] = []
        self.critic_sums: list[float] = []
        cls = ray_trainer.RayPPOTrainer
        init_workers, train_step = cls.init_workers, cls.train_step
        capture = self

        def wrapped_init(trainer):
            init_workers(trainer)
            capture.trainer = trainer
            capture.record()

        def wrapped_step(trainer, batch):
            metrics = train_step(trainer, batch)
            capture.record()
            return metrics

        monkeypatch.setattr(cls, "init_workers", wrapped_init)
        monkeypatch.setattr(cls, "train_step", wrapped_step)
        # optimizer steps per update, over all ranks: one grad_norm per (rank, epoch, mini-batch)
        self.optimizer_steps = {"actor": [], "critic": []}
        for role, name in (("actor", "_update_actor"), ("critic", "_update_critic")):
            monkeypatch.setattr(cls, name, self._counting(role, getattr(cls, name)))

    def _counting(self, role, update):
        def wrapped(trainer, batch, metrics):
            from hybridflow.trainer.ppo.metric_utils import flat_metric_values

            update(trainer, batch, metrics)
            # one list per rank (DataProto.concat, veRL's shape), one value per optimizer step
            self.optimizer_steps[role].append(len(flat_metric_values(metrics[f"{role}/grad_norm"])))

        return wrapped

    def record(self):
        self.actor_sums.append(_checksum(self.trainer.actor_rollout_wg))
        if self.trainer.critic_wg is not None:
            self.critic_sums.append(_checksum(self.trainer.critic_wg))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _free_cpus(ray) -> float:
    return ray.available_resources().get("CPU", 0.0)


def test_grpo_two_workers_three_steps(tiny_model_dir, tiny_data_dir, ray_session, tmp_path, monkeypatch):
    """The default-suite e2e run: GRPO, 2 Ray workers (gloo FSDP2), 3 steps, validation at the end."""
    capture = _Capture(monkeypatch)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=3, world=2
    )
    timeline = tmp_path / "timeline" / "ray.json"  # veRL's ray_kwargs.timeline_json_file (its folder made)
    overrides.append(f"ray_kwargs.timeline_json_file={timeline}")
    free_before = _free_cpus(ray_session)
    last = run_ppo(load_config("ppo_trainer", overrides))

    # a finished run gives its workers' CPUs back to the session (Ray reports it asynchronously)
    deadline = time.monotonic() + 20
    while _free_cpus(ray_session) < free_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _free_cpus(ray_session) >= free_before

    steps = read_metrics(tmp_path)
    assert [m["step"] for m in steps] == [1, 2, 3]
    assert last == {k: v for k, v in steps[-1].items() if k != "step"}  # fit returns the last step's metrics
    for m in steps:
        assert_finite(m)
        assert not missing(m, REQUIRED_STEP_METRICS), missing(m, REQUIRED_STEP_METRICS)
        assert m["actor/entropy"] > 0 and m["perf/throughput"] > 0
        assert 0 <= m["response_length/clip_ratio"] <= 1 and 1 <= m["response_length/mean"] <= 8
        # 2 ranks with balance_batch: the token load per rank is logged
        assert m["global_seqlen/min"] <= m["global_seqlen/mean"] <= m["global_seqlen/max"]
        # balancing never makes the split worse than the contiguous one
        assert m["global_seqlen/balanced_max"] - m["global_seqlen/balanced_min"] <= m["global_seqlen/minmax_diff"]
        # the engine samples from the trained policy: fresh weights are pushed before every generation
        # (the actor moved in the previous step) and its log-probs match the trainer's recomputation
        assert m["rollout/weight_sync_mb"] > 0 and m["training/rollout_probs_diff_mean"] < 1e-3, m
    # validation at the last step (test_freq=3), per data source
    assert any(k.startswith("val-core/openai/gsm8k/reward/mean@") for k in steps[-1]), sorted(steps[-1])
    assert not any(k.startswith("val-core/") for k in steps[0])
    # the toy reward differs within groups → non-zero advantages → the weights move, every step
    assert all(m["critic/advantages/max"] > 0 for m in steps)
    sums = capture.actor_sums
    assert len(sums) == 4 and all(a != b for a, b in zip(sums, sums[1:])), sums
    # veRL's batch arithmetic: 4 prompts × n=2 = 8 samples, 4 per rank; ppo_mini_batch_size=2 prompts
    # = 4 samples = 2 per rank → 2 optimizer steps per rank per update, 2 ranks → 4 grad norms
    assert capture.optimizer_steps["actor"] == [4, 4, 4]
    # Ray's timeline of the run: a Chrome trace with the workers' calls (both ranks' updates among them)
    events = json.loads(timeline.read_text())
    updates = [e for e in events if e.get("name") == "actor_rollout_update_actor" and e.get("ph") == "X"]
    assert len({e["tid"] for e in updates}) == 2 and all(e["dur"] > 0 for e in updates), updates


@pytest.mark.slow
def test_gae_critic_warmup_adaptive_kl_two_workers(tiny_model_dir, tiny_data_dir, ray_session, tmp_path, monkeypatch):
    """PPO with a critic: critic_warmup=2 (veRL rule: step 1 trains only the critic), KL in the reward with an
    adaptive controller, 2 Ray workers, 2 steps."""
    capture = _Capture(monkeypatch)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", n=2, batch=4, steps=2, world=2)
    overrides += [
        "trainer.critic_warmup=2",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.kl_ctrl.kl_coef=0.01",
        "algorithm.kl_ctrl.horizon=10",
        "algorithm.kl_ctrl.target_kl=0.1",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    step1, step2 = read_metrics(tmp_path)
    for m in (step1, step2):
        assert_finite(m)
        for key in (
            "critic/vf_loss",
            "critic/values/mean",
            "critic/advantages/mean",
            "actor/reward_kl_penalty",
            "actor/reward_kl_penalty_coeff",
            "timing_s/update_critic",
            "timing_s/values",
            "timing_s/ref",
        ):
            assert key in m, key
    # warmup: no actor update at step 1, an actor update at step 2
    assert "actor/pg_loss" not in step1 and "timing_s/update_actor" not in step1
    assert not missing(step2, REQUIRED_STEP_METRICS), missing(step2, REQUIRED_STEP_METRICS)
    a0, a1, a2 = capture.actor_sums
    assert a1 == a0 and a2 != a1
    c0, c1, c2 = capture.critic_sums
    assert c1 != c0 and c2 != c1
    # critic mini-batches follow the actor's (2 prompts × n=2 = 4 samples, 2 per rank): 2 per rank × 2 ranks
    assert capture.optimizer_steps == {"actor": [4], "critic": [4, 4]}
    # adaptive KL: at step 1 actor == ref, so KL = 0 and the error clips to -0.2;
    # coef_2 = coef_1 * (1 - 0.2 * n_rows / horizon) = 0.01 * (1 - 0.2 * 8 / 10) = 0.0084
    assert step1["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert step1["actor/reward_kl_penalty_coeff"] == pytest.approx(0.01)
    assert step2["actor/reward_kl_penalty_coeff"] == pytest.approx(0.0084)


def _count_actor_calls(monkeypatch) -> list[tuple[str, int]]:
    """Records (phase, rows) for every forward micro-batch and every optimizer mini-batch of the actor."""
    from hybridflow.workers.actor import dp_actor
    from hybridflow.workers.utils import update_loop

    calls: list[tuple[str, int]] = []
    cls = dp_actor.DataParallelPPOActor
    fwd, logp = cls._forward_micro_batch, cls.compute_log_prob
    run, split = update_loop.UpdateLoop.run, update_loop.split_for_update
    phase = {"now": None, "loop": None}

    def wrapped_fwd(self, micro, *a, **kw):
        calls.append((phase["now"], len(micro)))
        return fwd(self, micro, *a, **kw)

    def wrapped_logp(self, data, *a, **kw):
        phase["now"] = "ref" if self.actor_optimizer is None else "old"
        try:
            return logp(self, data, *a, **kw)
        finally:
            phase["now"] = None

    def wrapped_run(self, data, *a, **kw):
        phase["loop"] = self.prefix
        try:
            return run(self, data, *a, **kw)
        finally:
            phase["now"] = phase["loop"] = None

    def wrapped_split(mini_batch, *a, **kw):  # once per mini-batch (optimizer step) of the update loop
        if phase["loop"] == "actor":
            calls.append(("mini", len(mini_batch)))
            phase["now"] = "update"
        return split(mini_batch, *a, **kw)

    monkeypatch.setattr(cls, "_forward_micro_batch", wrapped_fwd)
    monkeypatch.setattr(cls, "compute_log_prob", wrapped_logp)
    monkeypatch.setattr(update_loop.UpdateLoop, "run", wrapped_run)
    monkeypatch.setattr(update_loop, "split_for_update", wrapped_split)
    return calls


def test_inprocess_grpo_batch_sizes(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """trainer.backend=inprocess GRPO, 2 steps: trains, and runs veRL's batch-size arithmetic.

    8 samples per step (4 prompts × n=2). ppo_mini_batch_size=2 prompts → 2 × n = 4 samples per
    optimizer step → 2 mini-batches per epoch, × ppo_epochs=2 = 4 optimizer steps of 4 rows, each as
    2 micro-batches of 2. Old log-probs: micro 4 → 2 forwards of 4; ref (deprecated global size 2
    over 1 rank) → 4 forwards of 2.
    """
    calls = _count_actor_calls(monkeypatch)
    capture = _Capture(monkeypatch)
    overrides = base_overrides(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        estimator="grpo",
        n=2,
        batch=4,
        steps=2,
        world=1,
        backend="inprocess",
        mini_batch=2,
    )
    overrides += [
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.ref.log_prob_micro_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert len(steps) == 2
    for m in steps:
        assert_finite(m)
        assert not missing(m, REQUIRED_STEP_METRICS)
        assert "actor/kl_loss" in m
    per_step = [("old", 4)] * 2 + [("ref", 2)] * 4 + ([("mini", 4)] + [("update", 2)] * 2) * 4
    assert calls == per_step * 2, calls
    assert capture.optimizer_steps["actor"] == [4, 4]  # 2 epochs × 2 mini-batches, one grad norm each
    sums = capture.actor_sums
    assert sums[1] != sums[0] and sums[2] != sums[1]


def _save_tiny_reward_model(model_dir: str, out_dir: str) -> str:
    """A sequence-classification model (num_labels=1) with the tiny model's config and tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    from hybridflow.models.tiny import build_tiny_model

    config = AutoConfig.from_pretrained(model_dir, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config.pad_token_id = tokenizer.pad_token_id
    model = build_tiny_model(config, seed=1, head="sequence_classification")
    torch.nn.init.normal_(
        model.score.weight, std=1.0, generator=torch.Generator().manual_seed(1)
    )  # a visible spread of scores
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def expected_rm_scores(rm_dir: str, raw_prompts, responses, attention_mask) -> torch.Tensor:
    """Independent reference (veRL 0.9's reward-loop input): per row, the prompt's messages plus the response
    decoded with its special tokens and the EOS text removed, in the RM's chat template, one unpadded row
    through the RM's body and head, the last token's score."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    valid = attention_mask[:, -responses.shape[-1] :].sum(-1)
    out = []
    for messages, ids, n in zip(raw_prompts, responses, valid, strict=True):
        answer = tokenizer.decode(ids[: int(n)].tolist()).replace(tokenizer.eos_token, "")
        chat = [*[dict(m) for m in messages], {"role": "assistant", "content": answer}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        with torch.no_grad():
            hidden = rm.model(input_ids=torch.tensor([tokenizer(text)["input_ids"]])).last_hidden_state
            out.append(rm.score(hidden)[0, -1, -1])
    return torch.stack(out)


def test_inprocess_reward_model_scores_are_the_rewards(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """reward_model.enable=True: the RM's score of each row's conversation, placed on its last response
    token, is the token-level score (the rule reward is not added), and critic/score/mean is their mean."""
    from hybridflow.workers import reward_model_worker

    rm_dir = _save_tiny_reward_model(tiny_model_dir, os.path.join(str(tmp_path), "rm"))
    seen = []
    original = reward_model_worker.RewardModelWorker.compute_rm_score

    @functools.wraps(original)  # keeps the @register marker: the worker group binds it
    def wrapped(self, data):
        out = original(self, data)
        seen.append(
            (
                list(data.non_tensor_batch["raw_prompt"]),
                data.batch["responses"].clone(),
                data.batch["attention_mask"].clone(),
                out.batch["rm_scores"].clone(),
            )
        )
        return out

    monkeypatch.setattr(reward_model_worker.RewardModelWorker, "compute_rm_score", wrapped)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=2, world=1, backend="inprocess"
    )
    overrides += [
        "reward_model.enable=True",
        f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=3",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert len(seen) == 2 and len(steps) == 2
    for m, (raw_prompts, responses, mask, rm_scores) in zip(steps, seen, strict=True):
        expected = expected_rm_scores(rm_dir, raw_prompts, responses, mask)
        torch.testing.assert_close(rm_scores.sum(-1), expected, rtol=1e-4, atol=1e-5)
        # exactly one non-zero per row, on the last valid response token
        response_mask = mask[:, -rm_scores.shape[-1] :]
        last = response_mask.sum(-1) - 1
        assert torch.equal(rm_scores.nonzero()[:, 1], last[rm_scores.abs().sum(-1) > 0])
        assert m["critic/score/mean"] == pytest.approx(expected.mean().item(), rel=1e-4, abs=1e-5)
        assert m["critic/score/max"] == pytest.approx(expected.max().item(), rel=1e-4, abs=1e-5)


def test_inprocess_gae_dynamic_bsz_and_sampled_validation(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """use_dynamic_bsz packs micro-batches by a token budget (actor, log-prob and critic passes), and
    validation before training samples val_kwargs.n=2 responses per prompt (mean@2, best@2)."""
    from hybridflow.workers.actor import dp_actor

    budget = 260  # a prompt is ~90-100 tokens + 8 response tokens: 2 rows per micro-batch at most
    tokens = []
    fwd = dp_actor.DataParallelPPOActor._forward_micro_batch

    def wrapped(self, micro, *a, **kw):
        tokens.append(int(micro.batch["attention_mask"].sum()))
        return fwd(self, micro, *a, **kw)

    monkeypatch.setattr(dp_actor.DataParallelPPOActor, "_forward_micro_batch", wrapped)
    capture = _Capture(monkeypatch)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", n=2, batch=4, steps=1, world=1, backend="inprocess"
    )
    overrides += [
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"critic.ppo_max_token_len_per_gpu={budget}",
        "trainer.val_before_train=True",
        "trainer.test_freq=-1",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    val, step1 = read_metrics(tmp_path)
    assert val["step"] == 0 and step1["step"] == 1
    # veRL's sections: the core variable's mean@N and best@N at the largest N in val-core, the spread in val-aux
    assert "val-core/openai/gsm8k/reward/mean@2" in val and "val-core/openai/gsm8k/reward/best@2/mean" in val
    assert "val-aux/openai/gsm8k/reward/worst@2/mean" in val and "val-aux/openai/gsm8k/reward/std@2" in val
    assert val["val-core/openai/gsm8k/reward/best@2/mean"] >= val["val-core/openai/gsm8k/reward/mean@2"]
    assert_finite(step1)
    assert "critic/vf_loss" in step1 and not missing(step1, REQUIRED_STEP_METRICS)
    assert tokens and max(tokens) <= budget, tokens
    assert len(tokens) >= 2 * 8 // 2  # old log-prob + update passes over 8 rows, ≤ 2 rows each
    assert capture.actor_sums[1] != capture.actor_sums[0] and capture.critic_sums[1] != capture.critic_sums[0]


@pytest.mark.slow
def test_reward_model_two_workers(tiny_model_dir, tiny_data_dir, ray_session, tmp_path, monkeypatch):
    """The RM path under Ray (2 ranks, the RM colocated with the actor): the driver's token-level
    scores are the RM's outputs on the generated conversations."""
    from hybridflow.trainer.ppo import ray_trainer

    rm_dir = _save_tiny_reward_model(tiny_model_dir, os.path.join(str(tmp_path), "rm"))
    seen = []
    original = ray_trainer.RayPPOTrainer.compute_reward

    def wrapped(trainer, batch, metrics):
        original(trainer, batch, metrics)
        b = batch.batch
        seen.append({k: b[k].clone() for k in ("responses", "attention_mask", "token_level_scores")})
        seen[-1]["raw_prompt"] = list(batch.non_tensor_batch["raw_prompt"])

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "compute_reward", wrapped)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=1, world=2
    )
    overrides += [
        "reward_model.enable=True",
        f"reward_model.model.path={rm_dir}",
        "trainer.test_freq=-1",
        "reward_model.micro_batch_size_per_gpu=3",
    ]
    run_ppo(load_config("ppo_trainer", overrides))

    (m,) = read_metrics(tmp_path)
    (b,) = seen
    expected = expected_rm_scores(rm_dir, b["raw_prompt"], b["responses"], b["attention_mask"])
    torch.testing.assert_close(b["token_level_scores"].sum(-1), expected, rtol=1e-4, atol=1e-5)
    assert m["critic/score/mean"] == pytest.approx(expected.mean().item(), rel=1e-4, abs=1e-5)
