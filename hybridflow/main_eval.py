"""``python -m hybridflow.main_eval key=val ...``: score the responses written by main_generation and
print, per data source, the mean score and pass@k (configs/evaluation.yaml, veRL's keys).

    python -m hybridflow.main_eval data.path=gen.parquet \
        [custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score]

Each row's ``data.response_key`` column holds its n responses; ``data.reward_model_key`` holds
``{"ground_truth": ...}``; ``data.data_source_key`` picks the built-in scorer (gsm8k, math, ...) unless
a custom function is given. A response counts as correct when its score is > 0 (rule scorers give 1
for right, 0 for wrong); pass@k uses the unbiased estimator, for k = 1, 2, 4, ... and n.
Scoring is cheap string work and runs in this process (``ray_kwargs`` is accepted and unused; setting
it prints a note).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from hybridflow.config.convert import as_section
from hybridflow.config.evaluation import EvaluationConfig
from hybridflow.config.loader import parse_cli
from hybridflow.data.rl_dataset import read_parquet_rows
from hybridflow.rewards import get_custom_reward_fn
from hybridflow.trainer.eval_utils import score_responses, summarize_scores
from hybridflow.utils.logging_utils import setup_cli_logging


def _ground_truth(row: dict, key: str, index: int):
    info = row.get(key)
    if not isinstance(info, dict) or "ground_truth" not in info:
        raise KeyError(f"row {index}: column {key!r} must hold a dict with 'ground_truth', got {info!r}")
    return info["ground_truth"]


def run_eval(config) -> dict[str, float]:
    """Scores of every response of data.path; returns {"<data_source>/mean_score": .., "<data_source>/pass@k": ..}."""
    config = as_section(config, EvaluationConfig)  # the composed tree, read into its typed tree once
    d = config.data
    crf = config.custom_reward_function
    compute_score = get_custom_reward_fn(crf.path, crf.name, dict(crf.reward_kwargs))
    rows = read_parquet_rows(os.path.expanduser(d.path), required_column=d.response_key)
    sources, scores = [], []
    for i, row in enumerate(rows):
        responses = row[d.response_key]
        responses = [responses] if isinstance(responses, str) else list(responses)
        if not responses:
            raise ValueError(f"row {i}: no responses in column {d.response_key!r}")
        source = row[d.data_source_key]
        sources.append(source)
        scores.append(
            score_responses(
                compute_score, source, responses, _ground_truth(row, d.reward_model_key, i), row.get("extra_info")
            )
        )
    return summarize_scores(sources, scores)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    setup_cli_logging()
    metrics = run_eval(parse_cli("evaluation", sys.argv[1:] if argv is None else argv))
    for key in sorted(metrics):
        print(f"{key}: {metrics[key]:.4f}")
    return metrics


if __name__ == "__main__":
    main()
