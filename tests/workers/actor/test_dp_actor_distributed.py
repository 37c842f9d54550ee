"""Two gloo ranks with a DDP-wrapped model make exactly the single-process full-batch update."""

import copy
import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from hybridflow.protocol import DataProto
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.workers.actor import DataParallelPPOActor
from hybridflow.workers.utils.micro_batches import split_by_token_budget
from tests.workers.actor.ppo_batch import actor_config, flat_params, ppo_batch, tiny_causal_lm

LR = 0.5
# rank 0 gets long responses, rank 1 short ones: averaging per-rank token means would be wrong
RESPONSE_LENS = [5, 5, 4, 5, 1, 2, 1, 1]
RANK_ROWS = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
# mini-batch j of 2 rows per rank = rows (2j, 2j+1) of rank 0 + (4+2j, 5+2j) of rank 1
SINGLE_PROCESS_ORDER = [0, 1, 4, 5, 2, 3, 6, 7]
VARIANTS = {
    "token-mean": {"loss_agg_mode": "token-mean"},
    "seq-mean-token-mean": {"loss_agg_mode": "seq-mean-token-mean"},
    # rank 0 needs 2 micro-batches per mini-batch at this budget, rank 1 only 1: they must agree
    "token-mean/token-budget": {
        "loss_agg_mode": "token-mean",
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 12,
    },
}


def _config(**overrides):
    return actor_config(
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        **overrides,
    )


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {}
        for name, overrides in VARIANTS.items():
            base = tiny_causal_lm()
            data = ppo_batch(base, batch_size=8, response_lens=RESPONSE_LENS).select_idxs(RANK_ROWS[rank])
            model = DistributedDataParallel(copy.deepcopy(base))
            actor = DataParallelPPOActor(_config(**overrides), model, torch.optim.SGD(model.parameters(), lr=LR))
            metrics = actor.update_policy(data)
            results[name] = (flat_params(model.module), metrics)

        # token-budget split with a dp group: both ranks run the larger number of micro-batches
        lengths = [10, 10, 10, 10] if rank == 0 else [1, 1, 1, 1]
        mask = (torch.arange(12) < torch.tensor(lengths)[:, None]).long()
        micro, _ = split_by_token_budget(DataProto.from_dict({"attention_mask": mask}), 20, dp_group=dist.group.WORLD)
        results["micro_batch_count"] = len(micro)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        # the gloo thread frees each finished all-reduce (and its tensors) after the fact; a barrier queued
        # behind them waits for that, and the DDP models go before the group: otherwise the group's
        # destructor, run at exit while holding the GIL, joins a gloo thread that waits for the GIL (seen here)
        dist.barrier()
        del model, actor
        gc.collect()
    finally:
        dist.destroy_process_group()


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_two_ddp_ranks_equal_single_process_full_batch(tmp_path):
    mp.spawn(_rank_main, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    # rank 0 alone: 40 tokens -> 2 micro-batches of 20; rank 1 alone: 4 tokens -> 1; agreed: 2
    assert ranks[0]["micro_batch_count"] == ranks[1]["micro_batch_count"] == 2

    base = tiny_causal_lm()
    data = ppo_batch(base, batch_size=8, response_lens=RESPONSE_LENS).select_idxs(SINGLE_PROCESS_ORDER)
    for name, overrides in VARIANTS.items():
        model = copy.deepcopy(base)
        overrides = {**overrides, "use_dynamic_bsz": False}
        config = actor_config(
            ppo_mini_batch_size=4,
            ppo_micro_batch_size_per_gpu=4,
            entropy_coeff=0.01,
            use_kl_loss=True,
            kl_loss_coef=0.1,
            **overrides,
        )
        expected = DataParallelPPOActor(config, model, torch.optim.SGD(model.parameters(), lr=LR)).update_policy(data)
        for rank in ranks:
            params, metrics = rank[name]
            diff = (params - flat_params(model)).abs().max().item()
            assert diff < 1e-5, f"{name}: rank params differ from single process by {diff}"
            assert metrics["actor/grad_norm"] == pytest.approx(expected["actor/grad_norm"], rel=1e-4)
        # loss metrics are per-rank shares x world size: their mean over ranks is the global loss
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy"):
            mean_over_ranks = [(a + b) / 2 for a, b in zip(ranks[0][name][1][key], ranks[1][name][1][key], strict=True)]
            assert mean_over_ranks == pytest.approx(expected[key], abs=1e-5), (name, key)
        assert (flat_params(model) - flat_params(base)).abs().max() > 1e-3
