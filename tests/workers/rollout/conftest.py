"""Rollout tests run generate many times: one intra-op thread avoids oversubscribing the shared
2-core machine (with 2 threads a generate call here was ~30x slower under load)."""

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):  # tests/conftest.py
    yield
