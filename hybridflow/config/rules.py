"""The rules of a PPO run that span sections, and the batch arithmetic the sections share.

A rule about one section's own keys lives in that section's ``validate``; a rule that reads keys of
several sections lives here. ``check_ppo_trainer`` (``PPOTrainerConfig.validate``) runs both, once per
launch, and reports every problem at once; every message names the full keys. Checks that ask a registry
above config/ (tool parsers, agent loops, trace and Ray backends) live beside that registry and are run by
the entry point (``hybridflow.trainer.config_checks``).

Batch sizes: ``ppo_mini_batch_size`` counts prompts for the whole job (x rollout.n samples, split over the
data-parallel ranks); ``*_micro_batch_size`` (deprecated) is global, ``*_micro_batch_size_per_gpu`` per
rank; with dynamic batch size a token budget per rank replaces the micro-batch size.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.errors import ConfigError
from hybridflow.config.ray import timeline_problem
from hybridflow.utils.torch_dtypes import cpu_has_fast_bf16, resolve_dtype

__all__ = [
    "Problems",
    "check_ppo_trainer",
    "data_parallel_size",
    "per_rank_micro_batch",
    "check_token_budget",
    "check_update_batches",
    "check_sp_needs_remove_padding",
    "forward_pass",
    "per_rank_mini_batch",
    "per_rank_update",
    "GROUP_ESTIMATORS",
    "SUM_PI_SQUARED_ESTIMATORS",
]

# Advantage estimators that compare the n responses of one prompt with each other.
GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline")
# estimators that read the actor's sum of squared token probabilities
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")

_AREF, _ROLLOUT, _RC = "actor_rollout_ref", "actor_rollout_ref.rollout", "algorithm.rollout_correction"


@dataclass
class Problems:
    """Errors and notes collected over several rules, so that one check reports every problem at once."""

    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def raise_errors(self) -> list[str]:
        """ConfigError with one error per line when there are any; else the notes."""
        if self.errors:
            raise ConfigError("\n".join(self.errors))
        return self.notes

    def run(self, validate, *args, **kwargs) -> None:
        """A section's ``validate``: its errors (one per line) and notes are collected here."""
        try:
            self.notes.extend(validate(*args, **kwargs) or [])
        except ConfigError as e:
            self.errors.extend(str(e).splitlines())

    def positive(self, key: str, value) -> int | None:
        """``value`` when it is a positive integer, else None with an error naming ``key``."""
        if _is_positive(value):
            return value
        self.errors.append(f"{key} must be a positive integer, got {value!r}")
        return None


def _is_positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def data_parallel_size(p: Problems, path: str, world: int, sp: int) -> int | None:
    """World size / the section's Ulysses size (the ranks of an SP group share one data-parallel slot)."""
    if world % sp:
        p.errors.append(f"world size {world} is not divisible by {path}.ulysses_sequence_parallel_size ({sp})")
        return None
    return world // sp


def per_rank_mini_batch(path: str, mini: int, n: int, dp: int) -> int:
    """veRL's normalisation of ``ppo_mini_batch_size``: prompts for the job -> samples per rank."""
    samples = mini * n
    if samples % dp:
        raise ConfigError(
            f"{path}.ppo_mini_batch_size ({mini}) * rollout.n ({n}) = {samples} samples per optimizer "
            f"step do not split evenly over {dp} data-parallel ranks"
        )
    return samples // dp


def per_rank_update(section: Any, dp: int, n: int) -> Any:
    """A copy of an actor or critic section with veRL's per-rank batch sizes: ``ppo_mini_batch_size`` in
    samples on one rank (prompts x ``n`` / ``dp``), and ``ppo_micro_batch_size_per_gpu`` from the
    deprecated global ``ppo_micro_batch_size`` when only that is set."""
    out = copy.deepcopy(section)
    out.ppo_mini_batch_size = per_rank_mini_batch(section._path, section.ppo_mini_batch_size, n, dp)
    if section.ppo_micro_batch_size and not section.ppo_micro_batch_size_per_gpu:
        out.ppo_micro_batch_size_per_gpu = max(1, section.ppo_micro_batch_size // dp)
    return out


def per_rank_micro_batch(
    p: Problems,
    path: str,
    name: str,
    total: int | None,
    per_gpu: int | None,
    dp: int,
    world: int | None = None,
    sp: int = 1,
) -> int | None:
    """The per-rank micro-batch size from the pair ``name`` (deprecated, global) / ``name_per_gpu``.
    ``world``: the number of devices, for veRL's message when the global size is below it."""
    if total is None and per_gpu is None:
        p.errors.append(f"set {path}.{name}_per_gpu (samples per forward pass on one device); it is null")
        return None
    if total is not None and per_gpu is not None:
        p.errors.append(
            f"{path}.{name} ({total}) and {path}.{name}_per_gpu ({per_gpu}) are both set; "
            f"set only {name}_per_gpu ({name} is deprecated)"
        )
        return None
    if per_gpu is not None:
        return p.positive(f"{path}.{name}_per_gpu", per_gpu)
    if p.positive(f"{path}.{name}", total) is None:
        return None
    p.notes.append(f"{path}.{name} is deprecated: set {path}.{name}_per_gpu = {name} / data-parallel size")
    if total < dp and world is not None:  # veRL's rule, in its words
        p.errors.append(
            f"{path}.{name} ({total}) x ulysses_sequence_parallel_size ({sp}) must be >= the number of "
            f"devices ({world})"
        )
        return None
    if total % dp:
        p.errors.append(f"{path}.{name} ({total}) is not divisible by the data-parallel size ({dp})")
        return None
    return total // dp


def check_token_budget(p: Problems, path: str, key: str, budget: int, sp: int, longest: int | None) -> None:
    """With dynamic batch size one sequence must still fit in the per-device token budget times the SP
    size (an SP group shares each sequence). ``longest``: data.max_prompt_length + data.max_response_length."""
    if p.positive(f"{path}.{key}", budget) is None or not longest:
        return
    if budget * sp < longest:
        p.errors.append(
            f"{path}.{key} ({budget}) * ulysses_sequence_parallel_size ({sp}) is smaller than one "
            f"sequence: data.max_prompt_length + data.max_response_length = {longest}"
        )


def check_update_batches(
    p: Problems, section: Any, *, world: int, train_batch_size: int | None, longest: int | None
) -> None:
    """Mini-batches (one optimizer step each) and micro-batches (one forward/backward each) of an
    actor or critic ``section`` (its ppo_* keys, ``rollout_n`` and ``sp_size``)."""
    path, mini, n, sp = section._path, section.ppo_mini_batch_size, section.rollout_n, section.sp_size
    dp = data_parallel_size(p, path, world, sp)
    if dp is None or p.positive(f"{path}.ppo_mini_batch_size", mini) is None:
        return
    if train_batch_size is not None:
        if train_batch_size < mini:
            p.errors.append(
                f"data.train_batch_size ({train_batch_size}) must be >= {path}.ppo_mini_batch_size ({mini})"
            )
        elif train_batch_size % mini:
            p.notes.append(
                f"data.train_batch_size ({train_batch_size}) is not a multiple of {path}.ppo_mini_batch_size "
                f"({mini}): the last mini-batch of every step has {train_batch_size % mini} prompts"
            )
    try:
        per_rank = per_rank_mini_batch(path, mini, n, dp)
    except ConfigError as e:
        p.errors.append(str(e))
        return
    if section.use_dynamic_bsz:
        check_token_budget(p, path, "ppo_max_token_len_per_gpu", section.ppo_max_token_len_per_gpu, sp, longest)
        return
    micro, micro_per_gpu = section.ppo_micro_batch_size, section.ppo_micro_batch_size_per_gpu
    per_gpu = per_rank_micro_batch(p, path, "ppo_micro_batch_size", micro, micro_per_gpu, dp, world, sp)
    if per_gpu and per_rank % per_gpu:
        p.errors.append(
            f"{path}.ppo_mini_batch_size ({mini}) * rollout.n ({n}) / {dp} data-parallel ranks = {per_rank} "
            f"samples per rank is not divisible by {path}.ppo_micro_batch_size_per_gpu ({per_gpu})"
        )


def check_sp_needs_remove_padding(p: Problems, path: str, sp: int, model_path: str, remove_padding: bool) -> None:
    """Ulysses sequence parallelism slices packed sequences: it needs the padding-free forward."""
    if sp > 1 and not remove_padding:
        p.errors.append(f"{path}.ulysses_sequence_parallel_size={sp} needs {model_path}.use_remove_padding=True")


# --------------------------------------------------------------------------- the run's rules


def check_ppo_trainer(cfg, device: str, visible_devices: int | None = None, judge_scored: bool = False) -> list[str]:
    """Every section's ``validate`` and the rules across sections of ``cfg``, a ``PPOTrainerConfig`` (not
    imported: it imports this module). ``device``: cpu or cuda (resolved);
    ``visible_devices``: CUDA devices on this node; ``judge_scored``: reward.reward_manager.name grades with a
    judge model (its registry says so). Raises ConfigError listing every error; returns notes."""
    p = Problems()
    aref, algo = cfg.actor_rollout_ref, cfg.algorithm
    rollout = aref.rollout
    p.run(cfg.data.validate)
    p.run(cfg.trainer.validate, device, visible_devices)
    p.run(rollout.validate, device)
    p.run(algo.validate)
    p.run(aref.actor.policy_loss.validate)
    p.run(cfg.async_training.validate)
    p.run(cfg.reward.validate, judge_scored)
    t = cfg.trainer
    world = t.nnodes * t.n_gpus_per_node if _is_positive(t.nnodes) and _is_positive(t.n_gpus_per_node) else None
    train_bs = cfg.data.train_batch_size if _is_positive(cfg.data.train_batch_size) else None
    if world and train_bs:
        _check_batches(p, cfg, world, train_bs, judge_scored)
    if rollout.name == "vllm" and device != "cpu" and world:
        tp, per_node = rollout.tensor_model_parallel_size, t.n_gpus_per_node
        if world % tp or tp > per_node:
            p.errors.append(
                f"{_ROLLOUT}.tensor_model_parallel_size ({tp}) must divide the world size ({world}) and fit in one "
                f"node (trainer.n_gpus_per_node={per_node})"
            )
    _check_algorithm(p, cfg)
    _check_async(p, cfg)
    _check_v1(p, cfg)
    _check_fused_profilers(p, cfg)
    if not aref.nccl_timeout > 0:
        p.errors.append(f"{_AREF}.nccl_timeout={aref.nccl_timeout} must be > 0 (seconds a collective may wait)")
    if problem := timeline_problem(cfg.ray_kwargs, t.backend):
        p.errors.append(problem)
    if device == "cpu":
        _explain_gpu_only(p, cfg, judge_scored)
    return p.raise_errors()


def _check_fused_profilers(p: Problems, cfg) -> None:
    """The actor, its reference and (colocated: rollout.nnodes 0) its rollout run in one worker process, which
    writes one continuous trace unless every enabled role of it asks for a trace per stage: say so where they
    disagree (veRL's torch-profile example sets discrete on the rollout only)."""
    aref = cfg.actor_rollout_ref
    roles = ["actor", "ref"] + (["rollout"] if int(aref.rollout.nnodes or 0) <= 0 else [])
    enabled = {role: getattr(aref, role).profiler for role in roles if getattr(aref, role).profiler.enable}
    torch_of = {role: section.tool_config.torch for role, section in enabled.items() if section.tool_config.torch}
    discrete = sorted(role for role, torch_cfg in torch_of.items() if torch_cfg.discrete)
    continuous = sorted(set(enabled) - set(discrete))
    if discrete and continuous:
        keys = ", ".join(f"{_AREF}.{role}.profiler.tool_config.torch.discrete=True" for role in discrete)
        p.notes.append(
            f"{keys} gives no trace per stage here: the {'/'.join(continuous)} profiler of the same worker process "
            "records one continuous trace (each stage a named range in it); set discrete on every enabled role of "
            "the worker for a trace per stage"
        )


def _check_batches(p: Problems, cfg, world: int, train_bs: int, judge_scored: bool) -> None:
    """Batch arithmetic: each role's own rules live in its section's ``validate`` (actor, ref, critic)."""
    aref, n = cfg.actor_rollout_ref, cfg.actor_rollout_ref.rollout.n
    if (train_bs * n) % world:
        p.errors.append(
            f"data.train_batch_size ({train_bs}) * {_ROLLOUT}.n ({n}) = {train_bs * n} samples "
            f"do not split evenly over the world size trainer.nnodes * trainer.n_gpus_per_node = {world}"
        )
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    p.run(aref.actor.validate, world, train_bs, aref.model, max_sequence_length=longest)
    # the old policy's log-probs run on the actor's ranks (whose section reports an SP size that does not divide
    # the world) with the rollout section's micro-batching
    sp = aref.actor.sp_size
    if world % sp == 0:
        forward_pass(p, _ROLLOUT, aref.rollout, world // sp, sp, longest)
    if aref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        p.run(aref.ref.validate, world, train_bs, aref.model, max_sequence_length=longest)
    if cfg.algorithm.adv_estimator == "gae":  # the critic exists only for GAE
        critic_n = cfg.critic.rollout_n
        if critic_n is not None and critic_n != n:
            p.errors.append(f"critic.rollout_n ({critic_n}) differs from {_ROLLOUT}.n ({n}); leave it unset")
        p.run(cfg.critic.validate, world, train_bs, max_sequence_length=longest)
    # a generative reward model (genrm) is served by a rollout engine: the FSDP worker's batch keys do not apply
    if cfg.reward.reward_model.enable and not judge_scored:
        rm = cfg.reward_model
        sp = rm.ulysses_sequence_parallel_size
        dp = data_parallel_size(p, "reward_model", world, sp)
        if dp:
            forward_pass(p, "reward_model", rm, dp, sp, longest, "", "forward_max_token_len_per_gpu")


def forward_pass(p, path, section, dp, sp, longest, prefix="log_prob_", budget_key="log_prob_max_token_len_per_gpu"):
    """A forward-only pass of ``section`` (the old log-probs of the rollout section, the reference's log-probs,
    the reward model's scores) on ``dp`` ranks of SP size ``sp``: with ``<prefix>use_dynamic_bsz`` a token
    budget that holds one sequence, else a ``<prefix>micro_batch_size`` per rank."""
    if getattr(section, prefix + "use_dynamic_bsz"):
        check_token_budget(p, path, budget_key, getattr(section, budget_key), sp, longest)
    else:
        micro = prefix + "micro_batch_size"
        per_rank_micro_batch(p, path, micro, getattr(section, micro), getattr(section, micro + "_per_gpu"), dp)


def _check_algorithm(p: Problems, cfg) -> None:
    """The estimator, the policy loss and the off-policy correction against the rollout and the actor."""
    algo, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    estimator, n, a = algo.adv_estimator, rollout.n, f"{_AREF}.actor"
    if estimator in GROUP_ESTIMATORS and n <= 1:
        p.errors.append(
            f"algorithm.adv_estimator={estimator} compares the responses sampled for the same prompt, so "
            f"{_ROLLOUT}.n must be > 1 (got {n}); e.g. {_ROLLOUT}.n=5"
        )
    if actor.use_kl_loss and algo.use_kl_in_reward:
        p.notes.append(
            f"warning: {a}.use_kl_loss and algorithm.use_kl_in_reward are both on: the KL to "
            "the reference policy is penalised twice (in the reward and as a loss term)"
        )
    asynchronous = cfg.async_training.mode != "sync"
    rc = algo.rollout_correction
    bypass = rc is not None and rc.bypass_mode
    if estimator in SUM_PI_SQUARED_ESTIMATORS:
        if not actor.calculate_sum_pi_squared:
            p.errors.append(
                f"algorithm.adv_estimator={estimator} needs the actor's sum of squared token "
                f"probabilities: set {a}.calculate_sum_pi_squared=True"
            )
        if bypass or (asynchronous and cfg.async_training.use_rollout_log_probs):
            p.errors.append(
                f"algorithm.adv_estimator={estimator} needs the actor's old log-prob pass (it returns "
                f"sum_pi_squared), which {_RC}.bypass_mode=True / async_training.use_rollout_log_probs=True skip"
            )
    loss_mode = actor.policy_loss.loss_mode
    if loss_mode == "bypass_mode":
        p.errors.append(
            f"{a}.policy_loss.loss_mode=bypass_mode is selected by {_RC}.bypass_mode=True "
            f"(with {_RC}.loss_type ppo_clip or reinforce); set that instead"
        )
    if rc is not None:
        if (rc.bypass_mode or rc.rollout_is or rc.rejection) and not rollout.calculate_log_probs:
            p.errors.append(
                f"{_RC} (bypass_mode, rollout_is or rollout_rs) compares against the rollout's "
                f"log-probs: set {_ROLLOUT}.calculate_log_probs=True"
            )
        if rc.bypass_mode and loss_mode not in ("vanilla", "bypass_mode"):
            p.errors.append(
                f"{_RC}.bypass_mode=True replaces the policy loss (clipped PPO or REINFORCE, per "
                f"{_RC}.loss_type); {a}.policy_loss.loss_mode={loss_mode} would not be used"
            )
        if rc.bypass_mode and rc.loss_type == "ppo_clip" and rc.rollout_is:
            p.notes.append(
                f"{_RC}.bypass_mode=True with loss_type=ppo_clip: the rollout_is weights are logged, "
                "not applied (the PPO ratio already is π_θ/π_rollout); loss_type=reinforce applies them"
            )
    fg = algo.filter_groups
    gen_bs, train_bs = cfg.data.gen_batch_size, cfg.data.train_batch_size
    if gen_bs is not None and gen_bs != train_bs:
        if not _is_positive(gen_bs):
            p.errors.append(f"data.gen_batch_size must be a positive number of prompts (or null), got {gen_bs!r}")
        elif fg is None or not fg.enable:
            p.errors.append(
                f"data.gen_batch_size={gen_bs} (data.train_batch_size={train_bs}) sizes dynamic sampling's "
                "generation batches: set algorithm.filter_groups.enable=True, or leave it null"
            )
        elif cfg.async_training.mode != "sync" or cfg.trainer.v1.trainer_mode != "sync":
            p.errors.append(
                f"data.gen_batch_size={gen_bs}: the asynchronous modes stream prompt groups, not batches; "
                "leave it null there"
            )
    if fg is not None and fg.enable and n == 1:
        p.notes.append(
            f"algorithm.filter_groups.enable=True with {_ROLLOUT}.n=1: a group of one "
            "response is always kept, so nothing is filtered"
        )


def _check_async(p: Problems, cfg) -> None:
    """The asynchronous modes against the rollout: a pool of its own, its log-probs, no over-sampling.
    (async_training's own keys: ``AsyncTrainingConfig.validate``.)"""
    mode, rollout = cfg.async_training.mode, cfg.actor_rollout_ref.rollout
    if mode not in ("one_step_off", "fully_async"):
        return  # sync (its rules are async_training's own), or a mode the section refuses
    if rollout.over_sample_rate > 0:
        p.errors.append(
            f"{_ROLLOUT}.over_sample_rate={rollout.over_sample_rate} cuts the slowest trajectories of a synchronous "
            f"step's batch; async_training.mode={mode} streams prompt groups instead (set it to 0)"
        )
    if rollout.nnodes <= 0:
        p.errors.append(
            f"async_training.mode={mode} generates while the trainer trains, so the rollout needs a pool "
            f"of its own: set {_ROLLOUT}.nnodes (and n_gpus_per_node) > 0"
        )
    if mode == "fully_async" and not rollout.calculate_log_probs:
        p.notes.append(
            f"async_training: {_ROLLOUT}.calculate_log_probs=False, so the staleness "
            "of samples cannot be corrected with rollout log-probs"
        )
    if cfg.async_training.use_rollout_log_probs and not rollout.calculate_log_probs:
        p.errors.append(
            "async_training.use_rollout_log_probs=True takes pi_old from the rollout's log-probs: set "
            f"{_ROLLOUT}.calculate_log_probs=True"
        )


def _check_v1(p: Problems, cfg) -> None:
    """veRL's V1 asynchronous modes against the rollout, the batch sizes and async_training's mode."""
    mode, rollout = cfg.trainer.v1.trainer_mode, cfg.actor_rollout_ref.rollout
    if mode == "sync":
        return
    key = f"trainer.v1.trainer_mode={mode}"
    if cfg.async_training.mode != "sync":
        p.errors.append(f"{key} and async_training.mode={cfg.async_training.mode} both choose the schedule: set one")
    if rollout.over_sample_rate > 0:
        p.errors.append(
            f"{_ROLLOUT}.over_sample_rate={rollout.over_sample_rate} cuts a synchronous batch; {key} streams groups"
        )
    sampler, warmup = cfg.trainer.v1.sampler, getattr(cfg.trainer.v1, mode).num_warmup_batches
    threshold = sampler.max_off_policy_threshold
    if sampler.max_off_policy_strategy == "wait" and threshold is not None and threshold < 1 + math.ceil(warmup):
        p.notes.append(
            f"trainer.v1.sampler: wait never evicts, and with {mode}.num_warmup_batches={warmup} batches generating "
            f"ahead a finished group may wait its turn past max_off_policy_threshold={threshold} (use drop, or a "
            f"threshold >= {1 + math.ceil(warmup)})"
        )
    if mode == "colocate_async" and rollout.nnodes > 0:
        p.errors.append(f"{key} generates on the trainer's workers: leave {_ROLLOUT}.nnodes=0 (or use separate_async)")
    if mode != "separate_async":
        return
    if rollout.nnodes <= 0:
        p.errors.append(f"{key} needs a rollout pool of its own: set {_ROLLOUT}.nnodes (and n_gpus_per_node) > 0")
    sync_step = cfg.trainer.v1.separate_async.parameter_sync_step
    mini, train_bs = cfg.actor_rollout_ref.actor.ppo_mini_batch_size, cfg.data.train_batch_size
    if _is_positive(sync_step) and train_bs != sync_step * mini:
        p.errors.append(
            f"{key}: data.train_batch_size ({train_bs}) must equal trainer.v1.separate_async.parameter_sync_step "
            f"({sync_step}) x actor_rollout_ref.actor.ppo_mini_batch_size ({mini})"
        )


def cpu_bf16_note() -> str:
    if cpu_has_fast_bf16():
        return "this CPU has AMX/AVX512-BF16, so bf16 runs several times faster than fp32 here"
    return "this CPU lacks AMX/AVX512-BF16, so bf16 runs slower than fp32 here (auto picks fp32 on cpu)"


def _vllm_engines(cfg, judge_scored: bool) -> list[tuple[str, object]]:
    """Every vLLM engine the run starts, by key: the policy rollout, the judge (only a judge-graded reward manager
    starts one; a discriminative reward model is an FSDP forward), each teacher."""
    engines = [(_ROLLOUT, cfg.actor_rollout_ref.rollout)]
    if cfg.reward.reward_model.enable and judge_scored:
        engines.append(("reward.reward_model.rollout", cfg.reward.reward_model.rollout))
    if cfg.distillation.enabled:
        for name, teacher in cfg.distillation.teacher_models.items():
            engines.append((f"distillation.teacher_models.{name}.inference", teacher.inference))
    return [(path, engine) for path, engine in engines if engine.name == "vllm"]


def _explain_gpu_only(p: Problems, cfg, judge_scored: bool) -> None:
    """Settings that only act on a GPU: accepted on cpu, with a note saying what happens."""
    aref, critic = cfg.actor_rollout_ref, cfg.critic
    for path, model in ((f"{_AREF}.model", aref.model), ("critic.model", critic.model)):
        if getattr(model, "enable_activation_offload", False):
            p.notes.append(f"{path}.enable_activation_offload=True: activations already live in host memory on cpu")
    engines = (
        (f"{_AREF}.actor.fsdp_config", aref.actor.fsdp_config),
        (f"{_AREF}.ref.fsdp_config", aref.ref.fsdp_config),
        ("critic.fsdp", critic.fsdp),
    )
    for path, engine in engines:
        for key in ("param_offload", "optimizer_offload", "offload_policy"):
            if getattr(engine, key, False):
                p.notes.append(
                    f"{path}.{key}=True has no effect on cpu: parameters and optimizer state are already in host memory"
                )
        param_dtype = engine.mixed_precision.param_dtype if engine.mixed_precision is not None else None
        if param_dtype is not None and resolve_dtype(param_dtype, "cpu") in ("bfloat16", "float16"):
            p.notes.append(
                f"{path}.mixed_precision.param_dtype={param_dtype} on cpu: the forward runs under autocast "
                f"(fp32 master weights); {cpu_bf16_note()}"
            )
        if resolve_dtype(engine.model_dtype, "cpu") in ("bfloat16", "float16"):
            p.notes.append(f"{path}.model_dtype={engine.model_dtype} on cpu: {cpu_bf16_note()}")
    for path, engine in _vllm_engines(cfg, judge_scored):
        if engine.full_determinism:
            p.errors.append(
                f"{path}.full_determinism=True: vLLM's batch-invariant kernels need CUDA; on cpu the hf rollout "
                f"({path}.name=hf) gives it, decoding one sequence at a time"
            )
        if engine.enable_chunked_prefill:
            p.notes.append(
                f"{path}.enable_chunked_prefill=True is not used on cpu: vLLM's CPU build cannot chunk a seeded "
                "prompt (workers/rollout/vllm_settings.py), so whole prompts wait for the next step"
            )
    dtype = aref.rollout.dtype
    if dtype is not None and resolve_dtype(dtype, "cpu") in ("bfloat16", "float16"):
        p.notes.append(f"{_ROLLOUT}.dtype={dtype} on cpu: {cpu_bf16_note()}")
