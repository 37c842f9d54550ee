"""A short GRPO run whose rollouts come from an agent written against the ``openai`` client (issue 35.4):
the trainer starts the endpoint, the agent talks to the tiny policy in two calls per sample, its return
value is the reward, and one sample whose agent raises fails alone while the run goes on."""

from __future__ import annotations

import os

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

AGENT = '''
async def run(client, sample):
    """Ask, then ask for the final answer; reward: the share of digits in it (the toy task's dense reward)."""
    if sample["request_id"] == "train2:3":
        raise RuntimeError("this agent fails on one sample")
    messages = list(sample["raw_prompt"])
    reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "####?"}]
    final = (await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)).choices[0]
    text = final.message.content or ""
    return sum(c.isdigit() for c in text) / max(len(text), 1)
'''


# the Ray run is slow (about 70 s on 2 cores; conftest's backend fixture marks it): the in-process one keeps the
# path in the default suite
def test_grpo_trains_an_openai_client_agent(tiny_model_dir, tiny_data_dir, tmp_path, backend):
    (tmp_path / "agent.py").write_text(AGENT)
    loops = tmp_path / "loops.yaml"
    loops.write_text(
        "- name: openai_agent\n  _target_: hybridflow.agent_loop.openai_agent.OpenAIAgentLoop\n"
        "  agent: agent.py:run\n  timeout_s: 120\n"
    )
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2, response_length=48, backend=backend)
    overrides += [
        "actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable",
        "trainer.test_freq=-1",
    ]
    last = run_ppo(load_config("ppo_trainer", overrides))
    steps = read_metrics(tmp_path)
    assert last["training/global_step"] == 2 and len(steps) == 2
    for m in steps:
        assert_finite(m)
        assert m["actor/pg_loss"] != 0.0 or m["actor/grad_norm"] > 0.0
    # two calls per sample, one sequence each: user, assistant, user, assistant
    assert steps[0]["agent/agent_calls"] == 2.0 and steps[0]["agent/num_turns/mean"] == 4.0
    assert steps[0]["agent/agent_failures"] == 0.0 and steps[1]["agent/agent_failures"] == pytest.approx(1 / 8)
    assert os.path.isfile(tmp_path / "ckpt" / "metrics.jsonl")
