"""A task the tiny model cannot do in its head but can do with a calculator: 3-digit × 2-digit
multiplication (``347*82=?`` -> ``#### 28454``), for the tool-use learning proof.

Files written by ``write_tiny_tool_task``:

* ``calc_tool.yaml``: the calculator (``CalculatorTool``) in veRL's tool format, schema kept short
  (every character is a token for the tiny tokenizer, and the schema is in every prompt);
* ``train.parquet`` / ``test.parquet``: RL rows (``agent_name: tool_agent``, GSM8K-style ground truth,
  ``data_source: openai/gsm8k`` so the gsm8k scorer grades the final ``#### N``); with
  ``interaction=True`` each row also names the gsm8k interaction (a hint after a wrong answer);
* ``sft_train.parquet``: multi-turn demonstrations (``messages`` + ``tools`` as JSON text). A share
  ``tool_share`` of them call the calculator and copy its result; the rest answer directly with the
  right product, which a tiny model cannot learn to compute. So the SFT model knows the call format
  and when it calls, mostly copies correctly, but often answers from its head (wrong): RL has to teach
  it that the tool pays off.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence

import yaml

from hybridflow.data.tiny_task import DATA_SOURCE, write_parquet

TOOL_NAME = "calc"
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "arithmetic",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
INTERACTION_NAME = "gsm8k"


def make_problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, expression, product)."""
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return f"{a}*{b}=?", f"{a}*{b}", a * b


def demonstration(question: str, expression: str, product: int, use_tool: bool) -> list[dict]:
    """The conversation a demonstration shows (veRL's message layout: tool_calls with dict arguments)."""
    messages = [{"role": "user", "content": question}]
    if use_tool:
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"expr": expression}}}
                ],
            },
            {"role": "tool", "content": str(product)},
        ]
    messages.append({"role": "assistant", "content": f"#### {product}"})
    return messages


def rl_row(question: str, product: int, split: str, index: int, interaction: bool) -> dict:
    extra = {"split": split, "index": index, "question": question}  # the calculator needs no tools_kwargs
    if interaction:
        extra["interaction_kwargs"] = {"name": INTERACTION_NAME, "ground_truth": str(product)}
    return {
        "data_source": DATA_SOURCE,
        "agent_name": "tool_agent",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(product)},
        "extra_info": extra,
    }


def write_tool_yaml(path: str) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "class_name": "hybridflow.tools.calculator_tool.CalculatorTool",
                        "config": {"type": "native"},
                        "tool_schema": TOOL_SCHEMA,
                    }
                ]
            },
            f,
            sort_keys=False,
        )
    return path


def write_interaction_yaml(path: str) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(
            {
                "interaction": [
                    {
                        "name": INTERACTION_NAME,
                        "class_name": "hybridflow.interactions.gsm8k_interaction.Gsm8kInteraction",
                        "config": {},
                    }
                ]
            },
            f,
            sort_keys=False,
        )
    return path


def write_tiny_tool_task(
    data_dir: str,
    seed: int = 0,
    sft_size: int = 400,
    train_size: int = 1024,
    test_size: int = 200,
    tool_share: float = 0.4,
    interaction: bool = False,
) -> dict[str, str]:
    """Disjoint SFT / RL-train / test problems (test drawn first); returns name -> path."""
    os.makedirs(data_dir, exist_ok=True)
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[tuple[str, str, int]]] = {}
    for split, size in (("test", test_size), ("sft", sft_size), ("train", train_size)):
        rows = []
        while len(rows) < size:
            problem = make_problem(rng)
            if problem[0] not in seen:
                seen.add(problem[0])
                rows.append(problem)
        splits[split] = rows
    paths = {"tools": write_tool_yaml(os.path.join(data_dir, "calc_tool.yaml"))}
    if interaction:
        paths["interaction"] = write_interaction_yaml(os.path.join(data_dir, "gsm8k_interaction.yaml"))
    for split in ("train", "test"):
        paths[split] = os.path.join(data_dir, f"{split}.parquet")
        write_parquet([rl_row(q, p, split, i, interaction) for i, (q, _, p) in enumerate(splits[split])], paths[split])
    sft = [
        {
            "messages": json.dumps(demonstration(q, e, p, use_tool=rng.random() < tool_share)),
            "tools": json.dumps([TOOL_SCHEMA]),
        }
        for q, e, p in splits["sft"]
    ]
    paths["sft_train"] = os.path.join(data_dir, "sft_train.parquet")
    write_parquet(sft, paths["sft_train"])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write the 3-digit x 2-digit multiplication tool-use task.")
    p.add_argument("--data_dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sft_size", type=int, default=400)
    p.add_argument("--train_size", type=int, default=1024)
    p.add_argument("--test_size", type=int, default=200)
    p.add_argument("--tool_share", type=float, default=0.4)
    p.add_argument(
        "--interaction", action="store_true", help="rows name the gsm8k interaction (hint after a wrong answer)"
    )
    a = p.parse_args(argv)
    paths = write_tiny_tool_task(a.data_dir, a.seed, a.sft_size, a.train_size, a.test_size, a.tool_share, a.interaction)
    print("wrote " + ", ".join(paths.values()))


if __name__ == "__main__":
    main()
