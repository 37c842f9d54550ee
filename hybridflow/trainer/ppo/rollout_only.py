"""``trainer.rollout_only=True``: every step generates and scores, and nothing trains.

veRL has no key for this (``trainer.val_only`` only validates), so hybridflow names it. Use it to
look at what a policy produces on the training prompts — score distribution, response lengths,
advantages a GRPO/RLOO group would get — or to write dumps (``trainer.rollout_data_dir``) for later
replay, without paying for log-probs or updates. Per step: generate → reward → values (critic
estimators only) → advantages on the driver; no old/ref log-probs, no KL in the reward, no update.
The loop, validation, checkpoints (the data position) and logging are the trainer's own.
"""

from __future__ import annotations

from hybridflow.protocol import DataProto
from hybridflow.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_metrics,
    timer,
)


def rollout_only_step(trainer, batch: DataProto) -> dict[str, float]:
    """The trainer's ``train_step`` in rollout-only mode (bound once, at construction)."""
    metrics: dict = {}
    timing: dict = {}
    with timer("step", timing):
        batch = trainer._generate(batch, timing, metrics)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        with timer("reward", timing):
            trainer._compute_reward(batch, metrics)
        if trainer.use_critic:
            with timer("values", timing):
                trainer._compute_values(batch)
        with timer("adv", timing):
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # no KL: no reference pass
            trainer._compute_advantage(batch)
    metrics.update(compute_data_metrics(batch, trainer.use_critic))
    metrics.update(compute_timing_metrics(batch, timing))
    metrics.update(compute_throughput_metrics(batch, timing["step"], trainer.n_devices))
    metrics.update(trainer.rollout_recorder.after_step(batch, trainer.global_steps))
    return reduce_metrics(metrics)
