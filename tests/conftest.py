"""Shared fixtures for the whole suite: an offline tiny model + tokenizer, the tiny task's parquet
files, and one local Ray session that is started only if some test asks for it.

Markers: ``slow`` (registered only; deselect with ``-m "not slow"``) and ``gpu`` (skipped when
torch.cuda is unavailable).
"""

from __future__ import annotations

import os
import sys

# set before anything imports tokenizers/transformers: no network, no fork warnings
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# one compute thread per process: tests run Ray workers beside the driver on 2 cores, and
# oversubscribed BLAS threads made tiny-model steps 15-30x slower here
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # tests run from a checkout without installing the package
    sys.path.insert(0, REPO_ROOT)

import pytest  # noqa: E402

TINY_TRAIN_SIZE = 64
TINY_TEST_SIZE = 32


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds; deselect with -m 'not slow'")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A saved tiny Qwen2 (hidden 128, 4 layers, ~0.6M params) + char tokenizer (vocab 100)."""
    from hybridflow.utils.tiny_model import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    """The tiny tokenizer loaded back from ``tiny_model_dir`` (left padding)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> str:
    """train/test/sft_train/sft_test parquet files of the tiny arithmetic task (64 train / 32 test rows)."""
    from hybridflow.data.tiny_task import write_tiny_task

    out = str(tmp_path_factory.mktemp("tiny_data"))
    write_tiny_task(out, seed=0, train_size=TINY_TRAIN_SIZE, test_size=TINY_TEST_SIZE)
    return out


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (4 logical CPUs), shut down at the end.

    Workers get the repository on PYTHONPATH so they import ``hybridflow`` without an install.
    """
    import ray

    if ray.is_initialized():  # someone else started it; use theirs and leave it running
        yield ray
        return
    pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        address="local",  # our own instance, even if a `ray start` cluster runs on this machine
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={
            "env_vars": {
                "PYTHONPATH": pythonpath,
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
        },
    )
    try:
        yield ray
    finally:
        ray.shutdown()
