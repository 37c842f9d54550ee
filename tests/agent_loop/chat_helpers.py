"""A scripted chat server over the tiny character tokenizer, and a one-sample tool_agent run."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import torch
import yaml

from hybridflow.agent_loop import AgentLoopSettings, AgentLoopWorker, agent_loop_settings
from hybridflow.agent_loop.server_manager import ServerHandle
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.protocol import DataProto
from hybridflow.rollout.server import STOP, TokenOutput

TOK = build_tiny_tokenizer()
EOS = TOK.eos_token_id
CALC_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "arithmetic",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def call_text(name: str, **arguments) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedChat(ServerHandle):
    """Answers with the next scripted reply: a text (encoded + EOS, log-prob -0.5 per token) or a
    list of token ids (returned as is). Records every request's prompt ids and parameters."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        self.requests.append((request_id, list(prompt_ids), params))
        await asyncio.sleep(0)
        reply = self.replies.pop(0) if self.replies else "#### 0"
        out = list(reply) if isinstance(reply, list) else ids(reply) + [EOS]
        out = out[: params.response_length]
        return TokenOutput(out, [-0.5] * len(out) if logprobs else None, STOP)


def write_tools_yaml(path: str, entries: list[dict]) -> str:
    with open(path, "w") as f:
        yaml.safe_dump({"tools": entries}, f)
    return path


def calc_entry(class_name: str = "hybridflow.tools.calculator_tool.CalculatorTool", schema=None, **config) -> dict:
    return {"class_name": class_name, "config": {"type": "native", **config}, "tool_schema": schema or CALC_SCHEMA}


def settings(
    tmp_path=None, tools: list[dict] | None = None, prompt_length: int = 512, response_length: int = 256, **multi_turn
) -> AgentLoopSettings:
    mt = dict(multi_turn)
    if tools is not None:
        mt["tool_config_path"] = write_tools_yaml(os.path.join(str(tmp_path), "tools.yaml"), tools)
    return agent_loop_settings({"prompt_length": prompt_length, "response_length": response_length, "multi_turn": mt})


def objects(values) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def batch_of(samples: list[dict], prompt_length: int = 512, meta=None) -> DataProto:
    """tool_agent samples: dicts with 'messages' and optional tools_kwargs / interaction_kwargs / agent_name."""
    n = len(samples)
    tensors = {
        "input_ids": torch.zeros(n, prompt_length, dtype=torch.long),
        "attention_mask": torch.ones(n, prompt_length, dtype=torch.long),
        "position_ids": torch.zeros(n, prompt_length, dtype=torch.long),
    }
    cols = {
        "raw_prompt": objects([s["messages"] for s in samples]),
        "agent_name": objects([s.get("agent_name", "tool_agent") for s in samples]),
        "tools_kwargs": objects([s.get("tools_kwargs", {}) for s in samples]),
        "interaction_kwargs": objects([s.get("interaction_kwargs", {}) for s in samples]),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=cols, meta_info=meta or {})


def run(worker: AgentLoopWorker, samples: list[dict], **kw) -> DataProto:
    return asyncio.run(worker.generate_sequences(batch_of(samples, worker.settings.prompt_length, **kw)))


def response_of(out: DataProto, i: int = 0) -> tuple[list[int], list[int]]:
    """(response ids, mask) of row i without the padding."""
    p = out.batch["prompts"].size(1)
    n = int(out.batch["attention_mask"][i, p:].sum())
    return out.batch["responses"][i, :n].tolist(), out.batch["response_mask"][i, :n].tolist()
