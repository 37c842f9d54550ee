"""Offline generation: n responses for every prompt of parquet files by the rollout workers of RL training
(the hf or vllm engine, the same sampling), written next to the input columns. ``main_generation`` (its own
generation.yaml keys) and ``main_generation_server`` (veRL 0.9.1's ppo_trainer keys) run it."""

from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.config.convert import as_section
from hybridflow.config.generation import GenerationConfig
from hybridflow.config.ppo_trainer import ActorRolloutRefConfig
from hybridflow.data.rl_dataset import RLHFDataset, collate_fn, read_parquet_rows
from hybridflow.protocol import DataProto
from hybridflow.single_controller.base import ClassWithInitArgs
from hybridflow.single_controller.factory import build_worker_group, start_backend, write_timeline
from hybridflow.trainer.config_checks import resolve_device
from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
from hybridflow.workers.model_loading import load_tokenizer, local_model_path

logger = logging.getLogger(__name__)


def worker_config(config: GenerationConfig) -> ActorRolloutRefConfig:
    """The ``actor_rollout_ref`` section the worker reads (model + rollout; one response per row)."""
    rollout = dataclasses.replace(config.rollout, n=1)  # the driver repeats prompts n_samples times
    return ActorRolloutRefConfig(model=config.model, rollout=rollout, actor=config.actor)


def build_rollout_group(config):
    """(worker group, shutdown callable) for the rollout role on the configured backend."""
    config = as_section(config, GenerationConfig)
    t = config.trainer
    device = resolve_device(t.device)
    stop_backend = start_backend(t.backend, config.ray_kwargs.ray_init, worker_env={"HYBRIDFLOW_DEVICE": device})
    try:
        group = build_worker_group(
            t.backend,
            ClassWithInitArgs(ActorRolloutRefWorker, config=worker_config(config), role="rollout"),
            [int(t.n_gpus_per_node)] * int(t.nnodes),
            name="rollout",
            use_gpu=device == "cuda",
        )
    except BaseException:
        stop_backend()
        raise

    def shutdown():
        group.shutdown()  # its workers (and their devices, the rendezvous variables and process group in process)
        stop_backend()

    return group, shutdown


def generate_responses(
    group, dataset: RLHFDataset, tokenizer, n_samples: int, batch_size: int, template_kwargs: dict | None = None
) -> list[list[str]]:
    """n_samples decoded responses per dataset row, in row order (``template_kwargs``: for loops that
    template the chat themselves, as the dataset did)."""
    out: list[list[str]] = []
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        batch = DataProto.from_single_dict(collate_fn(items))
        gen = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
        gen = gen.repeat(repeat_times=n_samples, interleave=True)  # rows i*n .. i*n+n-1 answer prompt i
        gen.meta_info = {
            "pad_token_id": tokenizer.pad_token_id,  # stop ids: the engine's (generation config)
            "apply_chat_template_kwargs": dict(template_kwargs or {}),
        }
        result = group.generate_sequences(gen)
        texts = tokenizer.batch_decode(result.batch["responses"], skip_special_tokens=True)
        out += [texts[i * n_samples : (i + 1) * n_samples] for i in range(len(items))]
        logger.info("generated %d/%d prompts × %d", len(out), len(dataset), n_samples)
    return out


def run_generation(config) -> str:
    """Generate for every row of data.path (a file or a list of files, read in order); write data.output_path;
    return its path."""
    config = as_section(config, GenerationConfig)  # the composed tree, read into its typed tree once
    d = config.data
    for note in config.validate():  # validated once, here
        logger.warning("[config] %s", note)
    n_samples, batch_size = int(d.n_samples), int(d.batch_size)
    model_path = local_model_path(config.model.path, "model.path")
    tokenizer = load_tokenizer(model_path, bool(config.model.trust_remote_code))
    paths = [os.path.expanduser(p) for p in ([d.path] if isinstance(d.path, str) else d.path)]
    rows = read_parquet_rows(paths, required_column=d.prompt_key)
    template_kwargs = dict(d.apply_chat_template_kwargs or {})
    dataset = RLHFDataset(
        paths,
        tokenizer,
        {
            "prompt_key": d.prompt_key,
            "max_prompt_length": int(config.rollout.prompt_length),
            "filter_overlong_prompts": False,
            "truncation": "left",  # one output row per input row
            "apply_chat_template_kwargs": template_kwargs,
        },
    )

    group, shutdown = build_rollout_group(config)
    try:
        group.init_model()
        responses = generate_responses(group, dataset, tokenizer, n_samples, batch_size, template_kwargs)
        if timeline := config.ray_kwargs.timeline_json_file:
            logger.info("Ray timeline written to %s", write_timeline(config.trainer.backend, timeline))
    finally:
        shutdown()

    for row, resp in zip(rows, responses):
        row["responses"] = resp
    output = os.path.expanduser(d.output_path)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), output)
    lengths = [len(r) for resp in responses for r in resp]
    logger.info(
        "wrote %d rows × %d responses (mean %.1f characters) to %s", len(rows), n_samples, np.mean(lengths), output
    )
    return output
