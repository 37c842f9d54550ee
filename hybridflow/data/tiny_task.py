"""A built-in arithmetic task in GSM8K format, small enough that a ~0.6M-parameter model learns it on a
CPU: one-step word problems over 2-digit addition/subtraction. Two solution styles:

* ``direct``: ``23+45=68\\n#### 68``.
* ``steps`` (the default of the command line and the quickstart): column arithmetic written out,
  ``3+5=8, 2+4=6, so 68\\n#### 68``. Each step is a one-digit fact; a tiny model learns it in about half
  the SFT steps, and RL then improves held-out accuracy far more. On the direct style the tiny model's
  errors are near-miss sums (74 for 75) and GRPO plateaued near 37% from a 19% start.

Rows follow the RL parquet layout (``data_source="openai/gsm8k"`` so the gsm8k scorer grades them);
SFT files hold the same rows plus plain ``question`` (the full user prompt) / ``answer`` columns.

    python -m hybridflow.data.tiny_task --data_dir DIR [--model_dir DIR] --seed 0 --train_size N --test_size M
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Sequence

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


SOLUTION_STYLES = ("direct", "steps")


def digit_steps(a: int, b: int, op: str) -> str:
    """Column arithmetic written out, ones then tens: every step is a one-digit fact.

    ``56+19`` -> ``6+9=15, 5+1+1=7, so 75``; ``56-19`` -> ``16-9=7, 5-1-1=3, so 37`` (a borrow shows as
    the 1 written before the ones digit and the extra ``-1`` on the tens).
    """
    a1, a10, b1, b10 = a % 10, a // 10, b % 10, b // 10
    if op == "+":
        ones = a1 + b1
        carry = ones // 10
        tens = a10 + b10 + carry
        tens_expr = f"{a10}+{b10}+1" if carry else f"{a10}+{b10}"
        return f"{a1}+{b1}={ones}, {tens_expr}={tens}, so {a + b}"
    borrow = a1 < b1
    ones = a1 + 10 * borrow - b1
    tens = a10 - b10 - borrow
    ones_expr = f"1{a1}-{b1}" if borrow else f"{a1}-{b1}"
    tens_expr = f"{a10}-{b10}-1" if borrow else f"{a10}-{b10}"
    return f"{ones_expr}={ones}, {tens_expr}={tens}, so {a - b}"


def make_problem(rng: random.Random, style: str = "direct") -> tuple[str, str, int]:
    """Draw one problem: (question, worked solution ending in ``#### N``, answer)."""
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        template, expr, answer = rng.choice(ADD_TEMPLATES), f"{a}+{b}", a + b
    else:
        a, b = max(a, b), min(a, b)  # keep answers non-negative
        template, expr, answer = rng.choice(SUB_TEMPLATES), f"{a}-{b}", a - b
    question = template.format(name=name, a=a, b=b, item=item)
    if style == "steps":
        return question, f"{digit_steps(a, b, expr[2])}\n#### {answer}", answer
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


def generate_splits(seed: int, train_size: int, test_size: int, style: str = "direct") -> tuple[list[dict], list[dict]]:
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
            question, solution, answer = make_problem(rng, style)
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


def write_tiny_task(
    data_dir: str, seed: int = 0, train_size: int = 2048, test_size: int = 256, style: str = "direct"
) -> dict[str, str]:
    """Write train/test (RL) and sft_train/sft_test parquet files; returns name -> path."""
    if style not in SOLUTION_STYLES:
        raise ValueError(f"unknown solution style {style!r}; known: {', '.join(SOLUTION_STYLES)}")
    os.makedirs(data_dir, exist_ok=True)
    train, test = generate_splits(seed, train_size, test_size, style)
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
    p = argparse.ArgumentParser(
        description="Write the built-in 2-digit arithmetic task (and optionally the tiny model)."
    )
    p.add_argument("--data_dir", required=True)
    p.add_argument("--model_dir", default=None, help="also write the tiny model + tokenizer here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train_size", type=int, default=2048)
    p.add_argument("--test_size", type=int, default=256)
    p.add_argument("--arch", default="qwen2")
    p.add_argument(
        "--style",
        choices=SOLUTION_STYLES,
        default="steps",
        help="worked solutions: 'steps' (column arithmetic digit by digit, the quickstart's) or 'direct' (56+19=75)",
    )
    a = p.parse_args(argv)
    paths = write_tiny_task(a.data_dir, seed=a.seed, train_size=a.train_size, test_size=a.test_size, style=a.style)
    print(f"wrote {a.train_size} train / {a.test_size} test rows: {', '.join(paths.values())}")
    if a.model_dir:
        from hybridflow.models.tiny import save_tiny_model

        save_tiny_model(a.model_dir, arch=a.arch, seed=a.seed)
        print(f"wrote tiny {a.arch} model to {a.model_dir}")


if __name__ == "__main__":
    main()
