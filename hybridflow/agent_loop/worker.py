"""AgentLoopWorker: runs one asyncio task per trajectory of a batch against the rollout servers.

It turns a DataProto of prompts into a DataProto of finished trajectories (layout in
``postprocess.py``). Each sample picks its loop by ``agent_name`` (else the default), gets a
deterministic request id (``<step>:<index of the sample in the step>``, so sampling is reproducible),
and its non-tensor fields as keyword arguments. A loop that raises fails the batch with the sample's
index and agent named.

Where it runs: inside a Ray actor (``rollout.agent.num_workers`` of them, each taking a slice of the
batch) or in the driver's process on an event loop thread (in-process backend). The tools
(``multi_turn.tool_config_path``), interactions (``multi_turn.interaction_config_path``) and the agent
loops of ``rollout.agent.agent_loop_config_path`` are built once per worker, in its process, and shared
by its trajectories.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from hybridflow.agent_loop.base import AGENT_LOOPS, AgentLoopOutput, AgentLoopSettings
from hybridflow.agent_loop.loop_config import load_agent_loop_config
from hybridflow.agent_loop.postprocess import mean_metrics, non_tensor_fields, pad_outputs
from hybridflow.agent_loop.server_manager import ServerHandle, ServerManager
from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config
from hybridflow.protocol import DataProto
from hybridflow.tools.tool_registry import initialize_tools_from_config
from hybridflow.rollout.sampling import SamplingParams, resolve_sampling, sampling_params_from_config

# non-tensor fields that are not per-sample keyword arguments of a loop
_NOT_FOR_LOOPS = ("raw_prompt_ids",)


def prompt_token_ids(batch: DataProto) -> list[list[int]]:
    """Unpadded prompt ids per row: ``raw_prompt_ids`` when the dataset kept them, else the
    attention-masked part of the left-padded ``input_ids``."""
    raw = batch.non_tensor_batch.get("raw_prompt_ids", None)
    if raw is not None:
        return [list(map(int, ids)) for ids in raw]
    ids = batch.batch["input_ids"].tolist()
    mask = batch.batch["attention_mask"].bool().tolist()
    return [[t for t, keep in zip(row, row_mask) if keep] for row, row_mask in zip(ids, mask)]


class AgentLoopWorker:
    def __init__(self, settings: AgentLoopSettings, servers: Sequence[ServerHandle], tokenizer,
                 pad_token_id: int, loop_kwargs: dict | None = None, resume_on_abort: bool = False):
        self.settings = settings
        rollout = settings.extra.get("rollout", {})
        self.server_manager = ServerManager(list(servers), logprobs=bool(rollout.get("calculate_log_probs", True)),
                                            resume_on_abort=resume_on_abort)
        self.tokenizer = tokenizer
        self.pad_token_id = int(pad_token_id)
        self.train_params, self.val_params = sampling_params_from_config(settings.extra.get("rollout", {}))
        mt = settings.multi_turn
        self.tools = initialize_tools_from_config(mt.tool_config_path) if mt.tool_config_path else []
        self.interactions = (initialize_interactions_from_config(mt.interaction_config_path)
                             if mt.interaction_config_path else {})
        # agent name -> (class, constructor kwargs): the config file's loops win over registered ones
        self.loop_specs = load_agent_loop_config(settings.agent_loop_config_path) if settings.agent_loop_config_path else {}
        for name, kwargs in (loop_kwargs or {}).items():
            cls = self.loop_specs[name][0] if name in self.loop_specs else AGENT_LOOPS.get(name)
            self.loop_specs[name] = (cls, {**self.loop_specs.get(name, (None, {}))[1], **kwargs})
        self.completed = 0  # trajectories finished so far (progress for watchdogs)

    def sampling_params(self, meta_info: dict) -> SamplingParams:
        return resolve_sampling(self.train_params, self.val_params, meta_info)

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        """``batch``: prompts (input_ids, attention_mask, position_ids + non-tensor fields); meta_info
        carries ``validate`` / sampling overrides, ``global_steps`` and ``sample_offset`` (this slice's
        first index in the step's batch)."""
        start = time.perf_counter()
        meta = batch.meta_info
        params = self.sampling_params(meta)
        # this call's sizes: prompts keep the batch's padded width, responses get the (possibly
        # overridden) response length
        settings = dataclasses.replace(self.settings, response_length=params.response_length,
                                       prompt_length=int(batch.batch["input_ids"].size(1)))
        if meta.get("apply_chat_template_kwargs") is not None:  # a caller's data.apply_chat_template_kwargs wins
            settings = dataclasses.replace(settings, chat_template_kwargs=dict(meta["apply_chat_template_kwargs"]))
        pad_id = int(meta["pad_token_id"]) if meta.get("pad_token_id") is not None else self.pad_token_id
        step, offset = meta.get("global_steps", 0), int(meta.get("sample_offset", 0))
        prefix = "val" if meta.get("validate", False) else "train"
        prompt_ids = prompt_token_ids(batch)
        names = batch.non_tensor_batch.get("agent_name", None)
        columns = {k: v for k, v in batch.non_tensor_batch.items() if k not in _NOT_FOR_LOOPS}
        tasks = []
        for i in range(len(batch)):
            name = str(names[i]) if names is not None and names[i] is not None else self.settings.default_agent_loop
            sample = {k: v[i] for k, v in columns.items()}
            sample.update(prompt_ids=prompt_ids[i], request_id=f"{prefix}{step}:{offset + i}")
            tasks.append(self._run_one(settings, i + offset, name, params, sample))
        outputs: list[AgentLoopOutput] = await asyncio.gather(*tasks)
        tensors = pad_outputs(outputs, settings.prompt_length, settings.response_length, pad_id)
        out = DataProto.from_dict(tensors=tensors, non_tensors=non_tensor_fields(outputs))
        metrics = mean_metrics(outputs)
        metrics["timing_s/agent_loop_worker"] = time.perf_counter() - start
        out.meta_info["metrics"] = {k: [v] for k, v in metrics.items()}
        return out

    async def _run_one(self, settings: AgentLoopSettings, index: int, name: str, params: SamplingParams, sample: dict,
                       ) -> AgentLoopOutput:
        if name in self.loop_specs:
            loop_cls, kwargs = self.loop_specs[name]
        else:
            try:
                loop_cls, kwargs = AGENT_LOOPS.get(name), {}
            except KeyError as e:
                extra = f" (or in {self.settings.agent_loop_config_path}: {sorted(self.loop_specs)})" if self.loop_specs else ""
                raise KeyError(f"sample {index}: agent_name {name!r}: {e.args[0]}{extra}") from None
        try:
            loop = loop_cls(settings, self.server_manager, self.tokenizer, tools=self.tools,
                            interactions=self.interactions, **kwargs)
            output = await loop.run(params, **sample)
        except Exception as e:
            e.add_note(f"hybridflow: agent loop {name!r} failed on sample {index} (request {sample['request_id']!r})")
            self.server_manager.release(sample["request_id"])
            raise
        self.completed += 1  # progress the driver's watchdog can see
        versions = self.server_manager.release(sample["request_id"])
        if versions is not None:  # which policy produced the sample: oldest and newest weights of its tokens
            output.extra_fields.setdefault("min_weight_version", versions[0])
            output.extra_fields.setdefault("max_weight_version", versions[1])
        return output

    # ------------------------------------------------------------------------ asynchronous training
    async def pause(self) -> None:
        self.server_manager.pause()

    async def resume(self) -> None:
        self.server_manager.resume()

    async def in_flight(self) -> int:
        return self.server_manager.total_in_flight()

    async def completed_trajectories(self) -> int:
        return self.completed


def split_indices(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) slices of ``n`` rows over at most ``parts`` workers, sizes differing by <= 1."""
    parts = max(1, min(parts, n)) if n else 1
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
