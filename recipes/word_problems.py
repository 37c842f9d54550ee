"""GSM8K-format word problems written here (no data set is downloaded): one- and two-step arithmetic
stories about everyday things, each row in veRL's parquet format (``prompt`` as chat messages that ask
for the answer after ``####``, ``data_source=openai/gsm8k`` so the gsm8k rule scorer grades it,
``reward_model.ground_truth`` the number as a string)."""

from __future__ import annotations

import os
import random

INSTRUCTION = 'Answer briefly and write the final answer as a number after "####".'
NAMES = ["Tom", "Anna", "Lee", "Maria", "Sam", "Priya", "Omar", "Julia", "Ken", "Sofia", "Ben", "Mia"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "stamps", "shells", "cards", "eggs"]


KINDS = ("add", "sub", "mul", "div", "two_step", "mul_add", "add3", "mul_sub", "div_add")


def _story(rng: random.Random, kind: str, hi: int) -> tuple[str, int, str]:
    """(question, answer, working): the working is the equation a brief solution writes."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if kind == "add":
        a, b = rng.randint(1, hi), rng.randint(1, hi)
        return (
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            a + b,
            f"{a} + {b} = {a + b}",
        )
    if kind == "sub":
        a = rng.randint(3, 2 * hi)
        b = rng.randint(1, a - 1)
        return (
            f"{name} has {a} {item} and gives {b} of them away. How many {item} are left?",
            a - b,
            f"{a} - {b} = {a - b}",
        )
    if kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return (
            f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have?",
            a * b,
            f"{a} * {b} = {a * b}",
        )
    if kind == "div":
        b, q = rng.randint(2, 9), rng.randint(2, 9)
        return (
            f"{name} shares {b * q} {item} equally among {b} friends. How many {item} does each friend get?",
            q,
            f"{b * q} / {b} = {q}",
        )
    if kind == "two_step":
        a, b, c = rng.randint(2, hi), rng.randint(1, hi), rng.randint(1, 5)
        c = min(c, a + b - 1)
        return (
            (f"{name} has {a} {item}, buys {b} more and then loses {c}. How many {item} does {name} have now?"),
            a + b - c,
            f"{a} + {b} = {a + b}, {a + b} - {c} = {a + b - c}",
        )
    if kind == "mul_add":
        a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, hi)
        return (
            (
                f"{name} has {a} boxes with {b} {item} in each box and {c} loose {item}. "
                f"How many {item} does {name} have in all?"
            ),
            a * b + c,
            f"{a} * {b} = {a * b}, {a * b} + {c} = {a * b + c}",
        )
    if kind == "add3":
        a, b, c = rng.randint(2, hi), rng.randint(2, hi), rng.randint(2, hi)
        return (
            (f"{name} has {a} {item}, finds {b} more and then gets {c} more. How many {item} does {name} have now?"),
            a + b + c,
            f"{a} + {b} = {a + b}, {a + b} + {c} = {a + b + c}",
        )
    if kind == "mul_sub":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        c = rng.randint(1, a * b - 1)
        question = f"{name} buys {a} packs of {b} {item} and gives away {c} of them. How many {item} are left?"
        return question, a * b - c, f"{a} * {b} = {a * b}, {a * b} - {c} = {a * b - c}"
    if kind == "div_add":
        b, q, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, hi)
        question = (
            f"{name} shares {b * q} {item} equally among {b} friends, and each friend already has {c} {item}. "
            f"How many {item} does each friend have now?"
        )
        return question, q + c, f"{b * q} / {b} = {q}, {q} + {c} = {q + c}"
    raise ValueError(f"unknown problem kind {kind!r}")


def make_rows(n: int, seed: int, split: str, kinds=KINDS, hi: int = 20) -> list[dict]:
    """``n`` rows in veRL's gsm8k format (operands of sums up to ``hi``); the same arguments always give the
    same rows."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(n):
        question, answer, working = _story(rng, kinds[index % len(kinds)], hi)
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "question": question,
                    "answer": str(answer),
                    "working": working,
                },
            }
        )
    return rows


def write_word_problems(out_dir: str, seed: int, train_size: int, test_size: int, kinds=KINDS, hi: int = 20) -> dict:
    """train.parquet and heldout.parquet (questions of the held-out split never occur in train)."""
    import pandas as pd

    os.makedirs(out_dir, exist_ok=True)
    train = make_rows(train_size, seed, "train", kinds, hi)
    seen = {r["extra_info"]["question"] for r in train}
    heldout = [r for r in make_rows(test_size * 2, seed, "test", kinds, hi) if r["extra_info"]["question"] not in seen][
        :test_size
    ]
    paths = {"train": os.path.join(out_dir, "train.parquet"), "heldout": os.path.join(out_dir, "heldout.parquet")}
    pd.DataFrame(train).to_parquet(paths["train"])
    pd.DataFrame(heldout).to_parquet(paths["heldout"])
    return paths


def committed_correct(text: str, truth: str) -> bool:
    """Whether the answer the model commits to is right: the number after ``####`` where there is one,
    else the last number (the strict rule alone also grades the format; the last number alone misreads a
    model that restates a number after its ``#### N`` line)."""
    from hybridflow.rewards.scorers.gsm8k import answers_match, extract_solution

    answer = extract_solution(text, "strict", lenient=True) or extract_solution(text, "flexible", lenient=True)
    return answer is not None and answers_match(answer, truth, lenient=True)
