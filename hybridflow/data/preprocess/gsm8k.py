"""GSM8K -> RL parquet rows, from a LOCAL copy of ``openai/gsm8k`` (no network).

    python -m hybridflow.data.preprocess.gsm8k --local_dir ~/raw/gsm8k --local_save_dir ~/data/gsm8k

The input directory is laid out as the hub serves it (``main/train-00000-of-00001.parquet``, ...)
or holds ``train.jsonl`` / ``test.jsonl``; rows have ``question`` and ``answer``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hybridflow.data.preprocess.local_io import preprocess_main

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
    return preprocess_main(
        argv, __doc__.splitlines()[0], "openai/gsm8k", "~/data/gsm8k", make_map_fn, ("question", "answer")
    )


if __name__ == "__main__":
    main()
