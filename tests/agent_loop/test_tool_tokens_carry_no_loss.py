"""No tool or user token carries advantage or loss: a tool_agent batch (real layout) through the reward
manager, GRPO and a real actor update on a tiny Qwen2 with the tiny tokenizer's vocabulary."""

from __future__ import annotations

import asyncio
import copy

import numpy as np
import torch

from hybridflow.agent_loop import AgentLoopWorker
from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.rewards import load_reward_manager
from hybridflow.trainer.ppo import core_algos
from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.utils.logprob import forward_response_log_probs
from tests.agent_loop.chat_helpers import TOK, ScriptedChat, batch_of, calc_entry, call_text, objects, settings
from tests.workers.actor.ppo_batch import actor_config, flat_params

QUESTION = [{"role": "user", "content": "What is 12*34?"}]


def tool_batch(tmp_path):
    """Two samples of one prompt: both call the calculator; one answers right (408), one wrong."""
    replies = [call_text("calc", expr="12*34"), call_text("calc", expr="12*34"), "#### 408", "#### 407"]
    worker = AgentLoopWorker(
        settings(tmp_path, [calc_entry()], prompt_length=320, response_length=160),
        [ScriptedChat(replies)],
        TOK,
        pad_token_id=0,
    )
    batch = batch_of([{"messages": QUESTION}] * 2, prompt_length=320)
    out = asyncio.run(worker.generate_sequences(batch))
    out.non_tensor_batch.update(
        data_source=objects(["openai/gsm8k"] * 2),
        uid=objects(["u0", "u0"]),
        reward_model=objects([{"ground_truth": "408"}] * 2),
    )
    return out


def test_tool_tokens_get_no_advantage_and_no_gradient(tmp_path):
    data = tool_batch(tmp_path)
    b = data.batch
    mask = b["response_mask"]  # (B, R)
    real = b["attention_mask"][:, b["prompts"].size(1) :]  # (B, R): model + tool tokens
    tool = (real == 1) & (mask == 0)
    assert tool.sum(-1).tolist()[0] > 40 and (tool.sum(-1) == tool[0].sum()).all()  # a tool turn in both rows

    # reward on the last real token; GRPO: +-0.707 on the model's tokens (two rows: (1-0.5)/std, std = 0.707),
    # exactly 0 on tool tokens and padding
    scores = load_reward_manager("naive", TOK, num_examine=0)(data)
    assert scores.sum(-1).tolist() == [1.0, 0.0]
    adv, _ = core_algos.compute_grpo_outcome_advantage(scores, mask, data.non_tensor_batch["uid"])
    assert (adv[tool] == 0).all() and (adv[mask == 0] == 0).all()
    assert torch.allclose(adv[0][mask[0] == 1], torch.tensor(0.5 / 0.7071), atol=1e-3)

    # a real update of a tiny Qwen2 over the tiny vocabulary
    config = build_tiny_config(
        len(TOK),
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=False,
        pad_token_id=None,
        eos_token_id=None,
    )
    base = build_tiny_model(config, seed=0)
    torch.manual_seed(0)  # the noise on the old log-probs below
    with torch.no_grad():
        logp, _ = forward_response_log_probs(
            base, b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].size(1), 1.0
        )
    b["old_log_probs"] = logp + 0.2 * torch.randn(logp.shape)  # ratios differ from 1
    b["advantages"] = adv
    data.meta_info["temperature"] = 1.0

    def step(batch):
        model = copy.deepcopy(base)
        actor = DataParallelPPOActor(
            actor_config(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2),
            model,
            torch.optim.SGD(model.parameters(), lr=0.5),
        )
        actor.update_policy(batch)
        return flat_params(model)

    updated = step(data)
    # garbage advantages and old log-probs on tool tokens change nothing: they carry no loss
    poisoned = copy.deepcopy(data)
    poisoned.batch["advantages"] = torch.where(tool, torch.full_like(adv, 100.0), adv)
    poisoned.batch["old_log_probs"] = torch.where(tool, torch.full_like(logp, -50.0), b["old_log_probs"])
    assert (step(poisoned) - updated).abs().max().item() == 0.0
    assert (updated - flat_params(base)).abs().max().item() > 1e-4  # the update did something
    # control: a mask rebuilt from the attention mask (what the driver used to do) trains the tool tokens
    leaky = copy.deepcopy(poisoned)
    leaky.batch["response_mask"] = real.clone()
    assert (step(leaky) - updated).abs().max().item() > 1e-4
    assert np.array_equal(data.non_tensor_batch["num_turns"], [4, 4])
