"""main_ppo (in process, tiny model) with rollout.over_sample_rate=0.5 and rollout.trace.backend=mlflow:
half of each training batch is cut and padded and the steps still train with finite numbers; every
trajectory is traced into the default store <trainer.default_local_dir>/mlflow.db with its decoded text."""

from __future__ import annotations

import pytest

from hybridflow.agent_loop import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, register
from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

MLFLOW_MISSING = (
    "the [trace] extra (mlflow-skinny, sqlalchemy, alembic) is not installed: pip install 'hybridflow[trace]'"
)
LOOP = "odd_samples_dawdle_test"


def _register_dawdling_loop():
    """Even samples: one generation. Odd ones: 1-token turns until cut (thousands of turns otherwise),
    so exactly the odd half is still running when the even half has finished."""

    @register(LOOP)
    class Dawdle(AgentLoopBase):
        async def run(self, sampling_params, **sample):
            prompt_ids, request_id = list(sample["prompt_ids"]), sample["request_id"]
            odd = int(request_id.split(":")[1]) % 2 == 1
            turns = 5000 if odd and not request_id.startswith("val") else 1
            for _ in range(turns):
                out = await self.server_manager.generate(request_id, prompt_ids, sampling_params)
            response = out.token_ids[: self.settings.response_length]
            return AgentLoopOutput(
                prompt_ids=prompt_ids,
                response_ids=response,
                response_mask=[1] * len(response),
                response_logprobs=out.log_probs[: len(response)],
                num_turns=2,
            )


@pytest.mark.slow
def test_over_sampled_traced_grpo_run(tiny_model_dir, tiny_data_dir, tiny_tokenizer, tmp_path, monkeypatch):
    for module in ("mlflow", "sqlalchemy", "alembic"):
        pytest.importorskip(module, reason=MLFLOW_MISSING)
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store: under the run's directory
    _register_dawdling_loop()
    try:
        overrides = base_overrides(
            tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=2, backend="inprocess"
        )
        overrides += [
            "actor_rollout_ref.rollout.over_sample_rate=0.5",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={LOOP}",
            "actor_rollout_ref.rollout.trace.backend=mlflow",
            "actor_rollout_ref.rollout.trace.token2text=True",
            "trainer.project_name=oversample_proj",
            "trainer.experiment_name=e2e",
        ]
        run_ppo(load_config("ppo_trainer", overrides))
    finally:
        AGENT_LOOPS.pop(LOOP, None)

    steps = read_metrics(tmp_path)
    assert len(steps) == 2
    for m in steps:
        assert_finite(m)
        assert m["agent/over_sample/aborted_ratio"] == 0.5  # the 4 odd samples of 8, every step

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/ckpt/mlflow.db")
    experiment = client.get_experiment_by_name("oversample_proj")
    assert experiment.artifact_location == f"file://{tmp_path}/ckpt/mlflow_artifacts"  # the spans stay in the run
    traces = client.search_traces(locations=[experiment.experiment_id], max_results=500)
    train = [t for t in traces if t.info.tags["validate"] == "False"]
    assert sorted(t.info.tags["step"] for t in train) == ["1"] * 8 + ["2"] * 8
    assert {t.info.tags["experiment_name"] for t in traces} == {"e2e"}
    finished = 0
    for trace in train:
        run = next(s for s in trace.data.spans if s.name == "Dawdle.run")
        if run.outputs is None:  # a cut trajectory: its run ended with TrajectoryAborted
            continue
        finished += 1
        assert run.outputs["response_text"] == tiny_tokenizer.decode(run.outputs["response_ids"])
        assert run.outputs["prompt_text"] == tiny_tokenizer.decode(run.outputs["prompt_ids"])
    assert finished == 8  # the even half of both steps
