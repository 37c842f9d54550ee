"""Fixtures of the single-controller tests."""

import pytest


@pytest.fixture
def inprocess_group():
    """``inprocess_group(cls_with_init)`` builds an InProcessWorkerGroup that is shut down after the test:
    until its ``shutdown()`` a group holds the rendezvous variables (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the process group its workers open."""
    from hybridflow.single_controller.inprocess import InProcessWorkerGroup

    groups = []

    def make(cls_with_init, **kwargs):
        group = InProcessWorkerGroup(cls_with_init, **kwargs)
        groups.append(group)
        return group

    yield make
    for group in reversed(groups):
        group.shutdown()
