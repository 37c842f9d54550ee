"""MATH -> RL parquet rows, from a LOCAL copy of ``DigitalLearningGmbH/MATH-lighteval`` (no network).

    python -m hybridflow.data.preprocess.math --local_dir ~/raw/math --local_save_dir ~/data/math

The input directory is laid out as the hub serves it (``data/train-00000-of-00001.parquet``, ...)
or holds ``train.jsonl`` / ``test.jsonl``; rows have ``problem``, ``solution`` (and ``level``,
``type``). The ground truth is the content of the solution's last ``\\boxed{}``.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

from hybridflow.data.preprocess.local_io import convert_split, write_rows
from hybridflow.utils.reward_score.math import last_boxed_only_string, remove_boxed

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def extract_solution(solution_str: str) -> str:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in a MATH solution."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        raise ValueError(f"no \\boxed{{}} answer in MATH solution: {solution_str[-80:]!r}")
    return remove_boxed(boxed)


def make_map_fn(split: str):
    """Returns ``process(example, idx) -> row`` in the RL layout."""

    def process(example: dict, idx: int) -> dict:
        problem = example.pop("problem")
        solution = example.pop("solution")
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": extract_solution(solution)},
            "extra_info": {
                "split": split,
                "index": idx,
                "question": problem,
                "answer": solution,
                "level": example.get("level"),
                "type": example.get("type"),
            },
        }

    return process


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_dir", "--local_dataset_path", dest="local_dir", required=True,
                   help="local copy of the MATH data set (hub layout or train/test .jsonl)")
    p.add_argument("--local_save_dir", default="~/data/math", help="where train.parquet / test.parquet go")
    a = p.parse_args(argv)
    out_dir = os.path.expanduser(a.local_save_dir)
    written = {}
    for split in ("train", "test"):
        rows = convert_split(a.local_dir, split, make_map_fn(split), columns=("problem", "solution"))
        written[split] = os.path.join(out_dir, f"{split}.parquet")
        write_rows(rows, written[split])
        print(f"wrote {len(rows)} {split} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
