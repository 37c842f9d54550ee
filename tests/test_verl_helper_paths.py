"""veRL's helper modules at veRL's import paths: the names import as veRL code writes them, and each
is the same object as hybridflow's implementation (one implementation, several paths)."""

import importlib

import pytest


def test_verl_style_imports_work():
    from hybridflow.trainer.ppo.metric_utils import (  # noqa: F401
        bootstrap_metric,
        calc_maj_val,
        compute_throughout_metrics,
        process_validation_metrics,
        reduce_metrics,
    )
    from hybridflow.trainer.ppo.rollout_corr_helper import (  # noqa: F401
        SUPPORTED_ROLLOUT_RS_OPTIONS,
        compute_offpolicy_metrics,
        compute_rollout_correction_and_rejection_mask,
    )
    from hybridflow.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: F401
    from hybridflow.utils.metric import AggregationType, Metric  # noqa: F401
    from hybridflow.utils.seqlen_balancing import (  # noqa: F401
        get_group_balanced_partitions,
        get_reverse_idx,
        prepare_dynamic_batch,
        rearrange_micro_batches,
        restore_dynamic_batch,
    )
    from hybridflow.utils.torch_functional import expand_as_nested  # noqa: F401


@pytest.mark.parametrize(
    "alias, name, home",
    [
        ("hybridflow.utils.metric", "reduce_metrics", "hybridflow.utils.metric.utils"),
        ("hybridflow.trainer.ppo.metric_utils", "reduce_metrics", "hybridflow.utils.metric.utils"),
        ("hybridflow.trainer.ppo.metric_utils", "flat_metric_values", "hybridflow.utils.metric.utils"),
        ("hybridflow.utils.metric", "Metric", "hybridflow.utils.metric.utils"),
        (
            "hybridflow.trainer.ppo.metric_utils",
            "process_validation_metrics",
            "hybridflow.trainer.ppo.validation_stats",
        ),
        ("hybridflow.trainer.ppo.metric_utils", "bootstrap_metric", "hybridflow.trainer.ppo.validation_stats"),
        ("hybridflow.trainer.ppo.metric_utils", "calc_maj_val", "hybridflow.trainer.ppo.validation_stats"),
        ("hybridflow.utils.seqlen_balancing", "rearrange_micro_batches", "hybridflow.workers.utils.dynamic_batch"),
        ("hybridflow.utils.seqlen_balancing", "prepare_dynamic_batch", "hybridflow.workers.utils.dynamic_batch"),
        ("hybridflow.utils.seqlen_balancing", "get_reverse_idx", "hybridflow.workers.utils.micro_batches"),
        ("hybridflow.utils.seqlen_balancing", "restore_dynamic_batch", "hybridflow.workers.utils.micro_batches"),
        ("hybridflow.utils.seqlen_balancing", "get_group_balanced_partitions", "hybridflow.trainer.ppo.balance"),
        ("hybridflow.utils.dataset.rl_dataset", "RLHFDataset", "hybridflow.data.rl_dataset"),
        ("hybridflow.utils.dataset.rl_dataset", "collate_fn", "hybridflow.data.rl_dataset"),
        ("hybridflow.utils.dataset", "RLHFDataset", "hybridflow.data.rl_dataset"),
        (
            "hybridflow.trainer.ppo.rollout_corr_helper",
            "SAFETY_BOUND",
            "hybridflow.algorithms.rollout_correction_metrics",
        ),
    ],
)
def test_alias_names_are_the_implementations(alias, name, home):
    assert getattr(importlib.import_module(alias), name) is getattr(importlib.import_module(home), name)


def test_the_restore_of_the_workers_is_the_verl_restore():
    """restore_order (the workers' per-micro-batch results) goes through veRL's restore_dynamic_batch."""
    import torch

    from hybridflow.utils.seqlen_balancing import restore_dynamic_batch
    from hybridflow.workers.utils.micro_batches import restore_order

    parts = [[1], [2, 0]]
    pieces = [torch.tensor([10]), torch.tensor([20, 0])]
    assert (
        restore_order(pieces, parts).tolist() == restore_dynamic_batch(torch.cat(pieces), parts).tolist() == [0, 10, 20]
    )
