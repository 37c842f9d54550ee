"""Bad input fails at once, with a message naming the culprit, through the public entry points.

Everything a user can get wrong before training (config, data, model, tokenizer, reward file, batch
sizes) must fail before any worker starts: the ``no_workers`` fixture makes starting one a test
failure. Errors only visible while training (a reward function that raises or returns NaN, a
non-finite loss) are checked on short in-process runs.
"""

from __future__ import annotations

import json
import math
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.config.loader import load_config
from hybridflow.main_ppo import run_ppo
from hybridflow.rewards.manager import RewardComputationError
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.ppo import ray_trainer
from tests.trainer.e2e_helpers import base_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture
def no_workers(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("bad input was not caught before the workers started")

    monkeypatch.setattr(ray_trainer, "build_worker_groups", refuse)


@pytest.fixture
def make_config(tiny_model_dir, tiny_data_dir, tmp_path):
    def make(*extra, backend="inprocess", world=1, **kw):
        overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend=backend, world=world, steps=1, **kw)
        overrides += [
            "trainer.logger=['console']",
            "trainer.test_freq=-1",
            "actor_rollout_ref.model.enable_gradient_checkpointing=False",
            *extra,
        ]
        return load_config("ppo_trainer", overrides)

    return make


def _write_rows(path, table: pa.Table) -> str:
    pq.write_table(table, str(path))
    return str(path)


# --- config -----------------------------------------------------------------------------------------
def test_unknown_config_key_names_the_closest_key(make_config):
    with pytest.raises(Exception, match=r"actor_rollout_ref\.actor\.optim\.lr") as info:
        make_config("actor_rollout_ref.actor.optim.learning_rat=1e-4")
    assert "learning_rat" in str(info.value)


def test_wrong_value_type_names_key_and_value(make_config):
    with pytest.raises(Exception, match="data.train_batch_size") as info:
        make_config("data.train_batch_size=eight")
    assert "eight" in str(info.value)


def test_batch_sizes_that_do_not_divide(make_config, no_workers):
    # 4 prompts per step cannot be cut into mini-batches of 3 prompts
    with pytest.raises(Exception, match="ppo_mini_batch_size"):
        run_ppo(make_config("actor_rollout_ref.actor.ppo_mini_batch_size=3"))


# --- data -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["data.train_files", "data.val_files"])
def test_missing_data_file(make_config, no_workers, tmp_path, key):
    missing = tmp_path / "nowhere" / "train.parquet"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        run_ppo(make_config(f"{key}={missing}"))


def test_parquet_without_the_prompt_column(make_config, no_workers, tmp_path):
    path = _write_rows(tmp_path / "q.parquet", pa.table({"question": ["1+1?"] * 8, "data_source": ["x"] * 8}))
    with pytest.raises(KeyError, match="prompt") as info:
        run_ppo(make_config(f"data.train_files={path}"))
    assert "q.parquet" in str(info.value)


def test_empty_dataset(make_config, no_workers, tmp_path):
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    path = _write_rows(tmp_path / "empty.parquet", pa.table({"prompt": pa.array([], pa.list_(message))}))
    with pytest.raises(ValueError, match="empty.parquet"):
        run_ppo(make_config(f"data.train_files={path}"))


def test_every_prompt_filtered_as_overlong(make_config, no_workers):
    with pytest.raises(ValueError, match="max_prompt_length=4"):
        run_ppo(make_config("data.max_prompt_length=4", "data.filter_overlong_prompts=True"))


def test_truncation_error_with_an_overlong_prompt_fails_before_training(make_config, no_workers, tiny_data_dir):
    with pytest.raises(ValueError, match=r"data.train_files=.*train.parquet.*max_prompt_length=8.*data.truncation"):
        run_ppo(make_config("data.max_prompt_length=8", "data.truncation=error"))


def test_train_batch_larger_than_dataset(make_config, no_workers):
    with pytest.raises(ValueError, match="train_batch_size"):
        run_ppo(
            make_config(
                "data.train_batch_size=128",
                "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
                "critic.ppo_micro_batch_size_per_gpu=8",
            )
        )


# --- model and tokenizer ----------------------------------------------------------------------------
def test_model_path_that_does_not_exist(make_config, no_workers, tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*a, **k):
        raise AssertionError("tried to reach the hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    missing = tmp_path / "Qwen" / "Qwen2.5-0.5B"
    with pytest.raises(FileNotFoundError, match="actor_rollout_ref.model.path") as info:
        run_ppo(make_config(f"actor_rollout_ref.model.path={missing}"))
    assert str(missing) in str(info.value)


def test_tokenizer_without_chat_template(make_config, no_workers, tiny_model_dir, tmp_path):
    plain = tmp_path / "no_template"
    shutil.copytree(tiny_model_dir, plain)
    for name in os.listdir(plain):
        if name.startswith("chat_template"):
            os.remove(plain / name)
    cfg_path = plain / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(tok_cfg))
    with pytest.raises(ValueError, match="chat template") as info:
        run_ppo(make_config(f"actor_rollout_ref.model.path={plain}"))
    assert "no_template" in str(info.value) or "tokenizer" in str(info.value)


# --- reward function --------------------------------------------------------------------------------
def test_custom_reward_file_missing(make_config, no_workers, tmp_path):
    missing = tmp_path / "my_reward.py"
    with pytest.raises(FileNotFoundError, match="my_reward.py"):
        run_ppo(make_config(f"custom_reward_function.path={missing}"))


def test_custom_reward_function_missing(make_config, no_workers, tmp_path):
    with pytest.raises(AttributeError, match="my_score"):
        run_ppo(make_config("custom_reward_function.name=my_score"))


def _reward_file(tmp_path, body: str) -> str:
    path = tmp_path / "bad_reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" + body)
    return str(path)


def test_reward_function_that_raises_names_the_sample(make_config, tmp_path):
    path = _reward_file(tmp_path, "    raise ZeroDivisionError('my scorer broke')\n")
    with pytest.raises(
        RewardComputationError, match=r"sample 0 \(data_source='openai/gsm8k'\).*my scorer broke"
    ) as info:
        run_ppo(make_config(f"custom_reward_function.path={path}"))
    assert "global step 1" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize("value, what", [("float('nan')", "not finite"), ("'0.5'", "not a number")])
def test_reward_function_returning_a_non_number(make_config, tmp_path, value, what):
    path = _reward_file(tmp_path, f"    return {value}\n")
    with pytest.raises(ValueError, match=rf"sample 0 \(data_source='openai/gsm8k'\).*{what}"):
        run_ppo(make_config(f"custom_reward_function.path={path}", "trainer.val_before_train=True"))


# --- cluster ----------------------------------------------------------------------------------------
def test_more_workers_than_the_cluster_has(make_config, ray_session):
    # the session's Ray has 4 CPUs; 8 worker processes must be refused at once, not wait forever
    config = make_config(backend="ray", world=8, batch=8)
    with pytest.raises(
        RuntimeError, match=r"need 8 CPUs in total \(trainer: 8 \(8 per node\)\) but the Ray cluster has 4"
    ):
        run_ppo(config)


# --- non-finite loss / weights ----------------------------------------------------------------------
def _actor_worker(trainer):
    fused = trainer.actor_rollout_wg.workers[0]
    return fused._roles["actor_rollout"] if hasattr(fused, "_roles") else fused


# every optimizer step of the first update is skipped, and the LR schedule still advances a step (veRL's order):
# torch warns that the scheduler stepped before any optimizer step, which is this test's point
@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`")
def test_non_finite_loss_skips_the_step_and_nan_weights_are_never_saved(make_config, tmp_path, monkeypatch):
    seen = {}
    original_adv = ray_trainer.RayPPOTrainer._compute_advantage
    original_step = ray_trainer.RayPPOTrainer.train_step

    def nan_advantage(trainer, batch):
        original_adv(trainer, batch)
        if trainer.global_steps == 1:  # one NaN token: loss and gradient become NaN
            batch.batch["advantages"][0, 0] = float("nan")

    def train_step(trainer, batch):
        before = trainer.actor_rollout_wg.parameter_checksum()[0]
        metrics = original_step(trainer, batch)
        seen[trainer.global_steps] = (before, trainer.actor_rollout_wg.parameter_checksum()[0], metrics)
        if trainer.global_steps == 2:  # something outside the step poisons the weights
            with torch.no_grad():
                next(_actor_worker(trainer).actor_engine.module.parameters()).fill_(float("nan"))
        return metrics

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "_compute_advantage", nan_advantage)
    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "train_step", train_step)
    root = tmp_path / "ckpt"
    with pytest.raises(FloatingPointError, match="refusing to save the checkpoint of step 2.*NaN"):
        # one mini-batch per step (mini_batch=batch): the NaN makes the step's only optimizer step non-finite
        run_ppo(make_config("trainer.total_training_steps=2", "trainer.save_freq=1", mini_batch=4))

    before, after, metrics = seen[1]
    assert metrics["actor/skipped_steps"] == 1.0 and before == after  # the NaN step was not applied
    assert math.isfinite(after)
    assert seen[2][2]["actor/skipped_steps"] == 0.0 and seen[2][1] != seen[2][0]  # a clean step trains again
    assert sorted(ckpt.complete_steps(str(root))) == [1] and ckpt.read_latest_step(str(root)) == 1
    assert not [n for n in os.listdir(root) if n.startswith("global_step_2")]
