"""The one start-up check of a PPO config: the config's own rules (``PPOTrainerConfig.validate``, homes in
hybridflow/config/) plus the few that ask a registry above config/ (Ray backends, tool parsers, agent
loops, trace backends, reward managers), each a ``check_...`` beside its registry.

A batch size that does not split over the ranks otherwise fails an hour later inside a worker; here it
fails in the first second, with the keys and the numbers in the message. Whether a key is implemented at
all is decided with each key's declaration, checked when the config is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridflow.agent_loop.base import check_agent_loop
from hybridflow.agent_loop.loop_config import load_agent_loop_config
from hybridflow.agent_loop.tool_parser import check_tool_parser
from hybridflow.agent_loop.trace import check_trace
from hybridflow.config.convert import as_section
from hybridflow.config.loader import ConfigError
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config
from hybridflow.rewards.registry import manager_needs_judge
from hybridflow.rewards.streaming import RewardRecipe
from hybridflow.rollout.server import AsyncRolloutServer, rollout_server_class
from hybridflow.single_controller.factory import check_pool_size
from hybridflow.trainer.checkpoint_callback import checkpoint_callback_class
from hybridflow.utils.tool_config import check_function_tools, check_tool_config
from hybridflow.utils.torch_dtypes import resolve_dtype

__all__ = ["validate_ppo_config", "resolve_device", "resolve_dtype"]

_ROLLOUT = "actor_rollout_ref.rollout"


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


def validate_ppo_config(cfg: PPOTrainerConfig | Mapping, n_devices: int | None = None) -> list[str]:
    """Check a composed ppo_trainer config before anything starts. ``n_devices``: CUDA devices visible on this
    node (default: ``torch.cuda.device_count()`` when the device is cuda). Returns notes (settings ignored on
    this device, doubtful combinations); raises ConfigError listing every real error."""
    cfg = as_section(cfg, PPOTrainerConfig)  # a composed DictConfig (or dict) is read in here
    device = resolve_device(cfg.trainer.device)
    visible = (torch.cuda.device_count() if n_devices is None else n_devices) if device == "cuda" else None
    errors, notes = [], []
    try:
        notes = cfg.validate(device, visible, judge_scored=manager_needs_judge(cfg.reward.reward_manager))
    except ConfigError as e:
        errors += str(e).splitlines()
    t, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    mt, agent = rollout.multi_turn, rollout.agent
    # the tool, interaction and agent-loop files: read, classes imported, nothing built
    loaded = {}
    for key, path, load in (
        ("multi_turn.tool_config_path", mt.tool_config_path, check_tool_config),
        ("multi_turn.function_tool_path", mt.function_tool_path, check_function_tools),
        ("multi_turn.interaction_config_path", mt.interaction_config_path, _read_interactions),
        ("agent.agent_loop_config_path", agent.agent_loop_config_path, load_agent_loop_config),
    ):
        try:
            loaded[key] = load(path) if path else {}
        except (OSError, ValueError, ImportError, NotImplementedError, TypeError, AttributeError) as e:
            errors.append(f"{_ROLLOUT}.{key}={path}: {type(e).__name__}: {e}")
    judge_engine = cfg.reward.reward_model.rollout.name
    engines = [(f"{_ROLLOUT}.name", rollout.name, False), ("reward.reward_model.rollout.name", judge_engine, False)]
    if cfg.distillation.enabled:  # a teacher scores tokens: its engine must implement score()
        engines += [
            (f"distillation.teacher_models.{name}.inference.name", teacher.inference.name, True)
            for name, teacher in cfg.distillation.teacher_models.items()
        ]
    for key, name, scores in engines:
        if name in (None, "hf", "vllm"):
            continue
        try:  # an engine of the user's: its class found before anything starts
            cls = rollout_server_class(name, key)
            if scores and cls.score is AsyncRolloutServer.score:
                raise TypeError(f"{cls.__name__} does not implement score(), which a distillation teacher calls")
        except (OSError, KeyError, ImportError, TypeError, AttributeError) as e:
            errors.append(f"{key}={name}: {type(e).__name__}: {e}")
    if t.checkpoint_callback_class:
        try:  # the save hook's class found before anything starts
            checkpoint_callback_class(t.checkpoint_callback_class)
        except (OSError, ImportError, TypeError, AttributeError) as e:
            errors.append(f"trainer.checkpoint_callback_class={t.checkpoint_callback_class}: {type(e).__name__}: {e}")
    manager = cfg.reward.reward_manager
    if manager.source == "importlib" and manager.module is not None and manager.module.path:
        try:  # the manager's file, read and its class found before anything starts
            RewardRecipe(cfg.reward, cfg.data.reward_fn_key, None).manager_class()
        except (OSError, ValueError, ImportError, TypeError, AttributeError) as e:
            errors.append(f"reward.reward_manager.module.path={manager.module.path}: {type(e).__name__}: {e}")
    checks = [
        (check_tool_parser, mt.format, f"{_ROLLOUT}.multi_turn.format"),
        (check_agent_loop, agent.default_agent_loop or "single_turn_agent", f"{_ROLLOUT}.agent.default_agent_loop",
         loaded["agent.agent_loop_config_path"]),
        (check_trace, rollout.trace, t.default_local_dir or "."),
    ]  # fmt: skip
    if t.nnodes > 0 and t.n_gpus_per_node > 0:
        world_key = f"trainer.nnodes ({t.nnodes}) * trainer.n_gpus_per_node ({t.n_gpus_per_node})"
        checks.append((check_pool_size, t.backend, t.nnodes * t.n_gpus_per_node, world_key))
    if rollout.nnodes > 0:
        pool_key = f"{_ROLLOUT}.nnodes * n_gpus_per_node"
        checks.append((check_pool_size, t.backend, rollout.nnodes * rollout.n_gpus_per_node, pool_key))
    for check, *args in checks:
        try:
            check(*args)
        except (ValueError, ImportError) as e:  # (ConfigError is a ValueError)
            errors.append(str(e))
    if errors:
        raise ConfigError("invalid PPO config:\n  " + "\n  ".join(errors))
    return notes


def _read_interactions(path: str):
    return initialize_interactions_from_config(path, build=False)
