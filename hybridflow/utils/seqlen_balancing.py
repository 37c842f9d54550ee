"""veRL's import path ``verl.utils.seqlen_balancing``. The implementations live with the workers
(micro-batches need DataProto, a layer above utils) and the trainer (balancing ranks)."""

from hybridflow.trainer.ppo.balance import get_group_balanced_partitions
from hybridflow.workers.utils.dynamic_batch import (
    get_seqlen_balanced_partitions,
    prepare_dynamic_batch,
    rearrange_micro_batches,
)
from hybridflow.workers.utils.micro_batches import get_reverse_idx, restore_dynamic_batch

__all__ = [
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "prepare_dynamic_batch",
    "rearrange_micro_batches",
    "restore_dynamic_batch",
]
