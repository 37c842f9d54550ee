"""Supervised fine-tuning from the command line, with veRL 0.9.1's SFT keys (configs/sft_trainer.yaml;
the earlier fsdp_sft_trainer spellings such as model.partial_pretrain work too):

    python -m hybridflow.main_sft model.path=DIR data.train_files=... data.val_files=... \
        data.prompt_key=question data.response_key=answer optim.lr=1e-3 trainer.total_training_steps=100

Several processes (one per GPU, or CPU processes over gloo), each taking 1/N of every global batch:

    torchrun --standalone --nproc_per_node=2 -m hybridflow.main_sft ...

Writes Hugging Face directories to ``trainer.default_local_dir/global_step_N`` (with the training state in
their ``engine/``) and prints the last one; run again, it continues from the newest (``trainer.resume_mode=auto``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist

from hybridflow.config.convert import as_section
from hybridflow.config.loader import parse_cli
from hybridflow.config.sft_trainer import SFTTrainerConfig
from hybridflow.trainer.config_checks import resolve_device
from hybridflow.trainer.sft_trainer import FSDPSFTTrainer
from hybridflow.utils.determinism import apply_full_determinism
from hybridflow.utils.logging_utils import setup_cli_logging
from hybridflow.workers.engine.fsdp import wants_offload


def init_distributed(device: str, one_rank_group: bool = False) -> None:
    """Join torchrun's process group (RANK/WORLD_SIZE/MASTER_* in the environment); a plain
    ``python -m`` run (no WORLD_SIZE) stays single-process without torch.distributed, unless
    ``one_rank_group``: FSDP2 (CPU offload) needs a group, here one of its own (an in-memory store,
    no port)."""
    if dist.is_initialized():
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not one_rank_group:
        return
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if device == "cuda" else "gloo"
    if world <= 1:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(backend=backend)


def run_sft(config) -> str:
    """Train from a composed ``sft_trainer`` config (or the typed ``SFTTrainerConfig``); returns the
    final Hugging Face directory. ``engine.full_determinism`` acts before the process group exists."""
    cfg = as_section(config, SFTTrainerConfig)
    device = resolve_device(cfg.trainer.device)
    started_here = not dist.is_initialized()
    apply_full_determinism([cfg.engine])
    offload = wants_offload(cfg.engine) and device == "cuda" and cfg.engine.strategy in ("fsdp", "fsdp2")
    init_distributed(device, one_rank_group=offload)
    try:
        return FSDPSFTTrainer(cfg).fit()
    finally:
        if started_here and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> str:
    setup_cli_logging()
    return run_sft(parse_cli("sft_trainer", sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
