"""rollout.trace with backend=mlflow: each trajectory of an agent loop call lands in the mlflow store as a
trace, tagged like veRL's, whose spans hold the generated tokens and (token2text) their decoded text."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import numpy as np
import pytest
import torch

from hybridflow.agent_loop import agent_loop_settings
from hybridflow.agent_loop.manager import AgentLoopManager
from hybridflow.agent_loop.server_manager import ROLLOUT_CONCURRENCY_GROUP
from hybridflow.agent_loop.trace import make_tracer, trace_store
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.rollout import TraceConfig
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rollout.server import STOP, EngineLoop, TokenOutput
from hybridflow.single_controller.base import ClassWithInitArgs, Dispatch, Worker, register
from hybridflow.single_controller.factory import build_worker_group
from hybridflow.trainer.config_checks import validate_ppo_config

MLFLOW_MISSING = (
    "the [trace] extra (mlflow-skinny, sqlalchemy, alembic) is not installed: pip install 'hybridflow[trace]'"
)


class CountingServer:
    """Answers a prompt ending in p with p+1, p+2, p+3 (ids of the tiny tokenizer's printable range)."""

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        p = prompt_ids[-1]
        return TokenOutput([p + 1, p + 2, p + 3], [-0.25] * 3, STOP)


class CountingRolloutWorker(Worker):
    def __init__(self):
        super().__init__()
        self.server, self.engine_loop = CountingServer(), EngineLoop("counting-engine")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def prepare_rollout(self, version=None):
        return {}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def release_rollout(self):
        pass

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close_engine(self) -> None:
        self.engine_loop.close()


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    """An mlflow sqlite store with its tables made (the migrations take seconds): each test copies it."""
    for module in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(module, reason=MLFLOW_MISSING)
    import mlflow

    path = tmp_path_factory.mktemp("mlflow_store") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def run_traced(store, tmp_path, last_tokens, index, limit=None):
    """One training call over two agent loop workers with tracing on; the output batch and the store's uri."""
    tok = build_tiny_tokenizer()
    (tmp_path / "run").mkdir()
    shutil.copy(store, tmp_path / "run" / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/run/mlflow.db"
    trace = TraceConfig(
        backend="mlflow",
        project_name="proj",
        experiment_name="exp1",
        token2text=True,
        max_samples_per_step_per_worker=limit,
    )
    rollout = {"prompt_length": 2, "response_length": 4, "calculate_log_probs": True, "agent": {"num_workers": 2}}
    group = build_worker_group(
        "inprocess",
        ClassWithInitArgs(CountingRolloutWorker),
        [1],
        name="counting",
        concurrency_groups={ROLLOUT_CONCURRENCY_GROUP: 16},
    )
    manager = None
    try:
        manager = AgentLoopManager(
            dataclasses.replace(agent_loop_settings(rollout), trace=trace, trace_uri=uri), group, tok, role=None
        )
        ids = torch.tensor([[40, t] for t in last_tokens])
        mask = torch.ones_like(ids)
        batch = DataProto.from_dict(
            tensors={"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
            non_tensors={"index": np.array(index)},
            meta_info={"global_steps": 3},
        )
        out = manager.generate_sequences(batch)
    finally:
        if manager is not None:
            manager.shutdown()  # closes the tracers: mlflow's threads stop, $MLFLOW_TRACKING_URI is put back
        group.close_engine()
        group.shutdown()
    return tok, out, uri


def read_traces(uri):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("proj")
    # the spans live beside the store, not in ./mlruns of the directory the tests run in
    store_dir = os.path.dirname(uri[len("sqlite:///") :])
    assert experiment.artifact_location == "file://" + os.path.join(store_dir, "mlflow_artifacts")
    return client.search_traces(locations=[experiment.experiment_id], max_results=100)


def spans_by_name(trace):
    return {span.name: span for span in trace.data.spans}


def test_mlflow_traces_hold_the_decoded_trajectories(empty_store, tmp_path):
    before = os.environ.get("MLFLOW_TRACKING_URI")
    tok, out, uri = run_traced(empty_store, tmp_path, last_tokens=[30, 50, 70], index=[7, 8, 9])
    assert os.environ.get("MLFLOW_TRACKING_URI") == before  # the tracer put the process's setting back
    traces = read_traces(uri)
    assert len(traces) == 3
    by_index = {int(t.info.tags["sample_index"]): t for t in traces}
    assert sorted(by_index) == [7, 8, 9]
    for row, (index, p) in enumerate(zip([7, 8, 9], [30, 50, 70])):
        trace = by_index[index]
        tags = trace.info.tags
        assert (tags["step"], tags["rollout_n"], tags["validate"], tags["experiment_name"]) == (
            "3",
            "0",
            "False",
            "exp1",
        )
        spans = spans_by_name(trace)
        assert set(spans) == {"agent_loop", "SingleTurnAgentLoop.run", "ServerManager.generate"}
        response_ids = out.batch["responses"][row][out.batch["response_mask"][row].bool()].tolist()
        assert response_ids == [p + 1, p + 2, p + 3]  # what the server answered, in the batch
        run = spans["SingleTurnAgentLoop.run"]
        assert run.outputs["response_ids"] == response_ids
        assert run.outputs["response_text"] == tok.decode(response_ids) != ""
        assert run.outputs["prompt_text"] == tok.decode([40, p])
        assert run.inputs["request_id"] == f"train3:{row}" and run.inputs["index"] == index
        turn = spans["ServerManager.generate"]
        assert turn.inputs["prompt_ids"] == [40, p] and turn.outputs["token_ids"] == response_ids
        assert turn.outputs["response_text"] == tok.decode(response_ids)
        assert turn.parent_id == run.span_id and run.parent_id == spans["agent_loop"].span_id


def test_max_samples_per_step_per_worker_traces_whole_prompt_groups(empty_store, tmp_path):
    # 4 prompts x 2 samples over 2 workers (2 prompts each); 1 prompt per worker traced, both its samples
    _, _, uri = run_traced(
        empty_store, tmp_path, last_tokens=[30, 31, 40, 41, 50, 51, 60, 61], index=[0, 0, 1, 1, 2, 2, 3, 3], limit=1
    )
    tags = [t.info.tags for t in read_traces(uri)]
    assert len(tags) == 4
    traced = sorted((int(t["sample_index"]), int(t["rollout_n"])) for t in tags)
    prompts = sorted({i for i, _ in traced})
    assert traced == [(prompts[0], 0), (prompts[0], 1), (prompts[1], 0), (prompts[1], 1)]
    assert prompts[0] in (0, 1) and prompts[1] in (2, 3)  # one of each worker's slice


def test_missing_mlflow_names_the_key_and_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(
        ImportError, match=r"rollout.trace.backend=mlflow needs the 'mlflow' package.*hybridflow\[trace\]"
    ):
        make_tracer(TraceConfig(backend="mlflow", project_name="p"), f"sqlite:///{tmp_path}/m.db")
    cfg = load_config("ppo_trainer", ["actor_rollout_ref.rollout.trace.backend=mlflow", "trainer.device=cpu"])
    with pytest.raises(ConfigError, match=r"trace.backend=mlflow needs the 'mlflow' package"):
        validate_ppo_config(cfg)


def test_weave_and_unknown_backends_are_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for backend, message in (
        ("weave", "Weave backend is not implemented"),
        ("nope", "is not a trace backend; known: mlflow"),
    ):
        with pytest.raises(ValueError, match=message):
            trace_store(TraceConfig(backend=backend), run_dir=str(tmp_path))
        cfg = load_config("ppo_trainer", [f"actor_rollout_ref.rollout.trace.backend={backend}", "trainer.device=cpu"])
        with pytest.raises(ConfigError, match=message):
            validate_ppo_config(cfg)
    assert trace_store(TraceConfig(backend="mlflow"), run_dir=str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow.db"


def test_only_a_caller_with_a_run_dir_traces_and_the_store_goes_there(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    section = {"prompt_length": 2, "response_length": 4, "trace": {"backend": "mlflow", "project_name": "p"}}
    traced = agent_loop_settings(section, run_dir=str(tmp_path))
    assert (traced.trace.backend, traced.trace.project_name) == ("mlflow", "p")
    assert traced.trace_uri == f"sqlite:///{tmp_path}/mlflow.db"
    assert agent_loop_settings(section).trace is None  # a worker's own settings (no run dir): nothing traced
    off = agent_loop_settings({**section, "trace": {"backend": None}}, run_dir=str(tmp_path))
    assert (off.trace, off.trace_uri) == (None, None)
