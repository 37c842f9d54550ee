"""``python -m hybridflow.main_generation_server key=val ...``: veRL 0.9.1's generation entry point, on the
ppo_trainer keys: ``actor_rollout_ref.rollout.n`` responses for every prompt of ``data.train_files`` (chat
messages in ``data.prompt_key``), written with a ``responses`` column to ``data.output_path`` (veRL's scripts
add that key with ``+``).

    python -m hybridflow.main_generation_server data.train_files=test.parquet data.prompt_key=prompt \\
        +data.output_path=gen.parquet actor_rollout_ref.model.path=DIR actor_rollout_ref.rollout.name=vllm \\
        actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.temperature=1.0 trainer.n_gpus_per_node=2

veRL starts OpenAI-compatible servers and sends one chat request per sample; here the rollout workers of
``main_generation`` (and of RL training) generate, from the prompts templated with the model's chat template
as a chat server templates them. Every key of the rollout's sampling is applied (veRL's requests carry only
temperature, top_p and the response length: its ``top_k`` is not sent), and a prompt longer than
``rollout.prompt_length`` keeps its end.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence

from hybridflow.config.convert import as_section
from hybridflow.config.errors import ConfigError
from hybridflow.config.generation import GenerationConfig, GenerationDataConfig
from hybridflow.config.loader import parse_cli
from hybridflow.config.ppo_trainer import PPOTrainerConfig
from hybridflow.trainer.generation import run_generation
from hybridflow.utils.logging_utils import setup_cli_logging

logger = logging.getLogger(__name__)

OUTPUT_KEY = "data.output_path"  # not a ppo_trainer key: veRL's scripts add it with +


def split_output_path(argv: Sequence[str]) -> tuple[list[str], str]:
    """(the command line without ``[+]data.output_path=FILE``, FILE)."""
    kept, output = [], None
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key == OUTPUT_KEY:
            output = value
        else:
            kept.append(arg)
    if not output:
        raise ConfigError(f"main_generation_server needs +{OUTPUT_KEY}=FILE: the parquet file it writes")
    return kept, output


def generation_config(config, output_path: str) -> GenerationConfig:
    """The generation run a ppo_trainer config describes (``config``: composed or typed)."""
    cfg = as_section(config, PPOTrainerConfig)
    arr = cfg.actor_rollout_ref
    rollout, t = arr.rollout, cfg.trainer
    if rollout.temperature == 0 and rollout.n != 1:
        raise ConfigError(
            f"actor_rollout_ref.rollout.temperature=0 samples one response: set actor_rollout_ref.rollout.n=1 "
            f"(got {rollout.n})"
        )
    files = cfg.data.train_files
    data = GenerationDataConfig(
        path=files if isinstance(files, str) else list(files),
        prompt_key=cfg.data.prompt_key,
        n_samples=int(rollout.n),
        output_path=output_path,
        apply_chat_template_kwargs=dict(cfg.data.apply_chat_template_kwargs or {}),
    )
    trainer = dataclasses.replace(
        GenerationConfig().trainer,
        nnodes=t.nnodes,
        n_gpus_per_node=t.n_gpus_per_node,
        device=t.device,
        backend=t.backend,
    )
    return GenerationConfig(
        trainer=trainer, data=data, model=arr.model, rollout=rollout, actor=arr.actor, ray_kwargs=cfg.ray_kwargs
    )


def main(argv: Sequence[str] | None = None) -> str:
    setup_cli_logging()
    overrides, output_path = split_output_path(sys.argv[1:] if argv is None else argv)
    return run_generation(generation_config(parse_cli("ppo_trainer", overrides), output_path))


if __name__ == "__main__":
    main()
