"""``python -m hybridflow.main_generation key=val ...``: sample ``data.n_samples`` responses for every
prompt of a parquet file and write them next to the input columns (configs/generation.yaml, veRL's keys).

    python -m hybridflow.main_generation model.path=DIR data.path=test.parquet data.n_samples=4 \
        data.output_path=gen.parquet rollout.temperature=1.0 rollout.response_length=256 \
        trainer.n_gpus_per_node=2          # or trainer.backend=inprocess (no Ray)

The policy runs in ActorRolloutRefWorker processes with role ``rollout`` behind a WorkerGroup, so
generation uses exactly the engine (hf or vllm) and sampling settings of RL training. The output
parquet holds every input column plus ``responses``: a list of n_samples strings per row, which
``python -m hybridflow.main_eval`` scores.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hybridflow.config.loader import parse_cli
from hybridflow.trainer.generation import run_generation
from hybridflow.utils.logging_utils import setup_cli_logging


def main(argv: Sequence[str] | None = None) -> str:
    setup_cli_logging()
    return run_generation(parse_cli("generation", sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
