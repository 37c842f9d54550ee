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


GRADIENTS = """
import os, sys, torch, torch.distributed as dist
from transformers import AutoConfig, AutoModelForTokenClassification
from hybridflow.workers.engine.fsdp import EngineSpec, TrainEngine
from hybridflow.workers.engine.lora import LoraSpec

out, world, rank = sys.argv[1], int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
sizes = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
config = AutoConfig.for_model("qwen2", num_key_value_heads=2, num_labels=1, classifier_dropout=0.0, **sizes)
model = AutoModelForTokenClassification.from_config(config)  # the same seed: the same weights on every rank
engine = TrainEngine(model, EngineSpec(strategy="fsdp", device="cpu", lora=LoraSpec(rank=4, task_type="TOKEN_CLS")))
for name, p in engine.module.named_parameters():  # B = 0 would leave A without a gradient
    if "lora_B" in name:
        with torch.no_grad():
            p.add_(0.05)
ids = torch.randint(0, 64, (4, 10), generator=torch.Generator().manual_seed(2))
mine = ids[rank * 4 // world : (rank + 1) * 4 // world]
values = engine.module(input_ids=mine, attention_mask=torch.ones_like(mine)).logits[..., 0]
(values.pow(2).sum() / 40.0 * world).backward()  # the global mean; FSDP2 averages over the ranks
grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad) for n, p in
         engine.module.named_parameters() if p.grad is not None}
if rank == 0:
    torch.save({n: g.detach().clone() for n, g in grads.items()}, out)
if world > 1:
    dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_lora_critic_has_the_same_gradients_sharded_on_two_processes(tmp_path):
    """FSDP2 over peft's token-classification model (its value head a modules_to_save copy): the gradients of the
    adapters and the head on 2 gloo ranks equal one process's on the whole batch."""
    import os
    import subprocess
    import sys

    from tests.trainer.test_sft_trainer import REPO_ROOT

    script = tmp_path / "gradients.py"
    script.write_text(GRADIENTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])}
    env.update(OMP_NUM_THREADS="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    runs = [[sys.executable, str(script), str(tmp_path / "one.pt")], [*torchrun, str(script), str(tmp_path / "two.pt")]]
    for command in runs:
        proc = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one.keys() == two.keys() and any("score.modules_to_save" in k for k in one)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-7, msg=name)
