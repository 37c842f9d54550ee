"""One short trainer run on each backend, from the same test (issue 23: nothing above the single
controller asks which backend it has). GRPO with a separate rollout pool, so the run passes every place
that used to branch on the backend: building the groups, the agent loop workers, the rollout servers
and the weight receivers the trainer pushes to after each update."""

from __future__ import annotations

import pytest

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # in-process runs compute in this process

SEPARATE_POOL = ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]


def test_grpo_with_a_separate_rollout_pool_on_each_backend(backend, tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=2, backend=backend)
    overrides += [*SEPARATE_POOL, "trainer.logger=['file']", "trainer.test_freq=-1"]
    last = run_ppo(load_config("ppo_trainer", overrides))

    steps = read_metrics(tmp_path)
    assert [m["step"] for m in steps] == [1, 2] and last["critic/advantages/max"] > 0
    for m in steps:
        assert_finite(m)
        # the rollout pool generated with the actor's newest weights, pushed to it after every update (the
        # initial push included): sampled and recomputed log-probs agree, and no sample is stale
        assert m["rollout/weight_sync_mb"] > 0 and m["rollout/weight_sync_buckets"] >= 1, m
        assert m["training/rollout_probs_diff_mean"] < 1e-3 and m["async/staleness/max"] == 0, m
