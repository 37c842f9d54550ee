"""SFT trainer: the loss (shift, mask, normalisation), the LR schedule, the rank split, micro-batch
invariance against an independent Hugging Face reference, and end-to-end runs (1 process in-process,
2 processes under torchrun) that write loadable Hugging Face directories."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from hybridflow.config.convert import as_section
from hybridflow.config.loader import ConfigError, load_config
from hybridflow.config.sft_trainer import SFTDataConfig, SFTOptimizerConfig, SFTRunConfig, SFTTrainerConfig
from hybridflow.main_sft import run_sft
from hybridflow.trainer.sft_trainer import (
    LATEST_FILE,
    METRICS_FILE,
    FSDPSFTTrainer,
    latest_hf_dir,
    rank_slice,
    sft_lr_multiplier,
    sft_nll_sum,
)
from hybridflow.workers.utils.ulysses import ParallelLayout, layout_of

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sft_overrides(model_dir, data_dir, out_dir, **extra):
    base = {
        "model.partial_pretrain": model_dir,
        "data.train_files": os.path.join(data_dir, "sft_train.parquet"),
        "data.val_files": os.path.join(data_dir, "sft_test.parquet"),
        "data.prompt_key": "question",
        "data.response_key": "answer",
        "data.prompt_dict_keys": "[]",
        "data.response_dict_keys": "[]",
        "data.max_length": 128,
        "data.train_batch_size": 4,
        "data.micro_batch_size_per_gpu": 4,
        "optim.lr": 1e-3,
        "optim.warmup_steps_ratio": 0,
        "optim.lr_scheduler": "constant",
        "trainer.total_training_steps": 2,
        "trainer.default_local_dir": out_dir,
        "trainer.logger": "[console,file]",
        "trainer.device": "cpu",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def torchrun_sft(overrides, nproc: int = 2) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node=N -m hybridflow.main_sft ...`` over gloo,
    one torch thread per process, offline; asserts it succeeded (its output in the message when not)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(
        [*cmd, "-m", "hybridflow.main_sft", *overrides],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **extra):
    cfg = load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, str(tmp_path / "out"), **extra))
    return FSDPSFTTrainer(cfg)


def read_metrics(out_dir):
    with open(os.path.join(out_dir, METRICS_FILE)) as f:
        return [json.loads(line) for line in f]


# --------------------------------------------------------------------------- pure functions


def test_nll_sum_shifts_labels_and_masks_prompt():
    # input_ids [0,1,2,3], targets are tokens 2 and 3 (loss_mask [0,0,1,1]); V = 5.
    # logits[t] predicts input_ids[t+1]: position 1 predicts id 2, position 2 predicts id 3.
    # All logits 0 except logits[1, 2] = 10:
    #   target 2: -log(e^10 / (e^10 + 4)) = log(1 + 4 e^-10);  target 3: -log(1/5) = log 5.
    ids = torch.tensor([[0, 1, 2, 3]])
    mask = torch.tensor([[0, 0, 1, 1]])
    logits = torch.zeros(1, 4, 5)
    logits[0, 1, 2] = 10.0
    expected = math.log(1 + 4 * math.exp(-10)) + math.log(5)
    assert sft_nll_sum(logits, ids, mask).item() == pytest.approx(expected, rel=1e-6)
    # an unshifted implementation (logits[t] scored against input_ids[t]) would give 2 log 5
    assert abs(expected - 2 * math.log(5)) > 1.0


def test_prompt_labels_carry_no_loss_and_no_gradient(tiny_model_dir, tiny_data_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path)
    mb = trainer._micro_batches(next(trainer.train_batches(0)))[0]
    ids, mask = mb["input_ids"], mb["loss_mask"]
    logits = trainer.module(input_ids=ids, attention_mask=mb["attention_mask"]).logits.detach().requires_grad_(True)
    loss = sft_nll_sum(logits, ids, mask)
    loss.backward()
    # labels at prompt (and padding) positions replaced by other tokens: same loss
    perturbed = torch.where(mask.bool(), ids, (ids + 7) % logits.shape[-1])
    assert not torch.equal(perturbed, ids)
    assert sft_nll_sum(logits.detach(), perturbed, mask).item() == pytest.approx(loss.item(), rel=1e-6)
    # ...and no gradient reaches the logits that predict them (nor the last position)
    predicts_prompt = torch.cat([mask[:, 1:] == 0, torch.ones_like(mask[:, :1], dtype=torch.bool)], dim=1)  # (B, T)
    assert logits.grad[predicts_prompt].abs().max().item() == 0.0
    assert logits.grad[~predicts_prompt].abs().sum().item() > 0.0
    # whereas changing one response label changes the loss
    changed = ids.clone()
    b, t = mask.nonzero()[0].tolist()
    changed[b, t] = (changed[b, t] + 1) % logits.shape[-1]
    assert sft_nll_sum(logits.detach(), changed, mask).item() != pytest.approx(loss.item(), rel=1e-6)


def test_lr_multiplier_cosine_wsd_constant():
    # cosine, warmup 2 of 10: (step+1)/2 during warmup, then 0.5 (1 + cos(pi * (step-2)/8))
    assert sft_lr_multiplier(0, 2, 10, "cosine") == pytest.approx(0.5)
    assert sft_lr_multiplier(1, 2, 10, "cosine") == pytest.approx(1.0)
    assert sft_lr_multiplier(2, 2, 10, "cosine") == pytest.approx(1.0)
    assert sft_lr_multiplier(6, 2, 10, "cosine") == pytest.approx(0.5)  # cos(pi/2) = 0
    assert sft_lr_multiplier(10, 2, 10, "cosine") == pytest.approx(0.0)
    # wsd, no warmup, 100 steps: stable until step 90, then cosine over the last 10
    assert sft_lr_multiplier(89, 0, 100, "wsd") == pytest.approx(1.0)
    assert sft_lr_multiplier(95, 0, 100, "wsd") == pytest.approx(0.5)
    assert sft_lr_multiplier(100, 0, 100, "wsd") == pytest.approx(0.0)
    assert sft_lr_multiplier(50, 0, 100, "constant") == 1.0
    with pytest.raises(ValueError, match="lr_scheduler"):
        sft_lr_multiplier(0, 0, 10, "linear")


def test_rank_slices_partition_the_global_batch():
    slices = [rank_slice(8, r, 4) for r in range(4)]
    assert [list(range(8))[s] for s in slices] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="does not split"):
        rank_slice(6, 0, 4)


def test_typed_config_checks_name_the_keys():
    """SFTTrainerConfig.validate: errors all at once by key, notes for what still runs; derived values are
    properties of the sections."""
    cfg = SFTTrainerConfig(
        data=SFTDataConfig(train_batch_size=6, micro_batch_size_per_gpu=None, micro_batch_size=3),
        trainer=SFTRunConfig(logger="console", nnodes=1, n_gpus_per_node=4, default_local_dir="~/sft_out"),
    )
    assert cfg.data.micro_batch_rows == 3 and cfg.trainer.loggers == ("console",)
    assert cfg.trainer.local_dir == os.path.join(os.path.expanduser("~"), "sft_out")
    notes = cfg.validate(world_size=2, loggers=("console",))  # 6 rows split over 2 processes
    assert any("data.micro_batch_size is deprecated" in n for n in notes)
    assert any("= 4, but 2 process(es) run" in n for n in notes)
    with pytest.raises(ConfigError) as err:
        cfg.validate(world_size=4, loggers=("file",))
    text = str(err.value)
    assert "data.train_batch_size=6 does not split over 4 processes" in text and "trainer.logger" in text
    with pytest.raises(ConfigError, match=r"data.micro_batch_size_per_gpu must be a positive integer, got None"):
        SFTTrainerConfig(data=SFTDataConfig(micro_batch_size_per_gpu=None)).validate(1, ("console",))
    # the SFT schedules: wsd is one (the RL optimizer section refuses it), linear is not
    assert SFTOptimizerConfig(lr_scheduler_type="wsd").lr_scheduler_type == "wsd"
    with pytest.raises(ConfigError, match="optim.lr_scheduler_type='linear' is not one of constant, cosine, wsd"):
        SFTOptimizerConfig(lr_scheduler_type="linear")


def test_the_trainer_takes_a_typed_config(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config import omega_conf_to_dataclass

    cfg = load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, str(tmp_path / "out")))
    typed = omega_conf_to_dataclass(cfg, SFTTrainerConfig)
    trainer = FSDPSFTTrainer(typed)
    assert trainer.config is typed and trainer.total_steps == 2
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # optim.lr of the overrides


def test_rank_batches_concatenate_to_the_single_process_batch(tiny_model_dir, tiny_data_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **{"data.train_batch_size": 8})
    whole = [b["input_ids"] for b in trainer.train_batches(epoch=1)]
    single = trainer.layout

    def batches_of(rank: int, world: int, sp: int):  # pretend to be that rank (only the data split is exercised)
        trainer.layout = ParallelLayout(*layout_of(rank, world, sp, "engine.ulysses_sequence_parallel_size"))
        return [b["input_ids"] for b in trainer.train_batches(epoch=1)]

    per_rank = [batches_of(rank, 2, 1) for rank in range(2)]
    assert len(whole) == 64 // 8
    for step, full in enumerate(whole):
        assert torch.equal(torch.cat([per_rank[0][step], per_rank[1][step]]), full)
    # 4 ranks in sequence-parallel pairs: a pair shares its rows, the two pairs split the batch
    pairs = [batches_of(rank, 4, 2) for rank in range(4)]
    for step, full in enumerate(whole):
        assert torch.equal(pairs[0][step], pairs[1][step]) and torch.equal(pairs[2][step], pairs[3][step])
        assert torch.equal(torch.cat([pairs[0][step], pairs[2][step]]), full)
    # epochs are reshuffled
    trainer.layout = single
    assert not torch.equal(next(trainer.train_batches(epoch=0))["input_ids"], whole[0])


def test_config_errors_are_reported_together(tiny_model_dir, tiny_data_dir, tmp_path):
    # values hybridflow does not implement: refused together when the config is loaded, naming the
    # key the user wrote (optim.lr_scheduler is the earlier spelling of optim.lr_scheduler_type)
    with pytest.raises(ConfigError) as err:
        make_trainer(
            tiny_model_dir,
            tiny_data_dir,
            tmp_path,
            **{"optim.lr_scheduler": "linear", "optim.total_training_steps": 10, "profiler.relocate_results": True},
        )
    text = str(err.value)
    assert "optim.lr_scheduler_type='linear'" in text and "(set as optim.lr_scheduler)" in text
    assert "optim.total_training_steps=10" in text and "profiler.relocate_results=True" in text
    assert text.count("not supported") == 3
    # values that contradict the run: refused together by the trainer's own checks
    with pytest.raises(ConfigError) as err:
        make_trainer(
            tiny_model_dir, tiny_data_dir, tmp_path, **{"trainer.logger": "[neptune]", "data.train_batch_size": 0}
        )  # mlflow is supported now
    text = str(err.value)
    assert "trainer.logger" in text and "data.train_batch_size" in text


# --------------------------------------------------------------------------- training


def test_repeated_batch_loss_decreases(tiny_model_dir, tiny_data_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path)
    batch = next(trainer.train_batches(0))
    losses = [trainer.training_step(batch)["train/loss"] for _ in range(4)]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.05, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def _sgd_delta(trainer, batch):
    """Parameter change of one plain SGD step (lr 1, no clipping, no decay) = minus the gradient."""
    trainer.optimizer = torch.optim.SGD(trainer.module.parameters(), lr=1.0)
    trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda step: 1.0)
    before = {k: v.detach().clone() for k, v in trainer.module.named_parameters()}
    trainer.training_step(batch)
    return {k: v.detach() - before[k] for k, v in trainer.module.named_parameters()}


def test_micro_batch_invariance_matches_hf_token_mean_gradient(tiny_model_dir, tiny_data_dir, tmp_path):
    extra = {"optim.clip_grad": 0, "optim.weight_decay": 0}
    one = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **{"data.micro_batch_size_per_gpu": 1}, **extra)
    four = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **{"data.micro_batch_size_per_gpu": 4}, **extra)
    batch = next(one.train_batches(0))
    counts = batch["loss_mask"].sum(-1)
    assert len(set(counts.tolist())) > 1  # rows with different numbers of response tokens: a per-row mean would differ
    # data.use_dynamic_bsz: micro-batches by a token budget that holds about two rows
    lengths = batch["attention_mask"].sum(-1)
    budget = int(lengths.max()) + int(lengths.min())
    dynamic_extra = {"data.use_dynamic_bsz": True, "data.max_token_len_per_gpu": budget, **extra}
    dynamic = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **dynamic_extra)
    parts = dynamic._micro_batches(batch, by_tokens=True)
    assert 1 < len(parts) < len(lengths) and sum(len(mb["input_ids"]) for mb in parts) == len(lengths)
    assert all(int(mb["attention_mask"].sum()) <= budget for mb in parts)
    d1, d4, dd = _sgd_delta(one, batch), _sgd_delta(four, batch), _sgd_delta(dynamic, batch)

    # independent reference: HF's own causal-LM loss (mean over labels != -100, shifted inside HF)
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    labels = torch.where(batch["loss_mask"].bool(), batch["input_ids"], torch.full_like(batch["input_ids"], -100))
    ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
    grads = {k: p.grad for k, p in ref.named_parameters()}
    assert set(grads) == set(d1)
    for name, g in grads.items():
        torch.testing.assert_close(d1[name], -g, rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(d4[name], d1[name], rtol=1e-4, atol=1e-6, msg=name)
        torch.testing.assert_close(dd[name], d1[name], rtol=1e-4, atol=1e-6, msg=name)


def test_engine_dtype_bfloat16_runs_the_forward_under_autocast_on_cpu(tiny_model_dir, tiny_data_dir, tmp_path):
    extra = {"optim.clip_grad": 0, "optim.weight_decay": 0}
    fp32 = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **extra)  # engine.dtype=auto: fp32 on cpu
    bf16 = make_trainer(tiny_model_dir, tiny_data_dir, tmp_path, **{"engine.dtype": "bfloat16"}, **extra)
    assert (fp32.compute_dtype, bf16.compute_dtype) == (None, torch.bfloat16)
    seen = []
    bf16.module.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    batch = next(fp32.train_batches(0))
    d32, d16 = _sgd_delta(fp32, batch), _sgd_delta(bf16, batch)
    assert seen == [torch.bfloat16]  # the matmuls ran in bf16 ...
    assert all(p.dtype == torch.float32 for p in bf16.module.parameters())  # ... over fp32 master weights
    flat32, flat16 = (torch.cat([d[k].flatten() for k in sorted(d)]) for d in (d32, d16))
    assert not torch.equal(flat32, flat16)
    cosine = torch.nn.functional.cosine_similarity(flat32, flat16, dim=0)
    assert cosine > 0.99, cosine  # the same gradient up to bf16 rounding


def test_fit_writes_loadable_hf_dir_with_new_weights(tiny_model_dir, tiny_data_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = str(tmp_path / "out")
    cfg = load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, out, **{"trainer.save_freq": 1}))
    final = run_sft(cfg)
    assert final == os.path.join(out, "global_step_2") == latest_hf_dir(out)
    assert os.path.isdir(os.path.join(out, "global_step_1"))  # save_freq=1
    with open(os.path.join(out, LATEST_FILE)) as f:
        assert f.read().strip() == "2"
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert "val/loss" in rows[-1] and math.isfinite(rows[-1]["val/loss"])

    with open(os.path.join(final, "config.json")) as f, open(os.path.join(tiny_model_dir, "config.json")) as g:
        assert json.load(f) == json.load(g)
    trained = AutoModelForCausalLM.from_pretrained(final)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = [n for n, p in trained.state_dict().items() if not torch.equal(p, initial.state_dict()[n])]
    assert len(changed) == len(initial.state_dict())  # Adam moves every parameter
    tok = AutoTokenizer.from_pretrained(final)
    assert tok.chat_template and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert trained.generation_config.eos_token_id == tok.eos_token_id
    assert trained.generation_config.top_k in (0, None)


@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """2 gloo processes (FSDP2) see the same global batches as 1 process and give the same losses."""
    from transformers import AutoModelForCausalLM

    extra = {"data.train_batch_size": 8, "data.micro_batch_size_per_gpu": 2}
    out2, out1 = str(tmp_path / "w2"), str(tmp_path / "w1")
    proc = torchrun_sft(sft_overrides(tiny_model_dir, tiny_data_dir, out2, **extra))
    assert "saved Hugging Face model to" in proc.stdout
    from safetensors import safe_open

    saved = os.path.join(out2, "global_step_2")
    AutoModelForCausalLM.from_pretrained(saved)
    keys = lambda d: set(safe_open(os.path.join(d, "model.safetensors"), "pt").keys())  # noqa: E731
    assert keys(saved) == keys(tiny_model_dir)  # tied embeddings stay tied (no separate lm_head copy)

    run_sft(load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, out1, **extra)))
    two, one = read_metrics(out2), read_metrics(out1)
    assert len(two) == len(one) > 0, (len(two), len(one))  # the same logged steps, not just a common prefix
    for a, b in zip(two, one, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/loss_tokens"] == b["train/loss_tokens"]
    assert two[-1]["val/loss"] == pytest.approx(one[-1]["val/loss"], rel=1e-4)


def test_data_custom_cls_is_loaded_from_its_file(tiny_model_dir, tiny_data_dir, tmp_path):
    """data.custom_cls (veRL's key): the class in the file builds the training rows; a missing name is named."""
    path = tmp_path / "my_sft_data.py"
    path.write_text(
        "from hybridflow.data.sft_dataset import SFTDataset\n\n\nclass Shorter(SFTDataset):\n"
        "    def __len__(self):\n        return 4\n"
    )
    trainer = make_trainer(
        tiny_model_dir,
        tiny_data_dir,
        tmp_path,
        **{"data.custom_cls.path": str(path), "data.custom_cls.name": "Shorter"},
    )
    assert type(trainer.train_dataset).__name__ == "Shorter" and len(trainer.train_dataset) == 4
    with pytest.raises(AttributeError, match="data.custom_cls.name='Missing' is not defined in"):
        make_trainer(
            tiny_model_dir,
            tiny_data_dir,
            tmp_path,
            **{"data.custom_cls.path": str(path), "data.custom_cls.name": "Missing"},
        )


@pytest.mark.slow
def test_sequence_parallel_pair_matches_one_process(tiny_model_dir, tiny_data_dir, tmp_path):
    """engine.ulysses_sequence_parallel_size=2 on 2 gloo processes (veRL's SFT examples set it): one
    data-parallel replica whose packed micro-batches are split along the sequence trains as 1 process does."""
    extra = {"data.train_batch_size": 4, "data.micro_batch_size_per_gpu": 2, "trainer.total_training_steps": 3}
    out_sp, out1 = str(tmp_path / "sp2"), str(tmp_path / "w1")
    torchrun_sft(
        sft_overrides(tiny_model_dir, tiny_data_dir, out_sp, **extra, **{"engine.ulysses_sequence_parallel_size": 2})
    )
    run_sft(load_config("sft_trainer", sft_overrides(tiny_model_dir, tiny_data_dir, out1, **extra)))
    sp, one = read_metrics(out_sp), read_metrics(out1)
    assert len(sp) == len(one) == 3
    for a, b in zip(sp, one, strict=True):  # step 2 and 3's losses follow the earlier updates
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-3)
        assert a["train/loss_tokens"] == b["train/loss_tokens"]
    assert sp[-1]["val/loss"] == pytest.approx(one[-1]["val/loss"], rel=1e-4)


def test_sequence_parallel_size_must_divide_the_processes_and_leave_the_batch_splittable():
    def errors(world: int, sp: int, batch: int) -> str:
        cfg = load_config(
            "sft_trainer",
            [f"engine.ulysses_sequence_parallel_size={sp}", f"data.train_batch_size={batch}", "trainer.logger=file"],
        )
        try:
            as_section(cfg, SFTTrainerConfig).validate(world, ("file",))
        except ConfigError as e:
            return str(e)
        return ""

    assert errors(world=4, sp=2, batch=6) == ""  # 2 data-parallel pairs, 3 rows each
    assert "engine.ulysses_sequence_parallel_size=2 must be >= 1 and divide the 3 process(es)" in errors(3, 2, 6)
    assert (
        "data.train_batch_size=6 does not split over 4 data-parallel ranks (8 processes / "
        "engine.ulysses_sequence_parallel_size=2)" in errors(8, 2, 6)
    )
