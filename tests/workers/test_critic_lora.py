"""A LoRA critic (critic.model.lora_rank): adapters on the value model's body, the value head (a layer of its own
that starts random) trained in full; every other weight stays the base model's. veRL's engine freezes the head
too (peft's causal-LM task), which leaves the values a fixed random projection: here it learns."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import build_trainer, checked_config
from hybridflow.utils.environ import restored_environ
from hybridflow.workers.engine.lora import merge_lora_weights
from tests.trainer.e2e_helpers import base_overrides

pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_a_lora_critic_trains_its_adapters_and_value_head_only(tiny_model_dir, tiny_data_dir, tmp_path):
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, estimator="gae", steps=2, backend="inprocess")
    lora = ["critic.model.lora_rank=4", "critic.model.lora_alpha=8", "critic.optim.lr=1e-2"]
    config = checked_config(load_config("ppo_trainer", [*overrides, *lora]))
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
        trainer.init_workers()
        try:
            engine = trainer.critic_wg.workers[0]._roles["critic"].engine
            trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
            assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable), sorted(trainable)
            assert any("score.modules_to_save" in n for n in trainable)  # the value head trains
            before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
            metrics = trainer.fit()
            after = dict(engine.module.named_parameters())
            moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
            assert moved and moved <= trainable  # the frozen body did not move
            assert any("score.modules_to_save" in n for n in moved) and any(".lora_B." in n for n in moved)
            for key in ("critic/vf_loss", "critic/grad_norm", "critic/values/mean"):
                assert math.isfinite(metrics[key]), key
            # the full weights under Hugging Face names: the trained head, the adapters folded in
            full = engine.full_state_dict()
            head = after[next(n for n in after if "score.modules_to_save" in n)]
            assert torch.equal(full["score.weight"], head.detach()) and not any("original_module" in k for k in full)
            assert full.keys() == merge_lora_weights(dict(engine.module.state_dict()), 2.0).keys()
            engine.module.save_pretrained(str(tmp_path / "critic_adapter"))  # peft's files: adapters and the head
            trained = {n: p.detach().clone() for n, p in engine.module.named_parameters() if n in trainable}
        finally:
            trainer.shutdown_workers()

    # critic.model.lora_adapter_path: a new run's critic starts from the saved adapter and head
    again = [*overrides, f"critic.model.lora_adapter_path={tmp_path / 'critic_adapter'}", "critic.optim.lr=1e-2"]
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(checked_config(load_config("ppo_trainer", again)))
        trainer.init_workers()
        try:
            loaded = dict(trainer.critic_wg.workers[0]._roles["critic"].engine.module.named_parameters())
            for name, value in trained.items():
                assert loaded[name].requires_grad and torch.equal(loaded[name].detach(), value), name
        finally:
            trainer.shutdown_workers()


@pytest.mark.parametrize(
    "exclude,kept_off",
    [
        (None, {"score"}),
        (["down_proj"], {"score", "model.layers.0.mlp.down_proj"}),
        (r".*\.down_proj", {"score", "model.layers.0.mlp.down_proj"}),  # peft reads a string as a regex
    ],
)
def test_the_value_head_is_never_adapted(exclude, kept_off):
    """all-linear would put LoRA on the head too, which peft cannot also train in full."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    from hybridflow.workers.engine.lora import LoraSpec, apply_lora

    sizes = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = AutoConfig.for_model("qwen2", num_key_value_heads=1, num_labels=1, **sizes)
    model = apply_lora(
        AutoModelForTokenClassification.from_config(config),
        LoraSpec(rank=2, exclude_modules=exclude, task_type="TOKEN_CLS"),
    )
    adapted = {
        n.split(".lora_A.")[0].removeprefix("base_model.model.") for n, _ in model.named_parameters() if ".lora_A." in n
    }
    assert adapted and not adapted & kept_off and "model.layers.0.mlp.up_proj" in adapted
