"""The levers of ``gpu_check.py --profile`` (benchmarks/_gpu_profile.py) change what they say and put it back:
on a GPU lease there is one run to learn from, so a lever that silently did nothing, or stayed on for the
next variant, would spoil the table."""

from __future__ import annotations

import dataclasses
import types

import _gpu_profile as levers  # benchmarks/ is on pytest.ini's pythonpath
import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from hybridflow.workers.engine.fsdp import fully_shard_layers


def _sharded_pair() -> torch.nn.Module:
    """Two FSDP2 units under a root one, bf16 compute over fp32 master weights, as the GPU actor runs."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mp_policy=policy)
    return fully_shard(model, mp_policy=policy)


def _sharded_after_forward(model) -> list[bool]:
    model(torch.randn(4, 8))
    return [isinstance(layer.weight, DTensor) for layer in model]


def test_keeping_fsdp2_parameters_unsharded_after_the_forward_and_back(one_rank_group):
    model = _sharded_pair()
    assert _sharded_after_forward(model) == [True, True]  # FSDP2's default: resharded after each forward
    undo = levers.keep_unsharded_after_forward(model)
    assert _sharded_after_forward(model) == [False, False]  # gathered parameters kept for the backward
    undo()
    model(torch.randn(4, 8)).float().sum().backward()  # the kept parameters are released by a backward
    assert _sharded_after_forward(model) == [True, True]


def test_keeping_unsharded_needs_an_fsdp2_model():
    with pytest.raises(RuntimeError, match="not FSDP2-wrapped"):
        levers.keep_unsharded_after_forward(torch.nn.Linear(2, 2))


def _worker(model):
    """What variant_applied reads of an ActorRolloutRefWorker: the actor's config and update loop, the engine."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        use_dynamic_bsz: bool = False

    config = types.SimpleNamespace(ppo_micro_batch_size_per_gpu=8)
    loop = types.SimpleNamespace(config=Config(), max_token_len=4096)
    return types.SimpleNamespace(
        actor=types.SimpleNamespace(config=config, update_loop=loop), actor_engine=types.SimpleNamespace(module=model)
    )


def test_a_token_budget_variant_is_on_inside_and_put_back_after_a_failure(monkeypatch):
    monkeypatch.setattr(levers, "set_checkpointing", lambda module, on: on)
    worker = _worker(torch.nn.Linear(2, 2))
    loop = worker.actor.update_loop
    before = loop.config
    with levers.variant_applied(worker, dict(tokens=24576)):
        assert loop.config.use_dynamic_bsz and loop.max_token_len == 24576
    assert loop.config is before and loop.max_token_len == 4096
    with pytest.raises(RuntimeError):  # a failing lever (no FSDP2 here) leaves nothing switched
        with levers.variant_applied(worker, dict(micro=16, keep_unsharded=True)):
            pass
    assert worker.actor.config.ppo_micro_batch_size_per_gpu == 8 and loop.config is before


def test_the_log_prob_compile_lever_swaps_the_function_both_forward_paths_call_and_back():
    from hybridflow.workers.utils import logprob

    eager = logprob.token_stats
    undo = levers.compile_token_stats()
    try:
        assert logprob.token_stats is not eager
    finally:
        undo()
    assert logprob.token_stats is eager


def test_the_variants_on_a_gpu_and_on_a_cpu():
    w = dict(micro=8)
    on_gpu = levers.lever_variants(w, 1024, compile_levers=True, sharded=True)
    assert [levers.variant_name(v) for v in on_gpu[-4:]] == [
        "token budget 16384 (dynamic batch), checkpointing off, unsharded forward to backward",
        "token budget 16384 (dynamic batch), checkpointing off, compiled token_stats",
        "token budget 16384 (dynamic batch), checkpointing off, compiled layers",
        "token budget 24576 (dynamic batch), checkpointing off, unsharded forward to backward, "
        "compiled token_stats+layers",
    ]
    on_cpu = levers.lever_variants(w, 1024, compile_levers=False, sharded=False)
    assert not any(v.get("compile") or v.get("keep_unsharded") for v in on_cpu)
    assert [v.get("tokens") for v in on_cpu] == [None, None, None, 16384, 24576, 32768]


def test_a_failed_lever_reads_as_one_line_with_the_cause():
    exc = RuntimeError("rank 0 failed:\nTraceback (most recent call last):\n  File x\nValueError: a row has 16 tokens")
    assert levers.short_error(exc) == "RuntimeError: rank 0 failed: ... ValueError: a row has 16 tokens"
    assert levers.short_error(torch.OutOfMemoryError("CUDA out of memory.")) == "out of memory: CUDA out of memory."


@pytest.mark.slow
def test_compiled_layer_parts_inside_fsdp2_units_train_like_eager(one_rank_group, restore_env, monkeypatch):
    """The GPU's arrangement on a CPU (~70 s of compiling): a Qwen2 whose layers are FSDP2 units with bf16
    compute, its layers' parts compiled and its parameters kept unsharded from forward to backward. Compiled,
    the loss and gradients agree with eager's to bf16 rounding; undone, the model is eager again, bit for bit."""
    from hybridflow.models.tiny import build_tiny_config, build_tiny_model

    restore_env("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR")  # inductor sets it while compiling
    import torch._inductor.config as inductor_config

    # compiling in this thread: with a cold cache inductor's pool of compile threads outlives the test
    monkeypatch.setattr(inductor_config, "compile_threads", 1)
    config = build_tiny_config(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    model = build_tiny_model(config, seed=0)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fully_shard_layers(model, mp_policy=policy)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))

    def step():
        loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
        loss.backward()
        grads = [p.grad.full_tensor().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return loss.detach(), grads

    eager_loss, eager_grads = step()
    undo = [levers.compile_layer_parts(model), levers.keep_unsharded_after_forward(model)]
    loss, grads = step()
    torch.testing.assert_close(loss, eager_loss, rtol=2e-2, atol=0)
    for got, want in zip(grads, eager_grads):
        assert float((got - want).norm() / want.norm().clamp(min=1e-9)) < 5e-2
    for u in undo:
        u()
    again, again_grads = step()
    assert torch.equal(again, eager_loss) and all(torch.equal(a, b) for a, b in zip(again_grads, eager_grads))
