"""AgentLoopWorker: runs one asyncio task per trajectory of a batch against the rollout servers.

It turns a DataProto of prompts into a DataProto of finished trajectories (layout in
``postprocess.py``). Each sample picks its loop by ``agent_name`` (else the default), gets a
deterministic request id (``<step>:<index of the sample in the step>``, so sampling is reproducible),
and its non-tensor fields as keyword arguments. A loop that raises fails the batch with the sample's
index and agent named; with ``meta_info[KEEP_FAILED]`` (``trainer.v1.sampler.sync_refill_failed_groups``) the
failed sample is logged and returned as padding, its error in the ``ROLLOUT_ERROR`` column, for the trainer
to replace its group.

Where it runs: inside a Ray actor (``rollout.agent.num_workers`` of them, each taking a slice of the
batch) or in the driver's process on an event loop thread (in-process backend). The tools
(``multi_turn.tool_config_path``), interactions (``multi_turn.interaction_config_path``) and the agent
loops of ``rollout.agent.agent_loop_config_path`` are built once per worker, in its process, and shared
by its trajectories.

Two wrappers of the server manager a loop sees: ``CutServer`` in over-sampled calls (the driver cuts
the slow trajectories: ``over_sample.py``) and ``TracedServer`` for traced trajectories (``trace.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from hybridflow.agent_loop.base import AGENT_LOOPS, AgentLoopOutput, AgentLoopSettings
from hybridflow.agent_loop.loop_config import load_agent_loop_config
from hybridflow.agent_loop.over_sample import (
    ABORTED_METRIC,
    OVER_SAMPLE_ID,
    CutServer,
    TrajectoryAborted,
    padding_output,
)
from hybridflow.agent_loop.postprocess import mean_metrics, non_tensor_fields, pad_outputs
from hybridflow.agent_loop.server_manager import ServerHandle, ServerManager
from hybridflow.agent_loop.trace import TracedServer, make_tracer, rollout_numbers, traced_rows, with_text
from hybridflow.config.rollout import rollout_as_in_yaml
from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config
from hybridflow.protocol import DataProto
from hybridflow.rewards.rule_manager import STREAMED_SCORES
from hybridflow.rewards.streaming import RewardPool, RewardRecipe
from hybridflow.rollout.sampling import SamplingParams, resolve_sampling, rollout_sampling
from hybridflow.rollout.server import RolloutEngineDiedError
from hybridflow.tools.function_tool import load_tools

logger = logging.getLogger(__name__)

# non-tensor fields that are not per-sample keyword arguments of a loop
_NOT_FOR_LOOPS = ("raw_prompt_ids",)
KEEP_FAILED = "keep_failed_trajectories"  # meta_info flag: a loop that raises fails its sample, not the call
ROLLOUT_ERROR = "rollout_error"  # with KEEP_FAILED: per row, the loop's error (repr) or None


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
    def __init__(
        self,
        settings: AgentLoopSettings,
        servers: Sequence[ServerHandle],
        tokenizer,
        pad_token_id: int,
        loop_kwargs: dict | None = None,
        resume_on_abort: bool = False,
        reward: RewardRecipe | None = None,
    ):
        """``reward``: each finished trajectory is scored in this worker's share of ``reward.num_workers``
        processes (``hybridflow.rewards.streaming``); None: the driver scores the batch."""
        self.settings = settings
        self.reward_pool = RewardPool.share(reward, settings.num_workers) if reward is not None else None
        rollout = settings.rollout if settings.rollout is not None else rollout_as_in_yaml()
        self.server_manager = ServerManager(
            list(servers), logprobs=rollout.calculate_log_probs, resume_on_abort=resume_on_abort
        )
        self.tokenizer = tokenizer
        self.pad_token_id = int(pad_token_id)
        self.train_params, self.val_params = rollout_sampling(rollout)
        mt = settings.multi_turn
        self.tools = load_tools(mt.tool_config_path, mt.function_tool_path)  # the yaml's, then @function_tool's
        self.interactions = (
            initialize_interactions_from_config(mt.interaction_config_path) if mt.interaction_config_path else {}
        )
        # agent name -> (class, constructor kwargs): the config file's loops win over registered ones
        self.loop_specs = (
            load_agent_loop_config(settings.agent_loop_config_path) if settings.agent_loop_config_path else {}
        )
        for name, kwargs in (loop_kwargs or {}).items():
            cls = self.loop_specs[name][0] if name in self.loop_specs else AGENT_LOOPS[name]
            self.loop_specs[name] = (cls, {**self.loop_specs.get(name, (None, {}))[1], **kwargs})
        self.completed = 0  # trajectories finished so far (progress for watchdogs)
        # rollout.over_sample_rate: per over-sampled call (meta_info[OVER_SAMPLE_ID]) the trajectories kept
        # so far, and the calls the driver cut (bounded: a cut may arrive after its call returned)
        self._kept: dict[str, int] = {}
        self._cut_ids: deque[str] = deque(maxlen=64)
        self.tracer = make_tracer(settings.trace, settings.trace_uri) if settings.trace is not None else None

    def sampling_params(self, meta_info: dict) -> SamplingParams:
        return resolve_sampling(self.train_params, self.val_params, meta_info)

    async def generate_sequences(self, batch: DataProto) -> DataProto:
        """``batch``: prompts (input_ids, attention_mask, position_ids + non-tensor fields); meta_info
        carries ``validate`` / sampling overrides, ``global_steps`` and ``sample_offset`` (this slice's
        first index in the step's batch)."""
        start = time.perf_counter()
        if self.reward_pool is not None:
            self.reward_pool.start()  # its start overlaps the generation of the first trajectories
        meta = batch.meta_info
        params = self.sampling_params(meta)
        # this call's sizes: prompts keep the batch's padded width, responses get the (possibly
        # overridden) response length
        settings = dataclasses.replace(
            self.settings, response_length=params.response_length, prompt_length=int(batch.batch["input_ids"].size(1))
        )
        if meta.get("apply_chat_template_kwargs") is not None:  # a caller's data.apply_chat_template_kwargs wins
            settings = dataclasses.replace(settings, chat_template_kwargs=dict(meta["apply_chat_template_kwargs"]))
        pad_id = int(meta["pad_token_id"]) if meta.get("pad_token_id") is not None else self.pad_token_id
        step, offset = meta.get("global_steps", 0), int(meta.get("sample_offset", 0))
        prefix = "val" if meta.get("validate", False) else "train"
        prompt_ids = prompt_token_ids(batch)
        names = batch.non_tensor_batch.get("agent_name", None)
        columns = {k: v for k, v in batch.non_tensor_batch.items() if k not in _NOT_FOR_LOOPS}
        call_id = meta.get(OVER_SAMPLE_ID)
        if call_id is not None:
            self._kept[call_id] = 0
        trace_tags = self._trace_tags(batch, step, offset, bool(meta.get("validate", False)))
        tasks = []
        for i in range(len(batch)):
            name = str(names[i]) if names is not None and names[i] is not None else self.settings.default_agent_loop
            sample = {k: v[i] for k, v in columns.items()}
            sample.update(prompt_ids=prompt_ids[i], request_id=f"{prefix}{step}:{offset + i}")
            row = {k: v[i : i + 1] for k, v in columns.items()}
            tasks.append(
                self._run_one(settings, i + offset, name, params, sample, call_id, trace_tags[i], (pad_id, row))
            )
        keep_failed = bool(meta.get(KEEP_FAILED, False))
        try:
            results: list = await asyncio.gather(*tasks, return_exceptions=keep_failed)
            for err in (r for r in results if isinstance(r, BaseException)):
                if not isinstance(err, Exception) or isinstance(err, RolloutEngineDiedError):
                    raise err  # a dead engine, a cancellation: not the loop's failure
        except RolloutEngineDiedError as e:
            e.step = f"{step} (validation)" if prefix == "val" else step
            raise
        finally:
            self._kept.pop(call_id, None)
        errors = [r if isinstance(r, BaseException) else None for r in results]
        for i, err in enumerate(errors):
            if err is None:
                continue
            logger.warning("trajectory %s%s:%d failed (%r); its group is replaced", prefix, step, offset + i, err)
            results[i] = (padding_output(prompt_ids[i], with_logprobs=self.server_manager.logprobs), True, None)
        outputs = [o for o, _, _ in results]
        tensors = pad_outputs(outputs, settings.prompt_length, settings.response_length, pad_id)
        out = DataProto.from_dict(tensors=tensors, non_tensors=non_tensor_fields(outputs))
        if self.reward_pool is not None:
            column = out.non_tensor_batch[STREAMED_SCORES] = np.empty(len(results), dtype=object)
            for i, (_, _, scored) in enumerate(results):
                column[i] = scored
        if keep_failed:
            out.non_tensor_batch[ROLLOUT_ERROR] = np.array([None if e is None else repr(e) for e in errors], object)
        metrics = mean_metrics([o for o, aborted, _ in results if not aborted])  # cut or failed: did not run
        if call_id is not None:
            metrics[ABORTED_METRIC] = sum(aborted for _, aborted, _ in results)
        metrics["timing_s/agent_loop_worker"] = time.perf_counter() - start
        out.meta_info["metrics"] = {k: [v] for k, v in metrics.items()}
        return out

    def _trace_tags(self, batch: DataProto, step, offset: int, validate: bool) -> list[dict | None]:
        """Per row, the tags of its trace, or None when the row is not traced (rollout.trace)."""
        if self.tracer is None:
            return [None] * len(batch)
        index = batch.non_tensor_batch.get("index", None)
        index = list(index) if index is not None else list(range(offset, offset + len(batch)))
        rng = np.random.default_rng([abs(int(step)), offset])  # the same rows when a step is replayed
        rows = traced_rows(index, self.settings.trace.max_samples_per_step_per_worker, rng)
        numbers = rollout_numbers(index)
        return [
            {
                "step": step,
                "sample_index": index[i],
                "rollout_n": numbers[i],
                "validate": validate,
                "experiment_name": self.settings.trace.experiment_name,
            }
            if i in rows
            else None
            for i in range(len(batch))
        ]

    async def _run_one(
        self,
        settings: AgentLoopSettings,
        index: int,
        name: str,
        params: SamplingParams,
        sample: dict,
        call_id: str | None = None,
        trace_tags: dict | None = None,
        scoring: tuple[int, dict] | None = None,
    ) -> tuple[AgentLoopOutput, bool, tuple | None]:
        """The trajectory's output, whether it was cut (then the output is padding: over_sample.py) and,
        with a reward pool, its score (``_score``; ``scoring``: the pad id and the sample's own columns)."""
        if name in self.loop_specs:
            loop_cls, kwargs = self.loop_specs[name]
        else:
            try:
                loop_cls, kwargs = AGENT_LOOPS[name], {}
            except KeyError as e:
                extra = (
                    f" (or in {self.settings.agent_loop_config_path}: {sorted(self.loop_specs)})"
                    if self.loop_specs
                    else ""
                )
                raise KeyError(f"sample {index}: agent_name {name!r}: {e.args[0]}{extra}") from None
        is_cut: Callable[[], bool] | None = None
        server = self.server_manager
        if call_id is not None:
            is_cut = lambda: call_id in self._cut_ids  # noqa: E731
            server = CutServer(server, is_cut)
        if trace_tags is not None:
            server = TracedServer(server, self.tracer, self._decoder())
        output, cut = None, False
        try:
            loop = loop_cls(
                settings, server, self.tokenizer, tools=self.tools, interactions=self.interactions, **kwargs
            )
            if trace_tags is None:
                output = await loop.run(params, **sample)
            else:
                with (
                    self.tracer.trajectory(trace_tags),
                    self.tracer.span(f"{type(loop).__name__}.run", {"sampling_params": params, **sample}) as span,
                ):
                    output = await loop.run(params, **sample)
                    span.value = with_text(
                        dataclasses.asdict(output), self._decoder(), output.prompt_ids, output.response_ids
                    )
        except TrajectoryAborted:
            cut = True
        except Exception as e:
            e.add_note(f"hybridflow: agent loop {name!r} failed on sample {index} (request {sample['request_id']!r})")
            self.server_manager.release(sample["request_id"])
            raise
        if is_cut is not None:  # no await since the loop returned: the cut cannot land in between
            cut = cut or is_cut()
            if cut:
                output = padding_output(sample["prompt_ids"], with_logprobs=self.server_manager.logprobs)
            elif call_id in self._kept:
                self._kept[call_id] += 1
        self.completed += 1  # progress the driver's watchdog can see
        versions = self.server_manager.release(sample["request_id"])
        if versions is not None:  # which policy produced the sample: oldest and newest weights of its tokens
            output.extra_fields.setdefault("min_weight_version", versions[0])
            output.extra_fields.setdefault("max_weight_version", versions[1])
        if self.reward_pool is None or cut or output.reward_score is not None or scoring is None:
            return output, cut, None
        return output, cut, await self._score(output, settings, *scoring)

    async def _score(self, output: AgentLoopOutput, settings: AgentLoopSettings, pad_id: int, columns: dict):
        """What the reward function gives a finished trajectory (``(result,)``), on the reward pool, as soon
        as it finished; None when the driver is to score it (a pool that failed: logged; a pool still starting:
        the step does not wait on its start, seconds on the first step)."""
        if not self.reward_pool.ready:
            return None
        tensors = pad_outputs([output], settings.prompt_length, settings.response_length, pad_id)
        row = DataProto.from_dict(tensors=tensors, non_tensors={**columns, **non_tensor_fields([output])})
        try:
            (result,) = await asyncio.wrap_future(self.reward_pool.submit(row))
        except Exception as err:  # noqa: BLE001 - the driver scores the row instead, and raises if it must
            logger.warning("reward.num_workers: scoring a trajectory failed (%r); the driver scores it", err)
            if isinstance(err, BrokenProcessPool):
                self.reward_pool.close()  # the next trajectory starts a fresh pool
            return None
        return (result,)

    async def close_rewards(self) -> None:
        if self.reward_pool is not None:
            self.reward_pool.close()

    def _decoder(self):
        """The tokenizer when traces carry decoded text (rollout.trace.token2text), else None."""
        return self.tokenizer if self.settings.trace is not None and self.settings.trace.token2text else None

    # ------------------------------------------------------------------------ rollout.over_sample_rate
    async def over_sample_progress(self) -> dict[str, int]:
        """Trajectories kept so far, per over-sampled call in progress."""
        return dict(self._kept)

    async def cut(self, call_id: str) -> None:
        """The driver's target is met: the call's unfinished trajectories become padding."""
        self._cut_ids.append(call_id)

    async def close_tracer(self) -> None:
        if self.tracer is not None:
            self.tracer.close()

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
