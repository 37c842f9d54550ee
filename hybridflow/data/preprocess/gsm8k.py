"""GSM8K -> RL parquet rows, from a LOCAL copy of ``openai/gsm8k`` (no network).

    python -m hybridflow.data.preprocess.gsm8k --local_dir ~/raw/gsm8k --local_save_dir ~/data/gsm8k

The input directory is laid out as the hub serves it (``main/train-00000-of-00001.parquet``, ...)
or holds ``train.jsonl`` / ``test.jsonl``; rows have ``question`` and ``answer``.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Sequence

from hybridflow.data.preprocess.local_io import convert_split, write_rows

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_FINAL_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(solution_str: str) -> str:
    """The number after ``####`` with thousands separators removed (``"#### 1,234"`` -> ``"1234"``)."""
    match = _FINAL_ANSWER.search(solution_str)
    if match is None:
        raise ValueError(f"no '#### <number>' final answer in GSM8K solution: {solution_str[-80:]!r}")
    return match.group(1).replace(",", "")


def make_map_fn(split: str):
    """Returns ``process(example, idx) -> row`` in the RL layout."""

    def process(example: dict, idx: int) -> dict:
        question_raw = example.pop("question")
        answer_raw = example.pop("answer")
        return {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question_raw} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": extract_solution(answer_raw)},
            "extra_info": {"split": split, "index": idx, "answer": answer_raw, "question": question_raw},
        }

    return process


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_dir", "--local_dataset_path", dest="local_dir", required=True,
                   help="local copy of openai/gsm8k (hub layout or train/test .jsonl)")
    p.add_argument("--local_save_dir", default="~/data/gsm8k", help="where train.parquet / test.parquet go")
    a = p.parse_args(argv)
    out_dir = os.path.expanduser(a.local_save_dir)
    written = {}
    for split in ("train", "test"):
        rows = convert_split(a.local_dir, split, make_map_fn(split), columns=("question", "answer"))
        written[split] = os.path.join(out_dir, f"{split}.parquet")
        write_rows(rows, written[split])
        print(f"wrote {len(rows)} {split} rows to {written[split]}")
    return written


if __name__ == "__main__":
    main()
