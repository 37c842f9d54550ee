"""A built-in arithmetic task in GSM8K format, small enough that a ~0.6M-parameter model learns it on a
CPU: one-step word problems over 2-digit addition/subtraction, answered as ``23+45=68\\n#### 68``.

Rows follow the RL parquet layout (``data_source="openai/gsm8k"`` so the gsm8k scorer grades them);
SFT files hold the same rows plus plain ``question`` (the full user prompt) / ``answer`` columns.

    python -m hybridflow.data.tiny_task --data_dir DIR [--model_dir DIR] --seed 0 --train_size N --test_size M
"""

from __future__ import annotations

import argparse
import os
import random
from typing import Sequence

DATA_SOURCE = "openai/gsm8k"
# every character is a token for the tiny tokenizer, so the instruction is short
INSTRUCTION = 'Answer after "####".'

NAMES = ("Tom", "Ann", "Sam", "Mia", "Leo", "Eva", "Max", "Zoe", "Ben", "Ivy")
ITEMS = ("apples", "pens", "cards", "books", "coins", "shells", "eggs", "stamps")

# (template, op): templates take name, a, b, item; pronoun-free so every name fits
ADD_TEMPLATES = (
    "{name} has {a} {item} and gets {b} more. How many {item} now?",
    "{name} had {a} {item}, then found {b}. How many {item} in all?",
    "A box has {a} {item}. {name} adds {b}. How many {item} are there?",
)
SUB_TEMPLATES = (
    "{name} has {a} {item} and gives away {b}. How many are left?",
    "{name} had {a} {item} and lost {b}. How many {item} remain?",
    "A box has {a} {item}. {name} takes {b}. How many are left?",
)


def make_problem(rng: random.Random) -> tuple[str, str, int]:
    """Draw one problem: (question, worked solution ending in ``#### N``, answer)."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        template, expr, answer = rng.choice(ADD_TEMPLATES), f"{a}+{b}", a + b
    else:
        a, b = max(a, b), min(a, b)  # keep answers non-negative
        template, expr, answer = rng.choice(SUB_TEMPLATES), f"{a}-{b}", a - b
    question = template.format(name=name, a=a, b=b, item=item)
    return question, f"{expr}={answer}\n#### {answer}", answer


def make_row(question: str, solution: str, answer: int, split: str, index: int) -> dict:
    """One RL row in veRL's layout."""
    prompt = f"{question} {INSTRUCTION}"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": solution},
    }


def generate_splits(seed: int, train_size: int, test_size: int) -> tuple[list[dict], list[dict]]:
    """Disjoint train/test rows; test is drawn first, so it depends only on (seed, test_size)."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits = {}
    for split, size in (("test", test_size), ("train", train_size)):
        rows: list[dict] = []
        attempts = 0
        while len(rows) < size:
            attempts += 1
            if attempts > 50 * size + 1000:
                raise ValueError(f"could not draw {size} distinct {split} problems; the task space is too small")
            question, solution, answer = make_problem(rng)
            if question in seen:
                continue
            seen.add(question)
            rows.append(make_row(question, solution, answer, split, len(rows)))
        splits[split] = rows
    return splits["train"], splits["test"]


def to_sft_rows(rows: list[dict]) -> list[dict]:
    """RL rows plus ``question`` (the exact user prompt RL sees) and ``answer`` (the worked solution)."""
    return [{**r, "question": r["prompt"][0]["content"], "answer": r["extra_info"]["answer"]} for r in rows]


def write_parquet(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def write_tiny_task(data_dir: str, seed: int = 0, train_size: int = 2048, test_size: int = 256) -> dict[str, str]:
    """Write train/test (RL) and sft_train/sft_test parquet files; returns name -> path."""
    os.makedirs(data_dir, exist_ok=True)
    train, test = generate_splits(seed, train_size, test_size)
    files = {
        "train": (train, "train.parquet"),
        "test": (test, "test.parquet"),
        "sft_train": (to_sft_rows(train), "sft_train.parquet"),
        "sft_test": (to_sft_rows(test), "sft_test.parquet"),
    }
    paths = {}
    for name, (rows, fname) in files.items():
        paths[name] = os.path.join(data_dir, fname)
        write_parquet(rows, paths[name])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write the built-in 2-digit arithmetic task (and optionally the tiny model).")
    p.add_argument("--data_dir", required=True)
    p.add_argument("--model_dir", default=None, help="also write the tiny model + tokenizer here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_size", type=int, default=2048)
    p.add_argument("--test_size", type=int, default=256)
    p.add_argument("--arch", default="qwen2")
    a = p.parse_args(argv)
    paths = write_tiny_task(a.data_dir, seed=a.seed, train_size=a.train_size, test_size=a.test_size)
    print(f"wrote {a.train_size} train / {a.test_size} test rows: {', '.join(paths.values())}")
    if a.model_dir:
        from hybridflow.utils.tiny_model import save_tiny_model

        save_tiny_model(a.model_dir, arch=a.arch, seed=a.seed)
        print(f"wrote tiny {a.arch} model to {a.model_dir}")


if __name__ == "__main__":
    main()
