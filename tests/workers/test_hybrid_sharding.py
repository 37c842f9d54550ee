"""fsdp_config.fsdp_size (hybrid sharding, as veRL): the mesh shape follows veRL's rule, and with two
gloo ranks and fsdp_size=1 every rank keeps whole parameters (replicated, sharded over a group of one)
while training still averages gradients over both ranks: the step equals the fully sharded one."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.workers.engine.fsdp import TrainEngine, engine_spec, fsdp_mesh_shape
from tests.yaml_sections import fsdp_engine, optim

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_mesh_shape_follows_verls_rule():
    assert fsdp_mesh_shape(8, -1) == ((8,), ("fsdp",))
    assert fsdp_mesh_shape(8, 8) == ((8,), ("fsdp",))  # a group as large as the world: plain FSDP
    assert fsdp_mesh_shape(8, 16) == ((8,), ("fsdp",))
    assert fsdp_mesh_shape(8, 2) == ((4, 2), ("ddp", "fsdp"))  # 4 replicas of 2-rank shards
    assert fsdp_mesh_shape(32, 8) == ((4, 8), ("ddp", "fsdp"))
    with pytest.raises(ValueError, match="fsdp_size=3 must divide the number of training ranks \\(8\\)"):
        fsdp_mesh_shape(8, 3)


def test_engine_spec_reads_fsdp_size_from_the_section():
    assert engine_spec(fsdp_engine(), "fsdp", "cpu").fsdp_size == -1
    assert engine_spec(fsdp_engine(fsdp_size=4), "fsdp", "cpu").fsdp_size == 4


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        config = build_tiny_config(
            100,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            intermediate_size=64,
            max_position_embeddings=32,
        )
        out = {}
        for fsdp_size in (-1, 1):
            spec = engine_spec(fsdp_engine(fsdp_size=fsdp_size), "fsdp", "cpu")
            engine = TrainEngine(build_tiny_model(config, seed=0), spec)
            engine.setup_optimizer(optim(lr=1e-2), total_steps=4)
            weight = engine.module.model.embed_tokens.weight
            ids = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(rank))  # per-rank data
            engine.module(input_ids=ids, labels=ids).loss.backward()
            engine.optimizer.step()
            out[fsdp_size] = {
                "mesh": tuple(weight.device_mesh.shape),
                "placements": [type(p).__name__ for p in weight.placements],
                "local_rows": weight.to_local().shape[0],
                "params": {k: v.detach().clone() for k, v in engine.full_state_dict().items()},
            }
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_size_one_replicates_whole_parameters_and_trains_like_full_sharding(tmp_path):
    mp.spawn(_rank_main, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r in ranks:
        full, hybrid = r[-1], r[1]
        # 100 embedding rows: halved over the two ranks, whole on each rank with groups of one
        assert (full["mesh"], full["placements"], full["local_rows"]) == ((2,), ["Shard"], 50)
        assert (hybrid["mesh"], hybrid["placements"], hybrid["local_rows"]) == ((2, 1), ["Replicate", "Shard"], 100)
        # the gradients were averaged across the replicas: the same update as fully sharded training
        for name, value in full["params"].items():
            torch.testing.assert_close(hybrid["params"][name], value, atol=1e-6, rtol=1e-5, msg=name)
    for name, value in ranks[0][1]["params"].items():  # and both replicas hold the same weights
        assert torch.equal(ranks[1][1]["params"][name], value), name
