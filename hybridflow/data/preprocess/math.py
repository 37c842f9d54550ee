"""MATH -> RL parquet rows, from a LOCAL copy of ``DigitalLearningGmbH/MATH-lighteval`` (no network).

    python -m hybridflow.data.preprocess.math --local_dir ~/raw/math --local_save_dir ~/data/math

The input directory is laid out as the hub serves it (``data/train-00000-of-00001.parquet``, ...)
or holds ``train.jsonl`` / ``test.jsonl``; rows have ``problem``, ``solution`` (and ``level``,
``type``). The ground truth is the content of the solution's last ``\\boxed{}``.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridflow.data.preprocess.local_io import preprocess_main
from hybridflow.rewards.scorers.math import last_boxed_only_string, remove_boxed

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
    return preprocess_main(
        argv, __doc__.splitlines()[0], "the MATH data set", "~/data/math", make_map_fn, ("problem", "solution")
    )


if __name__ == "__main__":
    main()
