"""Judge main_ppo command lines with veRL's own configuration: what "veRL accepts" means for
``check_verl_examples --reference-python``.

Run as a file by an interpreter that imports ``verl`` (veRL is not a dependency of hybridflow):

    VERL_PYTHON hybridflow/devtools/verl_reference.py < commands.json > verdicts.json

Input: a JSON list of argument lists (what follows ``-m verl.trainer.main_ppo``). Output: one
``{"accepted": bool, "message": str}`` per command.

A command is accepted when veRL's main_ppo would get past its own checks before it starts Ray, run
from the top of a veRL checkout: Hydra composes veRL's config (``ppo_trainer`` unless
``--config-name`` says otherwise; a relative ``--config-path`` is relative to ``verl/trainer/``, as
Hydra resolves it for ``python -m verl.trainer.main_ppo``; a yaml's ``file://verl/...`` search path
finds the installed veRL) with the overrides, and ``verl.utils.config.validate_config`` passes
(batch-size divisibility, micro-batch settings, the actor's and, when used, the critic's config
dataclasses built and validated, the LoRA rank vLLM allows). Nothing that needs a GPU, the model or
the data counts against a command: when building a config dataclass stops at loading the model's
files (not on this machine), the command is accepted with a note; when veRL's vLLM module cannot be
imported here, the LoRA rank is checked against the ranks veRL falls back to (1 to 512).

This module imports only the standard library at the top, so it runs without hybridflow installed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings

__all__ = ["split_args", "judge", "main"]


def split_args(args: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(config path, config name, overrides) as Hydra's command line reads them."""
    path = name = None
    overrides, i = [], 0
    while i < len(args):
        flag, eq, inline = args[i].partition("=")
        if flag in ("--config-path", "-cp", "--config-name", "-cn"):
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            value = value.strip("'\"")
            if flag in ("--config-path", "-cp"):
                path = value
            else:
                name = value
            continue
        overrides.append(args[i])
        i += 1
    return path, name, overrides


def _need_reference_policy(config) -> bool:
    try:  # veRL's own, when its imports are installed
        from verl.trainer.ppo.utils import need_reference_policy
    except ImportError:  # the same rule (verl/trainer/ppo/utils.py)
        return bool(config.algorithm.get("use_kl_in_reward", False) or config.actor_rollout_ref.actor.use_kl_loss)
    return need_reference_policy(config)


def _need_critic(config) -> bool:
    try:
        from verl.trainer.ppo.utils import need_critic
    except ImportError:  # the same rule: critic.enable if set, else only for GAE
        if config.critic.enable is not None:
            return bool(config.critic.enable)
        return config.algorithm.adv_estimator == "gae"
    return need_critic(config)


_FALLBACK_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # veRL's own fallback when vllm is absent


def _vllm_lora_rank_check() -> None:
    """Make ``verl.workers.rollout.vllm_rollout.utils.get_vllm_max_lora_rank`` importable where veRL's
    vLLM package cannot be imported (vLLM missing or a CPU build): the same rule on the fallback ranks."""
    try:
        import verl.workers.rollout.vllm_rollout.utils  # noqa: F401

        return
    except Exception:  # noqa: BLE001 - any import failure of the backend: check the rank without it
        pass
    import types

    def get_vllm_max_lora_rank(lora_rank: int) -> int:
        assert lora_rank > 0, f"lora_rank must be greater than 0, get {lora_rank}"
        if lora_rank > _FALLBACK_LORA_RANKS[-1]:
            raise ValueError(f"lora_rank must be less than or equal to {_FALLBACK_LORA_RANKS[-1]}, but got {lora_rank}")
        return next(rank for rank in _FALLBACK_LORA_RANKS if lora_rank <= rank)

    package = types.ModuleType("verl.workers.rollout.vllm_rollout")
    package.__path__ = []
    utils = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    utils.get_vllm_max_lora_rank = get_vllm_max_lora_rank
    sys.modules[package.__name__] = package
    sys.modules[utils.__name__] = utils


def _needs_the_model(error: BaseException) -> bool:
    """A config dataclass that stopped at reading the model's files (a hub id, no network here)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and ("huggingface.co" in str(seen) or "cached files" in str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return "HFModelConfig" in str(error) and "OSError" in str(error)


def judge(args: list[str]) -> tuple[bool, str]:
    """(accepted, why not) for one command line, composed and validated by veRL."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.utils.config import validate_config

    path, name, overrides = split_args(args)
    trainer_dir = os.path.join(os.path.dirname(verl.__file__), "trainer")
    config_dir = os.path.normpath(os.path.join(trainer_dir, path or "config"))  # an absolute path stays
    if not os.path.isdir(config_dir):
        return False, f"config path {config_dir!r} is not a directory"
    GlobalHydra.instance().clear()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                config = compose(config_name=(name or "ppo_trainer").removesuffix(".yaml"), overrides=overrides)
            validate_config(
                config, use_reference_policy=_need_reference_policy(config), use_critic=_need_critic(config)
            )
    except Exception as e:  # noqa: BLE001 - every failure is a verdict on the command line
        if _needs_the_model(e):
            return True, "accepted up to loading the model's files (not on this machine)"
        return False, f"{type(e).__name__}: {e}".strip()
    finally:
        GlobalHydra.instance().clear()
    return True, ""


def main() -> int:
    import tempfile

    import verl

    commands = json.load(sys.stdin)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _vllm_lora_rank_check()
    verdicts = []
    # the working directory of a veRL checkout: ./verl is veRL (for file://verl/... search paths)
    with tempfile.TemporaryDirectory() as top:
        os.symlink(os.path.dirname(verl.__file__), os.path.join(top, "verl"))
        here = os.getcwd()
        os.chdir(top)
        try:
            for args in commands:
                accepted, message = judge(args)
                verdicts.append({"accepted": accepted, "message": message})
        finally:
            os.chdir(here)
    json.dump(verdicts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
