"""Memory levers: gradient checkpointing (on, recomputes, same gradients), offload and mixed precision
(parsed into the engine spec; CUDA-only parts explained on CPU; run on a GPU when there is one)."""

import copy

import pytest
import torch

from hybridflow.workers.engine import EngineSpec, TrainEngine, engine_spec
from hybridflow.workers.engine.fsdp import is_activation_checkpointing
from tests.workers.actor.ppo_batch import padded_rows, tiny_causal_lm
from tests.yaml_sections import fsdp_engine, optim

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _loss(model, rows):
    out = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], position_ids=rows["position_ids"])
    return (out.logits.log_softmax(-1)[..., 1] * rows["attention_mask"]).sum()


def test_gradient_checkpointing_is_on_recomputes_and_gives_the_same_gradients():
    base = tiny_causal_lm()
    rows = padded_rows(4, seed=1)
    grads, layer_calls = {}, {}
    for ckpt in (False, True):
        engine = TrainEngine(
            copy.deepcopy(base), EngineSpec(strategy="none", device="cpu", gradient_checkpointing=ckpt)
        )
        model = engine.module.train()
        assert is_activation_checkpointing(model) is ckpt
        calls = []
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *a, calls=calls: calls.append(1))
        _loss(model, rows).backward()
        grads[ckpt] = {n: p.grad for n, p in model.named_parameters()}
        layer_calls[ckpt] = len(calls)
    # with checkpointing the layer's forward (and its MLP's) runs again inside backward
    assert layer_calls == {False: 1, True: 2}
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_frozen_engine_does_not_checkpoint():
    engine = TrainEngine(
        tiny_causal_lm(), EngineSpec(strategy="none", device="cpu", gradient_checkpointing=True), trainable=False
    )
    assert not is_activation_checkpointing(engine.module)
    assert not any(p.requires_grad for p in engine.module.parameters())


def test_offload_and_mixed_precision_are_cuda_only_in_the_spec():
    config = fsdp_engine(
        param_offload=True, optimizer_offload=True, mixed_precision={"param_dtype": "bf16", "reduce_dtype": "fp32"}
    )
    cpu = engine_spec(config, "fsdp", "cpu")
    assert (cpu.param_offload, cpu.param_dtype, cpu.reduce_dtype, cpu.needs_fsdp) == (False, None, None, False)
    assert cpu.autocast_dtype == torch.bfloat16 and engine_spec(config, "fsdp", "cuda").autocast_dtype is None
    assert engine_spec(fsdp_engine(), "fsdp", "cpu").autocast_dtype is None  # auto: fp32 on cpu
    cuda = engine_spec(config, "fsdp", "cuda")
    assert cuda.param_offload and cuda.param_dtype == torch.bfloat16 and cuda.reduce_dtype == torch.float32
    assert cuda.needs_fsdp  # offload: one GPU still gets FSDP2 (one-rank mesh); mixed precision alone does not
    only_optim = engine_spec(fsdp_engine(optimizer_offload=True), "fsdp", "cuda")
    assert only_optim.param_offload  # FSDP2's CPUOffloadPolicy moves params, grads and optimizer state together
    assert not engine_spec(fsdp_engine(), "fsdp", "cpu", activation_offload=True).activation_offload  # host already
    assert engine_spec(fsdp_engine(), "fsdp", "cuda", activation_offload=True).activation_offload
    plain = engine_spec(fsdp_engine(mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32"}), "fsdp", "cuda")
    assert plain.param_dtype == torch.float32
    unmixed = engine_spec(fsdp_engine(mixed_precision=None), "fsdp", "cuda")  # the section is Optional
    assert (unmixed.param_dtype, unmixed.reduce_dtype, unmixed.needs_fsdp) == (None, None, False)


def test_bf16_on_cpu_autocasts_the_forward_and_keeps_fp32_weights_and_grads():
    model = tiny_causal_lm()
    reference = copy.deepcopy(model)
    engine = TrainEngine(model, EngineSpec(strategy="none", device="cpu", autocast_dtype=torch.bfloat16))
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    logits = engine.module(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16  # the lm_head's matmul ran in bf16
    logits.float().logsumexp(-1).sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in engine.module.parameters())
    assert set(engine.module.state_dict()) == set(reference.state_dict())
    exact = reference(input_ids=ids).logits
    assert exact.dtype == torch.float32 and not torch.equal(exact, logits.float())
    torch.testing.assert_close(logits.float(), exact, atol=0.1, rtol=0.05)  # bf16's ~3 significant digits


def test_offload_on_cpu_is_accepted_and_explained():
    from hybridflow.config.loader import load_config
    from hybridflow.trainer.config_checks import validate_ppo_config

    cfg = load_config(
        "ppo_trainer",
        [
            "trainer.device=cpu",
            "actor_rollout_ref.model.path=/nonexistent",
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2",
        ],
    )
    notes = validate_ppo_config(cfg, n_devices=0)
    offload_notes = [n for n in notes if "offload" in n and "no effect on cpu" in n]
    assert any("param_offload" in n for n in offload_notes) and any("optimizer_offload" in n for n in offload_notes)


@pytest.mark.gpu
def test_fsdp2_one_rank_mixed_precision_and_offload_on_cuda(tmp_path):
    import torch.distributed as dist

    created = not dist.is_initialized()  # the leak check (tests/conftest.py) makes this the normal case
    if created:
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        spec = engine_spec(
            fsdp_engine(param_offload=True, mixed_precision={"param_dtype": "bf16", "reduce_dtype": "fp32"}),
            "fsdp",
            "cuda",
            gradient_checkpointing=True,
            activation_offload=True,
        )
        engine = TrainEngine(tiny_causal_lm(), spec)
        assert engine.sharded
        engine.setup_optimizer(optim(lr=1e-3), total_steps=1)
        p = next(engine.module.parameters())
        assert p.device.type == "cpu" and p.dtype == torch.float32  # fp32 master weights kept on the host
        rows = {k: v.cuda() for k, v in padded_rows(4).items()}
        loss = _loss(engine.module, rows)
        loss.backward()
        engine.optimizer.step()
        assert torch.isfinite(loss)
        assert set(engine.full_state_dict()) == set(tiny_causal_lm().state_dict())
    finally:
        if created:  # only the group this test opened
            dist.destroy_process_group()


def test_override_config_picks_the_attention_kernel_as_verl_does(tiny_model_dir):
    from hybridflow.workers.model_loading import load_model

    default = load_model(tiny_model_dir, "causal_lm")
    eager = load_model(tiny_model_dir, "causal_lm", override_config={"attn_implementation": "eager", "probe_key": 7})
    assert default.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    assert eager.config.probe_key == 7  # the other entries still go onto the config
    ids = torch.tensor([[3, 5, 7, 9]])
    with torch.no_grad():
        torch.testing.assert_close(
            eager(input_ids=ids).logits, load_model(tiny_model_dir, "causal_lm")(input_ids=ids).logits
        )
