"""Weights leaving the trainer for the rollout engine: streamed one tensor at a time (FSDP2 shards
gathered per tensor on every rank), tied tensors once, LoRA folded in on the fly, loaded in buckets."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.models.tiny import build_tiny_config, build_tiny_model  # noqa: E402
from hybridflow.single_controller.base.worker import find_free_port  # noqa: E402
from hybridflow.workers.engine import EngineSpec, TrainEngine  # noqa: E402
from hybridflow.workers.engine.lora import LoraSpec, merge_lora_stream, merge_lora_weights  # noqa: E402
from hybridflow.workers.rollout.weights import StrictWeightLoader, buckets  # noqa: E402


def tiny_causal_lm(seed: int = 0):
    """A tied-embedding tiny Qwen2 (vocab 16, hidden 32, 2 layers)."""
    config = build_tiny_config(16, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    return build_tiny_model(config, seed=seed)


def _tied(model) -> bool:
    return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_single_process_stream_equals_the_state_dict_with_tied_weights_once():
    model = tiny_causal_lm()
    assert _tied(model)
    engine = TrainEngine(model, EngineSpec(strategy="none", device="cpu"))
    streamed = dict(engine.iter_full_params())
    sd = model.state_dict()
    assert set(sd) - set(streamed) == {"lm_head.weight"}  # the tied alias is not sent twice
    for name, tensor in streamed.items():
        assert torch.equal(tensor, sd[name]), name


def test_lora_stream_equals_the_full_merge():
    pytest.importorskip("peft")
    base = tiny_causal_lm()
    engine = TrainEngine(
        base, EngineSpec(strategy="none", device="cpu", lora=LoraSpec(rank=4, alpha=8, target_modules="all-linear"))
    )
    with torch.no_grad():  # non-zero adapters, so the merge matters
        for name, p in engine.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    full = engine.full_state_dict()
    streamed = dict(engine.iter_full_params())
    assert set(streamed) == set(full) - {"lm_head.weight"}  # tied head sent once, as the embedding
    for name, tensor in streamed.items():
        torch.testing.assert_close(tensor, full[name], msg=name)
    # and the generator itself agrees with the dict version on a shuffled order (base after adapters)
    sd = {k: v.detach() for k, v in engine.module.state_dict().items()}
    shuffled = sorted(sd.items(), key=lambda kv: ("base_layer" in kv[0], kv[0]))
    merged = dict(merge_lora_stream(shuffled, scaling=2.0))
    ref = merge_lora_weights(sd, scaling=2.0)
    assert set(merged) == set(ref)
    for k in ref:
        torch.testing.assert_close(merged[k], ref[k], msg=k)


def test_adapter_stream_is_peft_saved_adapter_plus_base_weights_once():
    """``model.lora.merge=false``: base weights under Hugging Face names (first sync), the adapter under the
    names peft saves it with, unmerged; without the base, only the adapter is gathered."""
    pytest.importorskip("peft")
    from peft import get_peft_model_state_dict

    base = tiny_causal_lm()
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    engine = TrainEngine(base, EngineSpec(strategy="none", device="cpu", lora=LoraSpec(rank=4, alpha=8)))
    with torch.no_grad():
        for name, p in engine.module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    saved = get_peft_model_state_dict(engine.module)
    adapter_only = dict(engine.iter_adapter_params(with_base=False))
    assert set(adapter_only) == set(saved) and saved
    for name, tensor in saved.items():
        assert torch.equal(adapter_only[name], tensor), name
    with_base = dict(engine.iter_adapter_params(with_base=True))
    base_part = {k: v for k, v in with_base.items() if k not in saved}
    assert set(base_part) == set(base_sd) - {"lm_head.weight"}  # tied head once
    for name, tensor in base_part.items():
        assert torch.equal(tensor, base_sd[name]), name  # the frozen base, adapters not folded in
    no_lora = TrainEngine(tiny_causal_lm(), EngineSpec(strategy="none", device="cpu"))
    with pytest.raises(ValueError, match="lora_rank"):
        list(no_lora.iter_adapter_params(with_base=True))


def test_incomplete_lora_layer_is_an_error():
    with pytest.raises(ValueError, match="incomplete LoRA"):
        list(merge_lora_stream([("q.lora_A.default.weight", torch.zeros(1, 2))], 1.0))


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        engine = TrainEngine(tiny_causal_lm(seed=0), EngineSpec(strategy="fsdp2", device="cpu"))
        assert engine.sharded
        target = tiny_causal_lm(seed=1)  # a rollout copy holding other weights
        loader = StrictWeightLoader(target)
        n_buckets = 0
        for bucket in buckets(engine.iter_full_params(), bucket_bytes=64 << 10):
            loader.load(bucket)
            n_buckets += 1
        count = loader.finish()
        torch.save(
            {"sd": target.state_dict(), "buckets": n_buckets, "count": count}, os.path.join(out_dir, f"rank{rank}.pt")
        )
    finally:
        dist.destroy_process_group()


def test_fsdp2_ranks_stream_the_full_weights_into_their_engines(tmp_path):
    mp.spawn(_rank_main, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=True)
    expected = tiny_causal_lm(seed=0).state_dict()
    for rank in range(2):
        got = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"))
        assert got["buckets"] > 1  # 64 KiB buckets: the ~2.4 MB model arrives in pieces
        assert got["count"] == len(expected) - 1  # every tensor once, the tied head through the embedding
        for name, tensor in expected.items():
            assert torch.equal(got["sd"][name], tensor), (rank, name)


def test_parameters_placed_in_given_memory_stay_there_through_training():
    """``place_params`` (the actor's parameters in a rollout engine's shared file): same values, tied ones
    still tied, and an optimizer step updates them where they were placed."""
    engine = TrainEngine(tiny_causal_lm(), EngineSpec(strategy="none", device="cpu"))
    before = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    store = torch.zeros(sum(t.numel() for t in before.values()))

    def place(named):
        views, offset = {}, 0
        for name, tensor in named:
            views[name] = store[offset : offset + tensor.numel()].view_as(tensor).copy_(tensor)
            offset += tensor.numel()
        return views

    def in_store(tensor):
        return 0 <= tensor.data_ptr() - store.data_ptr() < store.nbytes

    assert engine.place_params(place)
    params = dict(engine.module.named_parameters())
    assert all(in_store(p) and torch.equal(p, before[name]) for name, p in params.items())
    assert _tied(engine.module)
    optimizer = torch.optim.AdamW(engine.module.parameters(), lr=1e-2)
    engine.module(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    assert all(in_store(p) for p in params.values())
    assert not torch.equal(store, torch.cat([t.reshape(-1) for t in before.values()]))  # trained in the store
    pytest.importorskip("peft")
    lora = TrainEngine(tiny_causal_lm(), EngineSpec(strategy="none", device="cpu", lora=LoraSpec(rank=4, alpha=8)))
    assert not lora.place_params(lambda named: pytest.fail("a LoRA model's parameters are not placed"))
