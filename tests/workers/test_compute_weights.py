"""Mixed precision on one rank without FSDP2 (``hybridflow/workers/engine/precision.py``): the same numbers as
FSDP2's ``MixedPrecisionPolicy`` on a one-rank mesh (bf16 compute over float32 master weights, float32
gradient accumulation), and the plain float32 model outside the block."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

from hybridflow.workers.actor.dp_actor import DataParallelPPOActor
from hybridflow.workers.engine import EngineSpec, TrainEngine
from hybridflow.workers.engine.fsdp import fully_shard_layers
from hybridflow.workers.engine.optim import build_optimizer
from hybridflow.workers.engine.precision import ComputeWeights
from tests.workers.actor.ppo_batch import actor_config, padded_rows, ppo_batch, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _fsdp2_bf16(model):
    """The GPU actor's arrangement before ComputeWeights: FSDP2 units per layer and at the root, bf16
    compute, float32 gradient reduction, on a one-rank mesh."""
    return fully_shard_layers(
        model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    )


def _loss(model, rows):
    out = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], position_ids=rows["position_ids"])
    return (out.logits.float().log_softmax(-1)[..., 1] * rows["attention_mask"]).sum()


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def test_three_micro_batches_give_fsdp2s_bf16_gradients_and_step(one_rank_group):
    base = tiny_causal_lm(seed=3)
    sharded = _fsdp2_bf16(copy.deepcopy(base))
    plain = copy.deepcopy(base)
    weights = ComputeWeights(plain, torch.bfloat16)
    micro = [padded_rows(4, seed=s) for s in (1, 2, 3)]

    for p in sharded.parameters():
        assert p.grad is None
    for rows in micro:
        _loss(sharded, rows).backward()
    with weights.active():
        for rows in micro:
            _loss(plain, rows).backward()
            assert all(p.grad is None for p in plain.parameters())  # summed in float32 off the parameter
    names = [n for n, _ in plain.named_parameters()]
    for name, want, got in zip(names, sharded.parameters(), plain.parameters()):
        assert got.dtype == torch.float32 and got.grad.dtype == torch.float32, name
        assert torch.equal(got.grad, _full(want.grad)), name

    optimizers = [build_optimizer(m.parameters(), lr=1e-2) for m in (sharded, plain)]
    for opt in optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    for name, want, got in zip(names, sharded.parameters(), plain.parameters()):
        assert torch.equal(got.detach(), _full(want)), name
    # the next block casts the stepped masters: the forward again agrees with FSDP2's
    with torch.no_grad(), weights.active():
        got = plain(input_ids=micro[0]["input_ids"]).logits
    want = sharded(input_ids=micro[0]["input_ids"]).logits
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_block_casts_once_and_gives_back_the_float32_model():
    model = tiny_causal_lm()
    params = list(model.parameters())
    masters = [p.data_ptr() for p in params]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    weights = ComputeWeights(model, torch.bfloat16)
    inv_freq = model.model.rotary_emb.inv_freq
    rows = padded_rows(2, seed=0)
    _loss(model, rows).backward()  # a float32 gradient from before the block
    before = [p.grad.clone() for p in params]
    with weights.active():
        inside = [p.data_ptr() for p in params]
        assert all(p.dtype == torch.bfloat16 for p in params) and inv_freq.dtype == torch.float32  # buffers stay
        with weights.active():  # nested: the same copies, no second cast
            assert [p.data_ptr() for p in params] == inside
        assert [p.data_ptr() for p in params] == inside
        _loss(model, rows).backward()
    assert list(model.parameters()) == params and [p.data_ptr() for p in params] == masters
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    for p, g in zip(params, before):  # the block's bf16 gradient (~ g) added to g in float32
        assert p.grad.dtype == torch.float32
        assert float((p.grad - 2 * g).norm()) < 0.05 * float(g.norm())


def test_a_block_that_raises_still_gives_back_the_masters():
    model = tiny_causal_lm()
    weights = ComputeWeights(model, torch.bfloat16)
    with pytest.raises(ValueError), weights.active():
        _loss(model, padded_rows(2)).backward()
        raise ValueError("a failed micro-batch")
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    with weights.active():  # usable again
        assert next(model.parameters()).dtype == torch.bfloat16


def test_no_dtype_is_no_cast():
    model = tiny_causal_lm()
    weights = ComputeWeights(model, None)
    with weights.active():
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not weights.casts


def test_one_rank_engines_with_a_compute_dtype(one_rank_group):
    spec = EngineSpec(strategy="fsdp", device="cpu", param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    trained = TrainEngine(tiny_causal_lm(), spec)
    assert not trained.sharded and trained.module is trained.unwrapped  # no one-rank mesh for mixed precision
    assert trained.precision.casts and next(trained.module.parameters()).dtype == torch.float32
    frozen = TrainEngine(tiny_causal_lm(), spec, trainable=False)  # a reference policy: stored in bf16
    assert not frozen.precision.casts
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in frozen.module.parameters())
    assert frozen.module.model.rotary_emb.inv_freq.dtype == torch.float32
    offloaded = EngineSpec(strategy="fsdp", device="cpu", param_dtype=torch.bfloat16, param_offload=True)
    assert offloaded.needs_fsdp and not spec.needs_fsdp


def test_the_actors_update_and_log_probs_on_compute_weights_match_fsdp2(one_rank_group):
    """Through DataParallelPPOActor: two micro-batches per mini-batch, two mini-batches (two steps)."""
    base = tiny_causal_lm(seed=5)
    data = ppo_batch(base, batch_size=8, seed=2)
    config = actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
    data.meta_info.update(micro_batch_size=4)
    results = {}
    for arrangement in ("fsdp2", "compute_weights"):
        model = copy.deepcopy(base)
        precision = None
        if arrangement == "fsdp2":
            model = _fsdp2_bf16(model)
        else:
            precision = ComputeWeights(model, torch.bfloat16)
        actor = DataParallelPPOActor(config, model, build_optimizer(model.parameters(), lr=1e-2), precision=precision)
        metrics = actor.update_policy(data)
        # read before the no-grad forward: FSDP2's root stays unsharded after it, its parameters then bf16
        params = torch.cat([_full(p).reshape(-1) for p in model.parameters()])
        log_probs, _ = actor.compute_log_prob(data)
        results[arrangement] = (params, log_probs, metrics)
    (want, want_lp, want_m), (got, got_lp, got_m) = results["fsdp2"], results["compute_weights"]
    assert got.dtype == torch.float32 and not torch.equal(got, torch.cat([p.reshape(-1) for p in base.parameters()]))
    assert torch.equal(got, want)  # the same operations in the same order
    torch.testing.assert_close(got_lp, want_lp, rtol=0, atol=0)
    assert got_m["actor/pg_loss"] == want_m["actor/pg_loss"] and len(got_m["actor/pg_loss"]) == 2


@pytest.mark.gpu
def test_compute_weights_on_cuda_train_like_fsdp2(tmp_path):
    """On a GPU (NCCL, one rank): the actor's update on ComputeWeights agrees with FSDP2's mixed precision to
    rounding (CUDA's embedding backward sums with atomics, so not bit for bit); parameters stay float32. SGD,
    so that each parameter's move is its gradient (Adam's first step would amplify rounding near zero)."""
    _train_like_fsdp2("cuda", "nccl", tmp_path)


def _train_like_fsdp2(device: str, backend: str, tmp_path) -> None:
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(backend, init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        base = tiny_causal_lm(seed=5)
        batch = ppo_batch(base, batch_size=8, seed=2).to(device)
        config = actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2)
        moved = {}
        for arrangement in ("fsdp2", "compute_weights"):
            model = copy.deepcopy(base).to(device)
            before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            precision = None
            if arrangement == "fsdp2":
                model = _fsdp2_bf16(model)
            else:
                precision = ComputeWeights(model, torch.bfloat16)
            optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
            DataParallelPPOActor(config, model, optimizer, precision=precision).update_policy(batch)
            after = torch.cat([_full(p).reshape(-1) for p in model.parameters()])
            assert after.dtype == torch.float32
            moved[arrangement] = after - before
        assert float(moved["fsdp2"].norm()) > 0
        assert float((moved["compute_weights"] - moved["fsdp2"]).norm() / moved["fsdp2"].norm()) < 1e-2
    finally:
        if created:
            dist.destroy_process_group()
