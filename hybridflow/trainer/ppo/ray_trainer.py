"""The PPO/GRPO driver: one process writes the RL loop; every heavy step is a WorkerGroup call.

Per step: generate → reward → old log-prob → ref log-prob → values → (KL in reward) → advantages
(on the driver) → update critic → update actor → metrics; validation every ``test_freq``, checkpoint
every ``save_freq``. ``fit`` is the loop; ``train_step`` reads top to bottom as the named phases,
a variant (dynamic sampling, bypass mode, a replayed step, rollout_only) as a plain ``if`` where it
applies. The
trajectories come from the rollout source (``rollout_source.py``: sync, one-step-off, fully async).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import shutil

import numpy as np
import torch

from hybridflow import algorithms as core_algos  # veRL's name for the RL math
from hybridflow.agent_loop.base import agent_loop_settings
from hybridflow.agent_loop.manager import AgentLoopManager
from hybridflow.algorithms.pf_ppo import pf_ppo_resample_indices
from hybridflow.algorithms.rollout_correction import compute_rollout_correction
from hybridflow.config.algorithm import FilterGroupsConfig
from hybridflow.config.base import to_dict
from hybridflow.config.convert import as_section
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.protocol import DataProto
from hybridflow.rewards.streaming import streamed_reward
from hybridflow.rollout.server import engine_death_named
from hybridflow.single_controller.base import Watchdog, WorkerDiedError, WorkerHangError, cleanup_after_failure
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.checkpoint_callback import build_checkpoint_callback
from hybridflow.trainer.ppo.balance import balanced_order, seqlen_balance_metrics
from hybridflow.trainer.ppo.dynamic_sampling import EpochCycler, fill_with_informative_groups, merge_round_metrics
from hybridflow.trainer.ppo.judge_setup import JUDGE_ROLE, start_judge, uses_judge
from hybridflow.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    gdpo_component_metrics,
    reduce_metrics,
    rollout_probs_diff_metrics,
    timer,
    validation_metrics,
)
from hybridflow.trainer.ppo.profiling import profile_span, profiled_steps
from hybridflow.trainer.ppo.rollout_replay import RolloutRecorder
from hybridflow.trainer.ppo.rollout_source import (
    FAILED_GROUPS,
    make_rollout_source,
    rollout_request,
    without_prompt_tensors,
)
from hybridflow.trainer.ppo.rollouter import CHECKPOINT_TYPES
from hybridflow.trainer.ppo.teacher_setup import Teachers
from hybridflow.trainer.ppo.worker_setup import build_worker_groups, rollout_role_name, separated_rollout
from hybridflow.utils.progress import Progress
from hybridflow.utils.tracking import Tracking
from hybridflow.workers.checkpoint import get_rng_state, set_rng_state
from hybridflow.workers.rollout.weight_transfer import WEIGHT_RECEIVER

logger = logging.getLogger(__name__)

# batch tensors an advantage estimator gets when its signature names them
_OPTIONAL_ADV_TENSORS = ("old_log_probs", "sum_pi_squared", "rollout_is_weights")


def watchdog_of(trainer_cfg) -> Watchdog:
    """``trainer.watchdog_timeout`` seconds; hang reports go next to the run's logs and checkpoints."""
    return Watchdog(
        timeout_s=trainer_cfg.watchdog_timeout, report_dir=os.path.join(str(trainer_cfg.default_local_dir), "watchdog")
    )


class RayPPOTrainer:
    """``RayPPOTrainer(config, tokenizer, train_dataloader, val_dataset, reward_fn, val_reward_fn)``.

    ``config`` is the validated ``PPOTrainerConfig`` (veRL's composed DictConfig is read into one here,
    the door; below it everything reads typed sections). The dataloader is resumable
    (``state_dict``/``load_state_dict``) so a resumed run sees exactly the prompts it would have seen.
    """

    def __init__(self, config, tokenizer, train_dataloader, val_dataset, reward_fn, val_reward_fn, collate_fn=None):
        self.config = config = as_section(config, PPOTrainerConfig)
        self.tokenizer = tokenizer
        self.train_dataloader = train_dataloader
        self.val_dataset = val_dataset
        self.collate_fn = collate_fn
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        algo = config.algorithm
        # veRL's rule: critic.enable decides when set, else a critic exactly for GAE
        enable_critic = config.critic.enable
        self.use_critic = (
            algo.adv_estimator == core_algos.AdvantageEstimator.GAE.value
            if enable_critic is None
            else bool(enable_critic)
        )
        actor = config.actor_rollout_ref.actor
        self.use_reference_policy = bool(algo.use_kl_in_reward or actor.use_kl_loss)
        # a generative reward model (genrm) is served on rollout engines; any other is a sequence classifier
        self.use_judge = uses_judge(config)
        self.use_rm = bool(config.reward.reward_model.enable) and not self.use_judge
        self.judge = None
        self.teachers = None  # distillation teachers (teacher_setup.py), built with the workers
        self.kl_ctrl_in_reward = core_algos.get_kl_controller(algo.kl_ctrl) if algo.use_kl_in_reward else None
        self.adv_fn = core_algos.get_adv_estimator_fn(algo.adv_estimator)
        self._adv_params = set(inspect.signature(self.adv_fn).parameters)
        self.n_devices = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
        self.total_training_steps = self._total_steps()
        self.global_steps = 0
        self.actor_version = 0  # actor updates so far: the weight version the rollout should be at
        self.failed_saves = 0  # saves that failed and were let pass (trainer.continue_after_failed_save)
        self.checkpoint_callback = build_checkpoint_callback(config)  # runs after each complete save
        self.hybrid_engine = not separated_rollout(config)  # colocated: the actor's process also generates
        v1 = config.trainer.v1
        # veRL's V1 asynchronous modes (rollout_source.py): colocate_async moves the weights itself, like a
        # separate pool's push; separate_async trains parameter_sync_step mini-batches a step
        self.colocate_async = v1.trainer_mode == "colocate_async"
        self.source_pushes_weights = not self.hybrid_engine or self.colocate_async
        self.cycle_length = int(v1.separate_async.parameter_sync_step) if v1.trainer_mode == "separate_async" else 1
        self.cycle_position = 0  # the mini-batch of the cycle being trained (π_old: the cycle's first weights)
        # rollout dumps (trainer.rollout_data_dir / validation_data_dir) and replay (trainer.skip)
        self.rollout_recorder = RolloutRecorder(
            tokenizer, config.trainer, config.skip.rollout, int(config.actor_rollout_ref.rollout.n)
        )
        # one stream of prompt batches, epoch after epoch: the loop and dynamic sampling's refills share it
        self.prompt_batches = EpochCycler(train_dataloader)
        # off-policy correction (algorithm.rollout_correction): bypass mode reuses the rollout's
        # log-probs as π_old and lets the actor weight/mask per micro-batch
        self.rollout_correction = algo.rollout_correction
        self._actor_update_meta = (
            {"rollout_correction": self.rollout_correction} if self.rollout_correction.bypass_mode else {}
        )
        self.filter_groups = algo.filter_groups or FilterGroupsConfig()
        # π_old: the rollout engine's own log-probs (bypass mode, async_training.use_rollout_log_probs),
        # else recomputed by the actor
        self.rollout_is_old_policy = self.rollout_correction.bypass_mode or (
            config.async_training.mode != "sync" and config.async_training.use_rollout_log_probs
        )
        self.watchdog = watchdog_of(config.trainer)

    def _total_steps(self) -> int:
        t = self.config.trainer
        return (
            int(t.total_training_steps) if t.total_training_steps else len(self.train_dataloader) * int(t.total_epochs)
        )

    # --------------------------------------------------------------------------------- workers
    def init_workers(self):
        groups = build_worker_groups(
            self.config,
            use_critic=self.use_critic,
            use_ref=self.use_reference_policy,
            use_rm=self.use_rm,
            use_judge=self.use_judge,
        )
        for group in groups.values():
            group.set_watchdog(self.watchdog)  # every wait on these workers now has the run's deadline
        self.actor_rollout_wg = groups["actor_rollout"]
        self.rollout_wg = groups["rollout"]  # the same group as the actor's unless the rollout has its own pool
        self.critic_wg = groups.get("critic")
        self.rm_wg = groups.get("rm")
        self._all_groups = groups
        if self.critic_wg is not None:
            self.critic_wg.init_model()
        if self.rm_wg is not None:
            self.rm_wg.init_model()
        if self.use_judge:
            self.judge = start_judge(groups[JUDGE_ROLE], self.config, [self.reward_fn, self.val_reward_fn])
        # on-policy distillation: the teachers' engines, and the loss section the actor reads per update
        self.teachers = Teachers(self.config, groups, self.tokenizer) if self.config.distillation.enabled else None
        if self.teachers is not None:
            self._actor_update_meta["distillation"] = self.config.distillation.distillation_loss
        self.actor_rollout_wg.init_model()
        if self.rollout_wg is not self.actor_rollout_wg:
            self.rollout_wg.init_model()
        template_kwargs = self.config.data.apply_chat_template_kwargs or {}
        async_cfg = self.config.async_training
        settings = agent_loop_settings(
            self.config.actor_rollout_ref.rollout, template_kwargs, run_dir=self.config.trainer.default_local_dir
        )
        self.async_rollout_manager = AgentLoopManager(
            settings,
            self.rollout_wg,
            self.tokenizer,
            role=rollout_role_name(self.config),
            hybrid_engine=not self.source_pushes_weights,
            resume_on_abort=(async_cfg.mode == "fully_async" and bool(async_cfg.partial_rollout))
            or self.config.trainer.v1.trainer_mode != "sync",
            reward=streamed_reward(self.reward_fn, self.use_rm),  # reward.num_workers: scored as each finishes
        )
        self.rollout_source = make_rollout_source(
            self.config,
            self.async_rollout_manager,
            self.prompt_batches,
            self.rollout_wg,
            push_weights=self.push_weights_to_rollout if self.source_pushes_weights else None,
            max_inflight_batches=self.filter_groups.max_inflight_gen_batches if self.filter_groups.enable else 0,
        )

    def push_weights_to_rollout(self, version: int) -> dict:
        """Send the actor's weights to the rollout pool, stamped ``version`` (colocate_async: wake the
        colocated engines and load them)."""
        if self.hybrid_engine:
            return self.async_rollout_manager.prepare_rollout(version, self.global_steps)
        targets = self.rollout_wg.handles(WEIGHT_RECEIVER, rollout_role_name(self.config))  # per backend
        for target in targets:
            target.group = self.rollout_wg.name  # names a receiver that failed
        during = f"the weight push (version {version}) to the separate rollout pool"
        with engine_death_named(self.async_rollout_manager.engine, during, self.global_steps):
            per_rank = self.actor_rollout_wg.send_weights(targets, version)
        return per_rank[0]  # rank 0 sent; the others only took part in the gathers

    def shutdown_workers(self) -> None:
        """Kill the worker processes and free their placement groups: a later run in the same Ray
        session (a notebook, a test session, a sweep) gets the CPUs/GPUs back. Each piece is let go
        before it is stopped, so a second call (``run_ppo``'s, after ``fit`` shut down on a failure)
        never repeats a step that failed; groups the watchdog shut down are skipped."""
        source, self.rollout_source = getattr(self, "rollout_source", None), None
        if source is not None:
            source.close()
        judge, self.judge = getattr(self, "judge", None), None
        if judge is not None:
            judge.close()
            # engines with processes of their own (vllm) stop them cleanly; a dead worker: killing the group
            # below is all that is left to do
            cleanup_after_failure((getattr(self, "_all_groups", {}) or {}).get(JUDGE_ROLE), "shutdown_judge")
        manager, self.async_rollout_manager = getattr(self, "async_rollout_manager", None), None
        if manager is not None:
            manager.shutdown()
        rollout_wg, self.rollout_wg = getattr(self, "rollout_wg", None), None
        cleanup_after_failure(rollout_wg, "shutdown_rollout")  # engines with processes of their own (vllm) stop cleanly
        groups, self._all_groups = getattr(self, "_all_groups", {}) or {}, {}
        for group in {id(g): g for g in groups.values() if g is not None}.values():
            group.shutdown()  # its workers, and the resource pool it owns (again, for one the watchdog shut down)

    # --------------------------------------------------------------------------------- phases
    def _fill_with_informative_groups(self, batch: DataProto, timing: dict, metrics: dict) -> DataProto:
        """algorithm.filter_groups (DAPO): drop the groups whose metric is uniform and generate and
        score more from the same rollout source until the step is full; also refills the groups the
        source dropped for a failed trajectory (trainer.v1.sampler.sync_refill_failed_groups)."""
        first_round, rounds = dict(metrics), []

        def refill(missing_groups: int, batches_so_far: int) -> tuple[DataProto, int]:
            rounds.append(round_metrics := {})
            request = (missing_groups, batches_so_far, self.filter_groups.max_num_gen_batches)
            more, prompt_batches = self.rollout_source.refill(
                *request, timing, round_metrics, self.global_steps, self.actor_version
            )
            with timer("reward", timing):
                self.compute_reward(more, round_metrics)
            return more, prompt_batches

        target = self.rollout_source.prompts_per_step
        batch, fill_metrics = fill_with_informative_groups(batch, target, self.filter_groups, refill)
        if rounds:  # one step's metrics over its rounds: times, sizes and failed groups add up, the rest is averaged
            metrics.update(merge_round_metrics([first_round, *rounds]))
            if FAILED_GROUPS in first_round or any(FAILED_GROUPS in r for r in rounds):
                metrics[FAILED_GROUPS] = sum(r.get(FAILED_GROUPS, 0) for r in [first_round, *rounds])
        metrics.update(fill_metrics)
        return batch

    def _balance_batch(self, batch: DataProto, metrics: dict) -> None:
        """Reorder rows so every data-parallel rank gets a similar number of tokens."""
        seqlens = batch.batch["attention_mask"].sum(-1).tolist()
        k = self.actor_rollout_wg.world_size
        order = balanced_order(seqlens, k)
        if order is None:
            return
        metrics.update(seqlen_balance_metrics(seqlens, k, order))
        batch.reorder(torch.tensor(order))
        batch.meta_info["balance_order"] = order  # row r was generated at order[r] (rollout dumps undo it)

    def compute_reward(self, batch: DataProto, metrics: dict) -> None:
        if self.use_rm:
            batch.batch["rm_scores"] = self.rm_wg.compute_rm_score(batch).batch["rm_scores"]
        result = self.reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        metrics.update(result.get("reward_metrics") or {})  # e.g. genrm's judged / unparsable counts
        for key, values in (result.get("reward_extra_info") or {}).items():  # as veRL: per-sample extra fields
            column = np.empty(len(values), dtype=object)  # one object per row, even for list values
            for i, value in enumerate(values):
                column[i] = value
            batch.non_tensor_batch[key] = column

    def _compute_old_log_prob(self, batch: DataProto, metrics: dict) -> None:
        if self.cycle_length > 1:  # separate_async: π_old is the cycle's first weights for every mini-batch
            batch.meta_info["pi_old_snapshot"] = "use" if self.cycle_position else "save"
        out = self.actor_rollout_wg.compute_log_prob(batch)
        batch.meta_info.pop("pi_old_snapshot", None)
        out.meta_info.pop("metrics", None)
        entropy = out.batch["entropys"]
        metrics["actor/entropy"] = core_algos.agg_loss(
            entropy, batch.batch["response_mask"], self.config.actor_rollout_ref.actor.loss_agg_mode
        )
        batch.batch["old_log_probs"] = out.batch["old_log_probs"]
        if "sum_pi_squared" in out.batch.keys():  # actor.calculate_sum_pi_squared (optimal token baseline)
            batch.batch["sum_pi_squared"] = out.batch["sum_pi_squared"]
        if "rollout_log_probs" in batch.batch.keys():  # the engine's own log-probs: is it sampling the trained policy?
            metrics.update(
                rollout_probs_diff_metrics(
                    batch.batch["rollout_log_probs"], batch.batch["old_log_probs"], batch.batch["response_mask"]
                )
            )

    def _rollout_log_probs_as_old(self, batch: DataProto) -> None:
        """Bypass mode / async_training.use_rollout_log_probs: π_old is the rollout engine's policy, no
        recomputation."""
        if "rollout_log_probs" not in batch.batch.keys():
            raise ValueError(
                "algorithm.rollout_correction.bypass_mode=True or async_training.use_rollout_log_probs=True "
                "needs the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True"
            )
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]

    def _apply_rollout_correction(self, batch: DataProto, metrics: dict) -> None:
        """Decoupled mode, once per batch: truncated IS weights π_old/π_rollout for the policy loss and
        rejection of tokens/sequences in the response mask (before advantages, as veRL); logged
        whenever the rollout returned log-probs. Bypass mode does this in the actor instead."""
        b = batch.batch
        if self.rollout_correction.bypass_mode or "rollout_log_probs" not in b.keys():
            return
        weights, b["response_mask"], corr_metrics = compute_rollout_correction(
            b["old_log_probs"], b["rollout_log_probs"], b["response_mask"], self.rollout_correction
        )
        if weights is not None:
            b["rollout_is_weights"] = weights
        metrics.update(corr_metrics)

    def _compute_ref_log_prob(self, batch: DataProto) -> None:
        batch.batch["ref_log_prob"] = self.actor_rollout_wg.compute_ref_log_prob(batch).batch["ref_log_prob"]

    def _compute_values(self, batch: DataProto) -> None:
        batch.batch["values"] = self.critic_wg.compute_values(batch).batch["values"]

    def _apply_reward_kl(self, batch: DataProto, metrics: dict) -> None:
        b = batch.batch
        if self.kl_ctrl_in_reward is None:
            b["token_level_rewards"] = b["token_level_scores"]
            return
        rewards, kl_metrics = core_algos.apply_kl_penalty_to_rewards(
            b["token_level_scores"],
            b["old_log_probs"],
            b["ref_log_prob"],
            b["response_mask"],
            self.kl_ctrl_in_reward,
            self.config.algorithm.kl_penalty,
        )
        b["token_level_rewards"] = rewards
        metrics.update(kl_metrics)

    def _compute_advantage(self, batch: DataProto) -> None:
        """On the driver: pure tensor functions from the advantage-estimator registry."""
        b = batch.batch
        algo = self.config.algorithm
        # inputs only some estimators read, passed when the estimator's signature names them (veRL
        # passes the same ones by estimator name): per-sample reward components (gdpo), the actor's
        # old log-probs, sum of squared probabilities and IS weights (optimal token baseline)
        extra = {key: b[key] if key in b.keys() else None for key in _OPTIONAL_ADV_TENSORS if key in self._adv_params}
        if "non_tensor_batch" in self._adv_params:
            extra["non_tensor_batch"] = batch.non_tensor_batch
        if "batch" in self._adv_params:
            extra["batch"] = b
        advantages, returns = self.adv_fn(
            token_level_rewards=b["token_level_rewards"],
            response_mask=b["response_mask"],
            values=b["values"] if "values" in b.keys() else None,
            index=batch.non_tensor_batch["uid"],
            reward_baselines=b["reward_baselines"] if "reward_baselines" in b.keys() else None,
            gamma=algo.gamma,
            lam=algo.lam,
            config=algo,
            **extra,
        )
        b["advantages"], b["returns"] = advantages, returns

    def _pf_ppo_resample(self, batch: DataProto, metrics: dict) -> None:
        """algorithm.use_pf_ppo: the batch redrawn with replacement, weighted by sequence score (seeded by
        data.seed and the step, so a rerun draws the same rows)."""
        pf = self.config.algorithm.pf_ppo
        generator = torch.Generator().manual_seed(int(self.config.data.seed) * 1_000_003 + self.global_steps)
        scores = batch.batch["token_level_scores"].sum(-1)
        indices = pf_ppo_resample_indices(scores, str(pf.reweight_method), float(pf.weight_pow), generator)
        batch.reorder(indices)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        batch.meta_info.pop("balance_order", None)  # rows no longer map one-to-one to the generation order
        metrics["pf_ppo/unique_rows"] = float(len(set(indices.tolist())))

    def _update_critic(self, batch: DataProto, metrics: dict) -> None:
        out = self.critic_wg.update_critic(batch)
        metrics.update(out.meta_info["metrics"])

    def _update_actor(self, batch: DataProto, metrics: dict) -> None:
        batch.meta_info["temperature"] = float(self.config.actor_rollout_ref.rollout.temperature)
        batch.meta_info.update(self._actor_update_meta)
        out = self.actor_rollout_wg.update_actor(batch)
        metrics.update(out.meta_info["metrics"])
        self.actor_version += 1
        self.rollout_source.after_update(self.actor_version, metrics)  # new weights to a separate rollout pool

    # --------------------------------------------------------------------------------- one step
    def train_cycle(self, prompts: DataProto) -> dict[str, float]:
        """One global step: ``train_step`` once, or (V1 separate_async) once per mini-batch of the weight
        sync cycle, each on the groups finished by then; times add up, the other metrics are averaged."""
        if self.cycle_length == 1:
            return self.train_step(prompts)
        rounds = []
        for position in range(self.cycle_length):
            self.cycle_position = position
            rounds.append(self.train_step(prompts))
        return reduce_metrics(merge_round_metrics(rounds))

    def train_step(self, prompts: DataProto) -> dict[str, float]:
        """One PPO/GRPO step, every phase timed as ``timing_s/<phase>``. ``prompts``: what the rollout
        source's ``inputs`` gave (a dataloader batch; a ticket in the asynchronous modes).

        ``trainer.rollout_only=True`` (hybridflow's key; veRL's ``trainer.val_only`` only validates):
        generate, score, values and advantages, no log-probs and no update: to look at what a policy
        produces on the training prompts or to write dumps for later replay."""
        training = not self.config.trainer.rollout_only
        metrics: dict = {}
        timing: dict = {}
        with timer("step", timing):
            batch = self.rollout_recorder.replay(prompts, self.global_steps, timing)  # trainer.skip: a dump
            if batch is None:
                batch = self.rollout_source.generate(prompts, timing, metrics, self.global_steps, self.actor_version)
            with timer("reward", timing):
                self.compute_reward(batch, metrics)  # rule / RM scores
            missing = len(set(batch.non_tensor_batch["uid"])) < self.rollout_source.prompts_per_step  # failed groups
            if training and (self.filter_groups.enable or missing):
                batch = self._fill_with_informative_groups(batch, timing, metrics)
            if training and self.config.trainer.balance_batch:
                self._balance_batch(batch, metrics)
            batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
            if training and self.teachers is not None:
                with timer("teacher", timing):
                    self.teachers.score(batch)  # the teachers' log-probs at the student's response tokens
            if training:
                with timer("old_log_prob", timing):
                    if self.rollout_is_old_policy:
                        self._rollout_log_probs_as_old(batch)  # π_old = π_rollout
                    else:
                        self._compute_old_log_prob(batch, metrics)  # π_old
            if training and self.use_reference_policy:
                with timer("ref", timing):
                    self._compute_ref_log_prob(batch)  # π_ref
            if self.use_critic:
                with timer("values", timing):
                    self._compute_values(batch)  # V(s)
            with timer("adv", timing):
                if training:
                    self._apply_reward_kl(batch, metrics)  # r - β·KL
                    self._apply_rollout_correction(batch, metrics)  # IS weights, rejection
                else:
                    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]  # no reference pass
                self._compute_advantage(batch)  # A, R on the driver
                if training and self.config.algorithm.use_pf_ppo:
                    self._pf_ppo_resample(batch, metrics)  # PF-PPO: rows by reward
            if training and self.use_critic:
                with timer("update_critic", timing):
                    self._update_critic(batch, metrics)
            # veRL's rule (steps count from 1): the actor trains once global_steps >= critic_warmup
            if training and int(self.config.trainer.critic_warmup) <= self.global_steps:
                with timer("update_actor", timing):
                    self._update_actor(batch, metrics)
        metrics.update(compute_data_metrics(batch, self.use_critic))
        if self.config.algorithm.adv_estimator == "gdpo":  # each reward component's spread, as veRL logs it
            metrics.update(gdpo_component_metrics(batch.non_tensor_batch, self.config.algorithm.gdpo_reward_keys))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughput_metrics(batch, timing["step"], self.n_devices))
        metrics.update(self.rollout_recorder.after_step(batch, self.global_steps))  # trainer.rollout_data_dir
        return reduce_metrics(metrics)

    # --------------------------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """val_kwargs.n responses per validation prompt, scored by the validation reward function;
        veRL's metrics (``metric_utils.validation_metrics``): val-core/<source>/<var>/mean@N,
        best@N/mean, maj@N/mean, the rest under val-aux."""
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        n = int(val_kwargs.n)
        batch = DataProto.from_single_dict(self.collate_fn([self.val_dataset[i] for i in self._validation_order()]))
        batch = batch.repeat(repeat_times=n, interleave=True)
        # one id per prompt, shared by its n responses (rows r // n): the groups of best@N / maj@N
        uids = (
            list(batch.non_tensor_batch["uid"])
            if "uid" in batch.non_tensor_batch
            else [r // n for r in range(len(batch))]
        )
        meta = {"validate": True, "do_sample": bool(val_kwargs.do_sample), "global_steps": self.global_steps}
        out = self.async_rollout_manager.generate_sequences(rollout_request(batch, meta))
        rollout_metrics = out.meta_info.pop("metrics", {})
        batch = without_prompt_tensors(batch).union(out)
        result = self.val_reward_fn(batch, return_dict=True)
        scores = result["reward_tensor"].sum(-1).tolist()
        self._log_val_generations(batch, scores)
        self.rollout_recorder.after_validation(batch, scores, self.global_steps)  # trainer.validation_data_dir
        # the per-sample variables: the reward, then what the scorer returned beside it (acc, pred, ...)
        infos = {"reward": scores}
        infos.update({k: list(v) for k, v in (result.get("reward_extra_info") or {}).items() if k != "reward"})
        out = validation_metrics(batch.non_tensor_batch[self.config.data.reward_fn_key], uids, infos)
        # the agent loops' per-trajectory numbers on the validation set (turns, tool calls, failures)
        out.update(reduce_metrics({f"val-aux/{k}": v for k, v in rollout_metrics.items() if k.startswith("agent/")}))
        if "num_turns" in batch.non_tensor_batch:  # veRL's names for the same turn counts
            turns = np.asarray(batch.non_tensor_batch["num_turns"], dtype=np.float64)
            out.update(
                {
                    "val-aux/num_turns/min": float(turns.min()),
                    "val-aux/num_turns/max": float(turns.max()),
                    "val-aux/num_turns/mean": float(turns.mean()),
                }
            )
        return out

    def _validation_order(self) -> list[int]:
        """The validation rows in file order, or with ``data.validation_shuffle`` in an order drawn from
        (data.seed, global step): which samples log_val_generations shows changes from one validation to the next."""
        n = len(self.val_dataset)
        if not self.config.data.validation_shuffle:
            return list(range(n))
        seed = int(self.config.data.seed) if self.config.data.seed is not None else 0
        return np.random.default_rng([seed, int(self.global_steps)]).permutation(n).tolist()

    def _log_val_generations(self, batch: DataProto, scores) -> None:
        k = int(self.config.trainer.log_val_generations or 0)
        if k <= 0:
            return
        responses = self.tokenizer.batch_decode(batch.batch["responses"][:k], skip_special_tokens=True)
        for text, score in zip(responses, scores[:k]):
            logger.info("[val sample] score=%.3f response=%r", score, text)

    # --------------------------------------------------------------------------------- checkpoints
    def _for_each_group(self, method: str, *args) -> list:
        """Call a registered method once on every distinct role group that has it (a shared group once; the
        fused groups behind the role views are skipped; the reward model's and judge's workers have no
        profiler, for one)."""
        groups = {
            id(g): g
            for name, g in (getattr(self, "_all_groups", {}) or {}).items()
            if g is not None and not name.startswith("_") and hasattr(g, method)
        }
        return [getattr(g, method)(*args) for g in groups.values()]

    def _ckpt_to_keep(self) -> int | None:
        """Step dirs hold every role, so the longer of the roles' retentions wins (None/<=0: keep all)."""
        t = self.config.trainer
        limits = [t.max_actor_ckpt_to_keep] + ([t.max_critic_ckpt_to_keep] if self.use_critic else [])
        if any(n is None or int(n) <= 0 for n in limits):
            return None
        return max(int(n) for n in limits)

    def _check_finite_weights(self) -> None:
        """Never write a checkpoint that would resume into NaN: a skipped step cannot poison weights,
        but anything else that does (a custom loss, a bad load) is caught here, before the save."""
        sums = self.actor_rollout_wg.parameter_checksum()
        if not all(math.isfinite(s) for s in sums):
            raise FloatingPointError(
                f"refusing to save the checkpoint of step {self.global_steps}: the actor's weights contain NaN/inf "
                f"(|w| sums per rank: {sums}). The last complete checkpoint under "
                f"{self.config.trainer.default_local_dir!r} is kept."
            )

    def save_checkpoint(self) -> str:
        """Workers write into a tmp dir; it becomes ``global_step_N`` (and ``latest``) only when whole.

        A failed write (a full disk, a lost mount: any writer, driver or worker) removes the tmp dir, so
        the previous complete checkpoint stays the latest, and raises ``CheckpointSaveError`` naming the
        writer and the path. A hang or a dead worker is raised as it is."""
        root = self.config.trainer.default_local_dir
        self._check_finite_weights()
        tmp = ckpt.begin_save(root, self.global_steps)
        self._saving_tmp = tmp
        writer = f"the driver into {tmp}"
        try:
            writer = f"the actor workers into {ckpt.role_dir(tmp, 'actor')}"
            self.actor_rollout_wg.save_checkpoint(ckpt.role_dir(tmp, "actor"), self.global_steps)
            if self.use_critic:
                writer = f"the critic workers into {ckpt.role_dir(tmp, 'critic')}"
                self.critic_wg.save_checkpoint(ckpt.role_dir(tmp, "critic"), self.global_steps)
            writer = f"the driver into {os.path.join(tmp, ckpt.DATA_FILE)}"
            ckpt.save_dataloader_state(
                tmp,
                {
                    **self.rollout_source.data_state(self.global_steps),
                    "global_steps": self.global_steps,
                    "actor_version": self.actor_version,
                    "kl_ctrl": getattr(self.kl_ctrl_in_reward, "value", None),
                    "driver_rng": get_rng_state(),
                },
            )
            writer = f"the driver committing {tmp}"
            final = ckpt.commit_save(root, self.global_steps, tmp)
        except BaseException as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, Exception) and not isinstance(e, (WorkerHangError, WorkerDiedError)):
                raise ckpt.CheckpointSaveError(self.global_steps, writer, e) from e
            raise
        finally:
            self._saving_tmp = None
        ckpt.prune_checkpoints(root, self._ckpt_to_keep())
        try:
            self.checkpoint_callback.on_save(
                trainer=self, global_step=self.global_steps, checkpoint_dir=final, async_save=False
            )
        except Exception as e:
            e.add_note(f"raised by trainer.checkpoint_callback_class's on_save; the checkpoint {final} is complete")
            raise
        return final

    def _save_or_note_failure(self, metrics: dict) -> None:
        """A save that fails ends the run, unless ``trainer.continue_after_failed_save`` lets the next
        save try again (the failure is logged and counted in ``checkpoint/failed_saves``)."""
        with timer("save_checkpoint", timings := {}):
            try:
                self.save_checkpoint()
            except ckpt.CheckpointSaveError as e:
                if not self.config.trainer.continue_after_failed_save:
                    raise
                self.failed_saves += 1
                logger.error("%s; training goes on (trainer.continue_after_failed_save=True)", e)
        metrics["timing_s/save_checkpoint"] = timings["save_checkpoint"]
        metrics["checkpoint/failed_saves"] = self.failed_saves

    def load_checkpoint(self) -> int:
        """Restore weights, optimizer, LR schedule, RNG (workers and driver) and the data position;
        returns the step to continue from (0 when starting fresh)."""
        t = self.config.trainer
        ckpt.cleanup_partial_saves(t.default_local_dir)
        path = ckpt.resumable_checkpoint(t, ["actor"] + (["critic"] if self.use_critic else []))
        if path is None:
            if self.source_pushes_weights:  # a separate pool's engine may hold random (load_format=dummy) or base
                self.push_weights_to_rollout(self.actor_version)  # (LoRA) weights: give it the trainer's
            return 0
        state = ckpt.load_dataloader_state(path, restorable=CHECKPOINT_TYPES)
        if state is None:
            raise FileNotFoundError(f"checkpoint {path!r} has no {ckpt.DATA_FILE} (driver state): cannot resume")
        if state.get("driver_rng") is not None:
            set_rng_state(state["driver_rng"])  # first: in-process workers share it and restore their own below
        self.actor_rollout_wg.load_checkpoint(ckpt.role_dir(path, "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(ckpt.role_dir(path, "critic"))
        self.global_steps = int(state["global_steps"])
        self.actor_version = int(state.get("actor_version", self.global_steps))
        self.rollout_source.load_data_state(state, self.global_steps)
        if self.source_pushes_weights:  # a separate rollout pool loaded the base model: give it the resumed weights
            self.push_weights_to_rollout(self.actor_version)
        if self.kl_ctrl_in_reward is not None and state.get("kl_ctrl") is not None:
            self.kl_ctrl_in_reward.value = state["kl_ctrl"]
        logger.info("resumed from %s (global step %s)", path, state["global_steps"])
        return int(state["global_steps"])

    # --------------------------------------------------------------------------------- the loop
    def fit(self) -> dict[str, float]:
        """Train to ``total_training_steps`` (``trainer.val_only``: validate once instead). On any failure
        (a worker error or death, Ctrl-C) the save in progress is removed, the workers are shut down and the
        error re-raised with the step and the checkpoint a ``resume_mode=auto`` rerun would continue from."""
        t = self.config.trainer
        tracking = Tracking(
            t.project_name, t.experiment_name, list(t.logger), to_dict(self.config), log_dir=t.default_local_dir
        )
        try:
            return self._fit(tracking)
        except BaseException as e:
            self._abort(e)
            raise
        finally:
            tracking.finish()

    def _fit(self, tracking) -> dict[str, float]:
        t = self.config.trainer
        self.global_steps = self.load_checkpoint()
        if t.val_only:  # veRL's evaluation run: the (resumed) policy on the validation set, nothing trained
            return self._validate_only(tracking)
        last: dict[str, float] = {}
        if self.val_reward_fn is not None and t.val_before_train and self.global_steps == 0:
            last = self.validate()
            tracking.log(last, step=0)
        progress = Progress(self.total_training_steps, self.global_steps, desc="training")
        profiled, continuous = profiled_steps(self.config.global_profiler)
        for prompts in self.rollout_source.inputs(self.global_steps, self.actor_version):
            if self.global_steps >= self.total_training_steps:
                break
            self.global_steps += 1
            start_profile, stop_profile = profile_span(self.global_steps, profiled, continuous)
            if start_profile:
                self._for_each_group("start_profile", self.global_steps)
            metrics = self.train_cycle(prompts)
            if stop_profile:
                traces = [p for ranks in self._for_each_group("stop_profile") for paths in ranks for p in paths]
                logging.getLogger(__name__).info("step %d: torch.profiler traces %s", self.global_steps, traces)
            is_last = self.global_steps >= self.total_training_steps
            if self.val_reward_fn is not None and t.test_freq > 0 and (is_last or self.global_steps % t.test_freq == 0):
                metrics.update(self._timed_validation())
            if t.save_freq > 0 and (is_last or self.global_steps % t.save_freq == 0):
                self._save_or_note_failure(metrics)
            metrics["training/global_step"] = self.global_steps
            tracking.log(metrics, step=self.global_steps)
            progress.update(score=metrics.get("critic/score/mean", float("nan")))
            last = metrics
        progress.close()
        return last

    def _timed_validation(self) -> dict[str, float]:
        """``validate``'s metrics with its wall time as ``timing_s/testing``."""
        with timer("testing", timings := {}):
            metrics = self.validate()
        metrics["timing_s/testing"] = timings["testing"]
        return metrics

    def _validate_only(self, tracking) -> dict[str, float]:
        """``trainer.val_only=True``: validate at the loaded step (0 without a checkpoint), log, return."""
        if self.val_reward_fn is None:
            raise ValueError("trainer.val_only=True needs a validation reward function; this trainer has none")
        metrics = self._timed_validation()
        metrics["training/global_step"] = self.global_steps
        tracking.log(metrics, step=self.global_steps)
        return metrics

    def _abort(self, error: BaseException) -> None:
        tmp = getattr(self, "_saving_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        try:
            self.shutdown_workers()  # kill the workers, then free their placement groups for a rerun
        except Exception:  # best effort: the original error is what matters
            pass
        resume = ckpt.find_latest_checkpoint(self.config.trainer.default_local_dir)
        error.add_note(
            f"hybridflow: training stopped at global step {self.global_steps}; workers shut down; "
            + (
                f"a rerun with trainer.resume_mode=auto continues from {resume}"
                if resume
                else "no complete checkpoint to resume from"
            )
        )
