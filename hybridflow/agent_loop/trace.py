"""``rollout.trace``: every trajectory of the agent loop recorded in a tracing store (veRL's rollout trace).

One trace per traced trajectory: a root span ``agent_loop`` whose trace is tagged with ``step``,
``sample_index``, ``rollout_n`` (the how-many-th sample of its prompt), ``validate`` and
``experiment_name``; under it the loop's ``<Loop>.run`` span (inputs: the sampling parameters and the
sample's fields; outputs: the ``AgentLoopOutput``) and one ``ServerManager.generate`` span per model
turn (inputs: request id, prompt ids, sampling parameters; outputs: token ids, log-probs, stop reason).
With ``token2text`` the outputs also carry ``prompt_text`` and ``response_text``, the tokenizer's
decoding, as in veRL. ``max_samples_per_step_per_worker`` traces that many prompts (all their samples)
per agent loop worker and call, picked at random; null traces every sample.

Backends register in ``TRACE_BACKENDS``. Built in: ``mlflow`` (the ``[trace]`` extra: mlflow-skinny
and the sqlite store's sqlalchemy + alembic), writing to ``$MLFLOW_TRACKING_URI`` or, by default,
``sqlite:///<trainer.default_local_dir>/mlflow.db`` (spans in ``mlflow_artifacts`` beside it), experiment =
``trace.project_name``. veRL's ``weave`` and ``trackio`` are not implemented.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hybridflow.config.rollout import TraceConfig
from hybridflow.utils.registry import Registry

KEY = "actor_rollout_ref.rollout.trace"


def trace_store(trace: TraceConfig, run_dir: str) -> str | None:
    """The store of ``trace``'s backend (checked here, on the driver, before any worker starts), resolved
    once so that agent loop workers in other processes write to the same one; None for a backend without
    one. ``run_dir``: where the default store goes (``trainer.default_local_dir``)."""
    trace.check_values()  # names veRL's backends hybridflow does not implement (a section built in code)
    check_backend(trace.backend)
    return default_tracking_uri(run_dir) if trace.backend == "mlflow" else None


class SpanOutputs:
    """What the code inside a span reports as the span's outputs (set ``value``)."""

    value: Any = None


class RolloutTracer(ABC):
    """One per agent loop worker. Spans nest by context (each trajectory is its own asyncio task)."""

    @abstractmethod
    def trajectory(self, tags: dict[str, Any]) -> contextlib.AbstractContextManager:
        """The root span of one trajectory, its trace tagged with ``tags``."""

    @abstractmethod
    def span(self, name: str, inputs: dict[str, Any]) -> contextlib.AbstractContextManager[SpanOutputs]:
        """A child span of the current one."""

    def close(self) -> None:
        """Write out what is buffered and stop the backend's threads (the backend exports in the
        background while the run goes on; a flush per call would stall every worker of the process)."""


# a backend is built as backend(trace, tracking_uri): the section and the store trace_store resolved
TRACE_BACKENDS: Registry[Callable[[TraceConfig, str | None], RolloutTracer]] = Registry("rollout trace backend")


def check_backend(backend: str | None) -> None:
    if backend is None:
        raise ValueError(f"{KEY}.backend is null: nothing is traced")
    # (veRL's backends hybridflow does not implement are refused by TraceConfig, which names them)
    if backend not in TRACE_BACKENDS:
        raise ValueError(f"{KEY}.backend={backend!r} is not a trace backend; known: {', '.join(TRACE_BACKENDS)}")


def check_trace(trace: TraceConfig, run_dir: str) -> None:
    """Start-up check: a backend that is registered and whose packages are installed (null: nothing traced)."""
    if trace.backend is not None:
        uri = trace_store(trace, run_dir)
        if trace.backend == "mlflow":
            import_mlflow(uri)


def make_tracer(trace: TraceConfig, tracking_uri: str | None = None) -> RolloutTracer:
    """The tracer of ``trace.backend`` writing to ``tracking_uri`` (``trace_store``'s answer)."""
    check_backend(trace.backend)
    return TRACE_BACKENDS[trace.backend](trace, tracking_uri)


# ------------------------------------------------------------------------------------------------ mlflow
def import_mlflow(tracking_uri: str | None = None):
    """mlflow (and, for a sqlite store, sqlalchemy and alembic), or an error naming the key and the extra."""
    needed = ["mlflow"] + (["sqlalchemy", "alembic"] if (tracking_uri or "").startswith("sqlite:") else [])
    for name in needed:
        try:
            importlib.import_module(name)
        except ImportError as e:
            why = "" if name == "mlflow" else f" (the sqlite store {tracking_uri} needs sqlalchemy and alembic)"
            raise ImportError(
                f"{KEY}.backend=mlflow needs the {name!r} package, which is not installed: "
                f"pip install 'hybridflow[trace]'{why}"
            ) from e
    return importlib.import_module("mlflow")


def default_tracking_uri(run_dir: str) -> str:
    """``$MLFLOW_TRACKING_URI``, else a sqlite store in ``run_dir`` (mlflow's file store is deprecated)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///" + os.path.abspath(os.path.join(run_dir, "mlflow.db"))


class MlflowTracer(RolloutTracer):
    """Traces go to experiment ``trace.project_name`` of the store ``tracking_uri``. mlflow keeps its store in
    process-wide state (and in ``$MLFLOW_TRACKING_URI``, for subprocesses): the first tracer of a process
    sets it, the last one to close puts back what was there."""

    _lock = threading.Lock()
    _open = 0  # tracers of this process not yet closed
    _saved_uri: str | None = None  # $MLFLOW_TRACKING_URI before the first of them

    def __init__(self, trace: TraceConfig, tracking_uri: str | None = None):
        uri = tracking_uri
        self.mlflow = import_mlflow(uri)
        from mlflow.entities.trace_location import MlflowExperimentLocation

        if uri and uri.startswith("sqlite:///"):  # sqlite makes the file, not its folder
            os.makedirs(os.path.dirname(uri[len("sqlite:///") :]) or ".", exist_ok=True)
        with MlflowTracer._lock:
            if MlflowTracer._open == 0:
                MlflowTracer._saved_uri = os.environ.get("MLFLOW_TRACKING_URI")
            MlflowTracer._open += 1
            self._closed = False
            if uri:
                self.mlflow.set_tracking_uri(uri)
            self.experiment_id = self._experiment(trace.project_name or "hybridflow", uri)
            self.mlflow.tracing.set_destination(MlflowExperimentLocation(experiment_id=self.experiment_id))

    def _experiment(self, name: str, uri: str | None) -> str:
        """The experiment's id, made if new. A sqlite store keeps the spans (artifacts) in ``mlflow_artifacts``
        beside its file; mlflow's own default would be ``./mlruns`` of whatever directory the run started in."""
        client = self.mlflow.MlflowClient()
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        artifacts = None
        if uri and uri.startswith("sqlite:///"):
            artifacts = "file://" + os.path.join(os.path.dirname(uri[len("sqlite:///") :]), "mlflow_artifacts")
        try:
            return client.create_experiment(name, artifact_location=artifacts)
        except self.mlflow.MlflowException:  # another worker made it in the meantime
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    @contextlib.contextmanager
    def trajectory(self, tags):
        with self.mlflow.start_span(name="agent_loop"):
            self.mlflow.update_current_trace(tags={str(k): str(v) for k, v in tags.items()})
            yield

    @contextlib.contextmanager
    def span(self, name, inputs):
        with self.mlflow.start_span(name=name) as span:
            span.set_inputs(jsonable(inputs))
            out = SpanOutputs()
            yield out
            span.set_outputs(jsonable(out.value))

    def close(self) -> None:
        """The last tracer of the process to close flushes mlflow's export queue, stops its threads and
        puts the store setting back (which also resets mlflow's tracer provider and destination)."""
        with MlflowTracer._lock:
            if self._closed:
                return
            self._closed = True
            MlflowTracer._open -= 1
            if MlflowTracer._open == 0:
                self.mlflow.flush_trace_async_logging(terminate=True)
                self.mlflow.set_tracking_uri(MlflowTracer._saved_uri)


TRACE_BACKENDS.register("mlflow", MlflowTracer)


# ------------------------------------------------------------------------------------------------ helpers
def jsonable(value: Any) -> Any:
    """Plain JSON values (numpy arrays and scalars, dataclasses, tuples unwrapped; anything else as str)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def with_text(
    outputs: dict[str, Any], tokenizer, prompt_ids: Sequence[int] | None, response_ids: Sequence[int] | None
) -> dict[str, Any]:
    """``outputs`` plus ``prompt_text`` / ``response_text`` (veRL's token2text: special tokens kept)."""
    if tokenizer is None:
        return outputs
    out = dict(outputs)
    if prompt_ids is not None:
        out["prompt_text"] = tokenizer.decode(list(prompt_ids))
    if response_ids is not None:
        out["response_text"] = tokenizer.decode(list(response_ids))
    return out


def traced_rows(index: Sequence, limit: int | None, rng: np.random.Generator) -> set[int]:
    """Rows to trace: all, or every row of ``limit`` prompts picked at random (rows share a prompt when
    they share ``index``)."""
    rows = range(len(index))
    if limit is None:
        return set(rows)
    prompts = sorted(set(index), key=str)
    if limit >= len(prompts):
        return set(rows)
    picked = {prompts[i] for i in rng.choice(len(prompts), size=limit, replace=False)}
    return {i for i in rows if index[i] in picked}


def rollout_numbers(index: Sequence) -> list[int]:
    """For each row, how many rows before it in a run share its ``index`` (veRL's ``rollout_n``)."""
    out: list[int] = []
    for i, value in enumerate(index):
        out.append(out[-1] + 1 if i and index[i - 1] == value else 0)
    return out


async def get_trajectory_info(step: int, index: list, validate: bool) -> list[dict]:
    """Per sample: step, its dataset index, which of the ``n`` samples of that index it is, validate (veRL's helper)."""
    return [
        {"step": step, "sample_index": idx, "rollout_n": n, "validate": validate}
        for idx, n in zip(index, rollout_numbers(index))
    ]


class TracedServer:
    """The server manager a traced trajectory's loop sees: each request is a span."""

    def __init__(self, server_manager, tracer: RolloutTracer, tokenizer=None):
        self._inner, self._tracer, self._tokenizer = server_manager, tracer, tokenizer

    async def generate(self, request_id, prompt_ids, sampling_params):
        inputs = {"request_id": request_id, "prompt_ids": list(prompt_ids), "sampling_params": sampling_params}
        with self._tracer.span("ServerManager.generate", inputs) as span:
            out = await self._inner.generate(request_id, prompt_ids, sampling_params)
            record = {"token_ids": list(out.token_ids), "log_probs": out.log_probs, "stop_reason": out.stop_reason}
            span.value = with_text(record, self._tokenizer, prompt_ids, out.token_ids)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)
