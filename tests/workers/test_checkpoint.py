"""Engine checkpoints: a save/load round trip restores weights, optimizer, schedule and RNG so that the
next training steps are bit-identical to an uninterrupted run; with one process (no process group),
with two gloo ranks under FSDP2, and across world sizes (2 ranks save, 1 process loads)."""

import copy
import os
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from transformers import AutoModelForCausalLM

from hybridflow.model_merger import load_dcp_model_state
from hybridflow.models.tiny import build_tiny_config, build_tiny_model
from hybridflow.single_controller.base.worker import find_free_port
from hybridflow.workers.checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.workers.engine.fsdp import EngineSpec, TrainEngine
from tests.yaml_sections import optim

VOCAB = 100
# warmup makes the lr depend on the scheduler's step count, so a lost scheduler state changes the update
OPTIM = optim(lr=1e-2, lr_warmup_steps=4, weight_decay=0.01)


def _engine(seed: int, trainable: bool = True) -> TrainEngine:
    config = build_tiny_config(
        VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    engine = TrainEngine(build_tiny_model(config, seed=seed), EngineSpec(strategy="fsdp", device="cpu"), trainable)
    if trainable:
        engine.setup_optimizer(OPTIM, total_steps=10)
    return engine


def _batch(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randint(4, VOCAB, (2, 12), generator=g)


def _train_step(engine: TrainEngine, rank: int, step: int) -> tuple[float, float]:
    """(loss, a torch RNG draw): the draw stands for the sampling/dropout a resumed run must replay."""
    ids = _batch(rank, step)
    noise = torch.rand(()).item()
    loss = engine.module(input_ids=ids, labels=ids).loss
    loss.backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=True)
    engine.lr_scheduler.step()
    return loss.item(), noise


def _full_params(engine: TrainEngine) -> dict:
    return {k: v.detach().clone() for k, v in engine.full_state_dict().items()}


def _full_optim(engine: TrainEngine) -> dict:
    # a copy: the returned tensors are the optimizer's live state
    return copy.deepcopy(
        get_optimizer_state_dict(engine.module, engine.optimizer, options=StateDictOptions(full_state_dict=True))
    )


def _assert_same_optim(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys() and len(a["state"]) > 0
    for name, sa in a["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[key], b["state"][name][key]), (name, key)
    assert [g["lr"] for g in a["param_groups"]] == [g["lr"] for g in b["param_groups"]]


def _assert_same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_single_process_round_trip_resumes_bit_identically(tmp_path):
    engine = _engine(seed=0)
    _train_step(engine, 0, 0)
    random.seed(5)
    np.random.seed(5)
    save_engine_checkpoint(engine, str(tmp_path), extra_state={"global_step": 1})
    saved_params, saved_optim = _full_params(engine), _full_optim(engine)
    expected = [_train_step(engine, 0, s) for s in (1, 2)]
    expected_draws = (random.random(), np.random.rand())

    assert sorted(os.listdir(tmp_path)) == ["dcp", "extra_state_world_size_1_rank_0.pt", "huggingface"]
    fresh = _engine(seed=1)  # different init: everything must come from the checkpoint
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    assert load_engine_checkpoint(fresh, str(tmp_path)) == {"global_step": 1}
    _assert_same_params(saved_params, _full_params(fresh))
    _assert_same_optim(saved_optim, _full_optim(fresh))
    assert fresh.lr_scheduler.last_epoch == 1
    # same losses (weights, Adam moments, lr schedule) and same torch draws (RNG) as without the stop
    assert [_train_step(fresh, 0, s) for s in (1, 2)] == expected
    assert (random.random(), np.random.rand()) == expected_draws


def test_model_only_contents_and_bad_contents(tmp_path):
    ref = _engine(seed=0, trainable=False)  # a reference model: no optimizer, no scheduler
    save_engine_checkpoint(ref, str(tmp_path), save_contents=("model",))
    assert sorted(os.listdir(tmp_path)) == ["dcp", "huggingface"]
    target = _engine(seed=1)
    assert load_engine_checkpoint(target, str(tmp_path), load_contents=("model",)) is None
    _assert_same_params(_full_params(ref), _full_params(target))
    assert len(target.optimizer.state) == 0  # optimizer untouched
    with pytest.raises(ValueError, match="unknown checkpoint save_contents"):
        save_engine_checkpoint(ref, str(tmp_path), save_contents=("model", "weights"))
    with pytest.raises(ValueError, match="without optimizer state"):
        load_engine_checkpoint(target, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="extra_state"):
        load_engine_checkpoint(target, str(tmp_path), load_contents=("model", "extra"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_engine_checkpoint(target, str(tmp_path / "nope"))


# --- two FSDP2 ranks ------------------------------------------------------------------------------
def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ckpt = os.path.join(out_dir, "ckpt")
        engine = _engine(seed=0)
        assert type(engine.module).__name__.startswith("FSDP")  # really sharded
        _train_step(engine, rank, 0)
        torch.manual_seed(1000 + rank)  # per-rank RNG streams must come back per rank
        save_engine_checkpoint(engine, ckpt, extra_state={"rank": rank})
        before = {"params": _full_params(engine), "optim": _full_optim(engine)}
        before["losses"] = [_train_step(engine, rank, s) for s in (1, 2)]

        fresh = _engine(seed=1)
        torch.manual_seed(0)
        extra = load_engine_checkpoint(fresh, ckpt)
        after = {"params": _full_params(fresh), "optim": _full_optim(fresh), "extra": extra}
        after["losses"] = [_train_step(fresh, rank, s) for s in (1, 2)]
        torch.save({"before": before, "after": after}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_fsdp2_ranks_round_trip_and_reshard_to_one_process(tmp_path):
    mp.spawn(_rank_main, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for rank, result in enumerate(ranks):
        before, after = result["before"], result["after"]
        assert after["extra"] == {"rank": rank}
        _assert_same_params(before["params"], after["params"])
        _assert_same_optim(before["optim"], after["optim"])
        assert before["losses"] == after["losses"]  # includes each rank's replayed RNG draw
    assert ranks[0]["before"]["losses"] != ranks[1]["before"]["losses"]  # ranks saw different data
    ckpt = str(tmp_path / "ckpt")
    assert sorted(f for f in os.listdir(ckpt) if f.startswith("extra")) == [
        "extra_state_world_size_2_rank_0.pt",
        "extra_state_world_size_2_rank_1.pt",
    ]
    assert len([f for f in os.listdir(os.path.join(ckpt, "dcp")) if f.endswith(".distcp")]) == 2  # one per rank

    # the 2-rank sharded checkpoint loads into one unsharded process (DCP reshards on load)
    single = _engine(seed=1)
    assert load_engine_checkpoint(single, ckpt) == {"rank": 0}  # falls back to rank 0's extra state
    _assert_same_params(ranks[0]["before"]["params"], _full_params(single))
    _assert_same_optim(ranks[0]["before"]["optim"], _full_optim(single))
    assert single.lr_scheduler.last_epoch == 1
    # and the model merger reads the same sharded checkpoint without any process group
    _assert_same_params(ranks[0]["before"]["params"], load_dcp_model_state(ckpt))


def test_hf_model_content_writes_a_loadable_model(tmp_path):
    engine = _engine(seed=0)
    _train_step(engine, 0, 0)
    save_engine_checkpoint(engine, str(tmp_path), save_contents=("hf_model",))
    assert os.listdir(tmp_path) == ["huggingface"]  # no DCP shards, no extra state
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "huggingface"))
    ids = _batch(0, 1)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, engine.module(input_ids=ids).logits)
