"""Rollout tests run generate many times: one intra-op thread avoids oversubscribing the shared
2-core machine (with 2 threads a generate call here was ~30x slower under load)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
