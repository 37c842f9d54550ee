"""LoRA (peft): only adapters train, the reference policy is the base model with adapters off (no second
copy), the rollout receives merged weights, and the merger writes a merged Hugging Face model."""

import copy
import functools
import os

import pytest
import torch

from hybridflow.config.convert import omega_conf_to_dataclass
from hybridflow.config.model import HFModelConfig
from hybridflow.workers.engine import EngineSpec, TrainEngine
from hybridflow.workers.engine.lora import LoraSpec, adapters_disabled, lora_scaling, lora_spec, merge_lora_weights
from tests.workers.actor.ppo_batch import padded_rows, tiny_causal_lm
from tests.yaml_sections import optim, section

pytest.importorskip("peft")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _lora_engine(base, rank=4, alpha=8.0, target="all-linear"):
    engine = TrainEngine(
        copy.deepcopy(base),
        EngineSpec(strategy="none", device="cpu", lora=LoraSpec(rank=rank, alpha=alpha, target_modules=target)),
    )
    for name, p in engine.module.named_parameters():
        if "lora_B" in name:  # peft starts B at 0; give the adapters a visible effect
            torch.nn.init.normal_(p, std=0.1)
    return engine


def _model(**changes) -> HFModelConfig:
    """actor_rollout_ref.model (the yaml's defaults) with ``changes``, typed."""
    return omega_conf_to_dataclass(
        section("actor_rollout_ref.model", **changes), HFModelConfig, path="actor_rollout_ref.model"
    )


def test_spec_of_the_typed_model_section():
    assert lora_spec(_model(lora_rank=0)) is None
    spec = lora_spec(_model(lora_rank=8, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
    assert (spec.rank, spec.alpha, spec.target_modules) == (8, 32.0, ["q_proj", "v_proj"])
    assert lora_scaling(32, 8) == 4.0 and lora_scaling(32, 16, use_rslora=True) == 8.0


def test_the_rollout_gets_an_adapter_unless_merge_or_hf():
    from hybridflow.workers.engine.lora import rollout_gets_adapter

    lora = _model(lora_rank=8, lora={"merge": False})
    assert rollout_gets_adapter(lora, "vllm")
    assert rollout_gets_adapter(_model(lora_rank=8), "vllm")  # veRL's default: merge is false
    assert not rollout_gets_adapter(_model(lora_rank=8, lora={"merge": True}), "vllm")
    assert not rollout_gets_adapter(lora, "hf")  # the hf engine runs a plain module: merged weights
    assert not rollout_gets_adapter(_model(lora_rank=0, lora={"merge": False}), "vllm")


def test_training_continues_from_a_saved_adapter_with_its_own_rank_and_alpha(tmp_path):
    """model.lora_adapter_path: the saved adapter (rank 4, alpha 8) is loaded trainable, whatever lora_rank says,
    and merges/serves with its own scale."""
    base = tiny_causal_lm()
    saved = _lora_engine(base, rank=4, alpha=8.0)
    saved.module.save_pretrained(str(tmp_path / "adapter"))
    spec = lora_spec(_model(lora_rank=0, lora_alpha=16, lora_adapter_path=str(tmp_path / "adapter")))
    assert (spec.rank, spec.alpha) == (4, 8.0)
    engine = TrainEngine(copy.deepcopy(base), EngineSpec(strategy="none", device="cpu", lora=spec))
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    expected = saved.full_state_dict()
    for name, tensor in engine.full_state_dict().items():
        torch.testing.assert_close(tensor, expected[name], msg=name)  # the saved adapter, not fresh B = 0
    assert any(not torch.equal(expected[n], v) for n, v in base.state_dict().items())
    with pytest.raises(FileNotFoundError, match="lora_adapter_path=.*no adapter_config.json"):
        lora_spec(_model(lora_rank=8, lora_adapter_path=str(tmp_path)))


def test_exclude_modules_keeps_adapters_off_those_layers():
    spec = lora_spec(_model(lora_rank=4, lora_alpha=8, exclude_modules=r".*\.(down_proj|o_proj)"))  # peft: a regex
    engine = TrainEngine(tiny_causal_lm(), EngineSpec(strategy="none", device="cpu", lora=spec))
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in engine.module.named_parameters() if ".lora_A." in n}
    assert adapted and "q_proj" in adapted and not adapted & {"down_proj", "o_proj"}


def test_only_adapters_train_and_merged_weights_match_peft():
    base = tiny_causal_lm()
    engine = _lora_engine(base, target=["q_proj", "v_proj"])
    trainable = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert all(any(t in n for t in ("q_proj", "v_proj")) for n in trainable)
    engine.setup_optimizer(optim(lr=1e-3), total_steps=1)
    assert sum(len(g["params"]) for g in engine.optimizer.param_groups) == len(trainable)

    merged = engine.full_state_dict()
    reference = copy.deepcopy(engine.module).merge_and_unload().state_dict()  # peft's own merge
    assert set(merged) == set(reference) == set(base.state_dict())  # plain HF names, nothing extra
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, atol=1e-6, rtol=0, msg=key)
    # the training model is untouched by the merge: base weights still the base model's
    q = engine.module.get_base_model().model.layers[0].self_attn.q_proj
    torch.testing.assert_close(q.base_layer.weight, base.model.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], q.base_layer.weight)


def test_merge_is_pure_and_rejects_embedding_adapters():
    w, a, b = torch.randn(3, 2), torch.randn(1, 2), torch.randn(3, 1)
    sd = {
        "base_model.model.lin.base_layer.weight": w,
        "base_model.model.lin.lora_A.default.weight": a,
        "base_model.model.lin.lora_B.default.weight": b,
    }
    out = merge_lora_weights(sd, scaling=2.0)
    torch.testing.assert_close(out["lin.weight"], w + 2.0 * b @ a)  # W + (alpha / r) * B @ A
    assert sd["base_model.model.lin.base_layer.weight"] is w and list(out) == ["lin.weight"]
    with pytest.raises(ValueError, match="only linear"):
        merge_lora_weights({"x.lora_embedding_A.default": a}, 1.0)


def test_adapters_disabled_is_the_base_model():
    base = tiny_causal_lm().eval()
    engine = _lora_engine(base)
    ids = padded_rows(3)["input_ids"]
    with torch.no_grad():
        with adapters_disabled(engine.module):
            off = engine.module(input_ids=ids).logits
        on = engine.module(input_ids=ids).logits
        expected = base(input_ids=ids).logits
    torch.testing.assert_close(off, expected, atol=1e-6, rtol=0)
    assert (on - expected).abs().max() > 1e-3  # the adapters do act when enabled


def test_lora_grpo_run_trains_adapters_only_ref_is_base(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """In-process GRPO, 2 steps, LoRA rank 4 + padding-free + dynamic batch size."""
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from hybridflow.model_merger import merge_checkpoint
    from hybridflow.trainer.ppo import ray_trainer
    from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from hybridflow.workers.model_loading import load_model
    from hybridflow.workers.utils.logprob import forward_response_log_probs
    from tests.trainer.e2e_helpers import assert_finite, base_overrides, read_metrics

    captured = {"ref": []}
    init_workers = ray_trainer.RayPPOTrainer.init_workers

    def keep_trainer(trainer):
        init_workers(trainer)
        captured["trainer"] = trainer

    ref_log_prob = ActorRolloutRefWorker.compute_ref_log_prob

    @functools.wraps(ref_log_prob)  # keeps the @register dispatch marker
    def keep_ref(worker, data):
        out = ref_log_prob(worker, data)
        captured["ref"].append((data.batch.clone(), out.batch["ref_log_prob"].clone()))
        return out

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "init_workers", keep_trainer)
    monkeypatch.setattr(ActorRolloutRefWorker, "compute_ref_log_prob", keep_ref)
    # keep the in-process engine after the run: the test pushes the final weights into it below
    monkeypatch.setattr(ActorRolloutRefWorker, "shutdown_rollout", lambda worker: None)
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=2, world=1, backend="inprocess"
    )
    overrides += [
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=256",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.optim.lr=1e-2",
    ]
    run_ppo(load_config("ppo_trainer", overrides))
    steps = read_metrics(tmp_path)
    assert len(steps) == 2
    for m in steps:
        assert_finite(m)

    worker = captured["trainer"].actor_rollout_wg.workers[0]
    worker = next(w for w in getattr(worker, "_roles", {"": worker}).values() if isinstance(w, ActorRolloutRefWorker))
    assert not hasattr(worker, "ref_engine")  # no second copy of the weights
    assert worker.actor.use_remove_padding and worker.actor.config.use_dynamic_bsz
    base = load_model(tiny_model_dir, "causal_lm").eval()
    module = worker.actor_engine.module
    # base weights unchanged, adapters moved
    base_sd = base.state_dict()
    merged_now = worker.actor_engine.full_state_dict()
    for name, p in module.named_parameters():
        if ".lora_" in name:
            assert p.requires_grad
        else:
            assert not p.requires_grad
            hf_name = name.replace("base_model.model.", "").replace(".base_layer.", ".")
            assert torch.equal(p.detach(), base_sd[hf_name]), name
    assert any((p.abs().max() > 0) for n, p in module.named_parameters() if "lora_B" in n)  # B started at 0
    assert any(not torch.equal(merged_now[k], base_sd[k]) for k in base_sd)

    # ref log probs (taken after step 1's update too) are the base model's
    assert len(captured["ref"]) == 2
    for batch, ref in captured["ref"]:
        R = batch["responses"].shape[1]
        with torch.no_grad():
            expected, _ = forward_response_log_probs(
                base, batch["input_ids"], batch["attention_mask"], batch["position_ids"], R
            )
        mask = batch["attention_mask"][:, -R:].bool()
        torch.testing.assert_close(ref[mask], expected[mask], atol=1e-5, rtol=0)

    # the rollout engine gets the merged weights
    try:
        worker._rollout_stale = True
        worker.prepare_rollout()
        rollout_sd = worker.rollout_host.server.module.state_dict()
        for key, value in merged_now.items():
            torch.testing.assert_close(rollout_sd[key], value, msg=key)
    finally:
        worker.rollout_host.shutdown()  # kept past the run for this check only

    # checkpoint -> merged Hugging Face model with the policy's (adapters on) outputs
    ckpt = str(tmp_path / "lora_ckpt" / "actor")
    worker.save_checkpoint(ckpt)
    assert os.path.isfile(os.path.join(ckpt, "huggingface", "adapter_config.json"))
    out = merge_checkpoint(ckpt, str(tmp_path / "merged"))
    assert not os.path.exists(os.path.join(out, "adapter_config.json"))
    merged_model = load_model(out, "causal_lm").eval()
    ids = captured["ref"][0][0]["input_ids"][:2]
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged_model(input_ids=ids).logits, module(input_ids=ids).logits, atol=1e-4, rtol=0)


def test_main_ppo_starts_from_the_saved_adapter(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """actor_rollout_ref.model.lora_adapter_path with lora_rank=0: the actor's adapter before the first update
    is the saved one (veRL turns LoRA on for a saved adapter too)."""
    from peft import LoraConfig, get_peft_model

    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from hybridflow.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from hybridflow.workers.model_loading import load_model
    from tests.trainer.e2e_helpers import base_overrides

    peft_model = get_peft_model(
        load_model(tiny_model_dir, "causal_lm"),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    saved = {n: p.detach().clone() for n, p in peft_model.named_parameters() if ".lora_" in n}
    before = {}
    update = ActorRolloutRefWorker.update_actor

    @functools.wraps(update)
    def snapshot_update(worker, data):
        if not before:
            before.update(
                {n: p.detach().clone() for n, p in worker.actor_engine.module.named_parameters() if ".lora_" in n}
            )
        return update(worker, data)

    monkeypatch.setattr(ActorRolloutRefWorker, "update_actor", snapshot_update)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=1, backend="inprocess")
    run_ppo(
        load_config(
            "ppo_trainer",
            [*overrides, "trainer.test_freq=-1", f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}"],
        )
    )
    assert set(before) == set(saved)
    for name, value in saved.items():
        torch.testing.assert_close(before[name], value, msg=name)
