"""The quickstart recipe: its helpers (fast) and a --quick end-to-end run (slow: ~1-2 min on 2 cores).

The --quick run checks the plumbing only (data → SFT → eval → GRPO via main_ppo → export → eval →
JSON + matplotlib PNG); the accuracy target belongs to the full recipe, measured by hand (see the README).
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys

import pytest
import quickstart  # recipes/quickstart.py (recipes/ is on pytest.ini's pythonpath)

from tests.subprocess_env import pythonpath_with

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_choose_checkpoint_prefers_first_in_band():
    band = (0.20, 0.45)
    assert quickstart.choose_checkpoint({25: 0.0, 50: 0.22, 75: 0.40}, band) == 50
    # jumped over the band: the accuracy closest to the band's middle (0.325)
    assert quickstart.choose_checkpoint({25: 0.05, 50: 0.55, 75: 0.9}, band) == 50
    assert quickstart.choose_checkpoint({25: 0.0, 50: 0.1}, band) == 50
    assert quickstart.choose_checkpoint({25: 0.0, 50: 0.22, 75: 0.40}, (0.30, 0.55)) == 75
    assert quickstart.choose_checkpoint({25: 0.0, 50: 0.33, 75: 0.45}) == 75  # the default band starts at 40%


def test_curves_read_reward_and_validation_from_jsonl_rows():
    rows = [
        {"step": 0, "val-core/openai/gsm8k/reward/mean@1": 0.3},
        {"step": 1, "critic/score/mean": 0.25},
        {"step": 2, "critic/score/mean": 0.5, "val-core/openai/gsm8k/reward/mean@1": 0.4},
    ]
    assert quickstart.curves(rows) == ([(1, 0.25), (2, 0.5)], [(0, 0.3), (2, 0.4)])


def test_rl_args_follow_the_calibration_and_compose(tmp_path):
    from hybridflow.config.loader import load_config

    paths = {"train": "t.parquet", "heldout": "h.parquet"}
    for algo in ("grpo", "ppo"):
        args = quickstart.parse(["--algo", algo])
        overrides = quickstart.rl_args(algo, "/m", paths, quickstart.FULL, str(tmp_path), args)
        cfg = load_config("ppo_trainer", overrides)  # every key is a real config key
        assert cfg.actor_rollout_ref.actor.optim.lr == 1e-4 and not cfg.actor_rollout_ref.actor.use_kl_loss
        assert cfg.actor_rollout_ref.rollout.temperature == 1.0 and not cfg.algorithm.use_kl_in_reward
        samples = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        assert samples == 16 * 8  # same sample budget per step for both algorithms
        assert cfg.algorithm.adv_estimator == ("grpo" if algo == "grpo" else "gae")
        optim = cfg.actor_rollout_ref.actor.optim  # warm-up, then cosine decay to 0.1 x lr
        assert (optim.lr_warmup_steps, optim.warmup_style, optim.min_lr_ratio) == (10, "cosine", 0.1)


def test_backend_defaults_to_inprocess_only_for_the_sync_mode(tmp_path):
    """sync: main_ppo runs its one colocated worker in its own process (no Ray start-up, ~65 CPU s less);
    the modes with a rollout worker of their own keep Ray; an explicit --backend wins."""
    from hybridflow.config.loader import load_config
    from hybridflow.trainer.config_checks import validate_ppo_config

    args = quickstart.parse([])
    cfg = load_config(
        "ppo_trainer",
        quickstart.rl_args("grpo", "/m", {"train": "t", "heldout": "h"}, quickstart.FULL, str(tmp_path), args),
    )
    validate_ppo_config(cfg, n_devices=1)
    assert cfg.trainer.backend == "inprocess"
    assert quickstart.parse(["--mode", "one_step_off"]).backend == "ray"
    assert quickstart.parse(["--backend", "ray"]).backend == "ray"


@pytest.mark.parametrize("mode", ["colocate_async", "separate_async"])
def test_the_v1_modes_compose_and_pass_the_start_up_checks(tmp_path, mode):
    from hybridflow.config.loader import load_config
    from hybridflow.trainer.config_checks import validate_ppo_config

    paths = {"train": "t.parquet", "heldout": "h.parquet"}
    for algo in ("grpo", "ppo"):
        args = quickstart.parse(["--algo", algo, "--mode", mode])
        cfg = load_config("ppo_trainer", quickstart.rl_args(algo, "/m", paths, quickstart.FULL, str(tmp_path), args))
        validate_ppo_config(cfg, n_devices=1)  # separate_async: train_batch_size = 2 x ppo_mini_batch_size
        assert cfg.trainer.v1.trainer_mode == mode and cfg.async_training.mode == "sync"


def test_rl_overrides_come_last_and_sizes_follow_batch_and_n(tmp_path):
    from hybridflow.config.loader import load_config

    paths = {"train": "t.parquet", "heldout": "h.parquet"}
    args = quickstart.parse(
        [
            "--batch",
            "32",
            "--n",
            "4",
            "--lr_schedule",
            "constant",
            "--rl_override",
            "algorithm.norm_adv_by_std_in_grpo=False",
            "--rl_override",
            "trainer.test_freq=5",
        ]
    )
    sizes = quickstart.recipe_sizes(args)
    assert (sizes["batch"], sizes["n"], sizes["response_length"]) == (32, 4, 40)
    assert quickstart.recipe_sizes(quickstart.parse(["--task_style", "direct"]))["response_length"] == 24
    assert quickstart.recipe_sizes(quickstart.parse(["--quick"])) == quickstart.QUICK
    # GRPO's defaults (32-row SFT steps, 125 RL steps) are not PPO's, whose figures used 64 and 150
    grpo, ppo = (quickstart.recipe_sizes(quickstart.parse(["--algo", a])) for a in ("grpo", "ppo"))
    assert (grpo["sft_batch"], grpo["rl_steps"], ppo["sft_batch"], ppo["rl_steps"]) == (32, 125, 64, 150)
    assert quickstart.recipe_sizes(quickstart.parse(["--algo", "ppo", "--sft_batch", "16"]))["sft_batch"] == 16
    overrides = quickstart.rl_args("grpo", "/m", paths, sizes, str(tmp_path), args)
    assert overrides[-2:] == ["algorithm.norm_adv_by_std_in_grpo=False", "trainer.test_freq=5"]
    cfg = load_config("ppo_trainer", overrides)
    assert cfg.trainer.test_freq == 5 and cfg.algorithm.norm_adv_by_std_in_grpo is False
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (32, 4)
    assert cfg.actor_rollout_ref.actor.optim.warmup_style == "constant"


@pytest.mark.slow
def test_quickstart_quick_writes_json_and_png(tmp_path):
    work = tmp_path / "qs"
    env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO))
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "recipes", "quickstart.py"),
            "--quick",
            "--workdir",
            str(work),
            "--backend",
            "inprocess",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((work / "quickstart_result.json").read_text())
    for key in ("accuracy_before", "accuracy_after", "wall_seconds"):
        assert math.isfinite(result[key])
    assert 0.0 <= result["accuracy_before"] <= 1.0 and 0.0 <= result["accuracy_after"] <= 1.0
    assert result["steps"] == 2 and set(result["phase_seconds"]) == {"data", "sft", "eval_before", "rl", "eval_after"}
    assert [s for s, _ in result["train_reward"]] == [1, 2]
    assert [s for s, _ in result["val_accuracy"]] == [0, 1, 2]  # before training, then every step
    assert all(math.isfinite(v) for _, v in result["train_reward"] + result["val_accuracy"])
    assert _png_size((work / "quickstart_curves.png").read_bytes()) == (800, 450)  # matplotlib, 8 x 4.5 in at 100 dpi
    assert "accuracy before" in out.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_quickstart_quick_on_cuda(tmp_path, algo):
    """The in-process path on a GPU: workers must move the driver's CPU batches to their device."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    work = tmp_path / algo
    # the caller's PYTHONPATH stays: on a GPU machine the carried wheels live there (benchmarks/gpu_check.sh)
    env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO))
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "recipes", "quickstart.py"),
            "--quick",
            "--algo",
            algo,
            "--device",
            "cuda",
            "--backend",
            "inprocess",
            "--workdir",
            str(work),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((work / "quickstart_result.json").read_text())
    assert result["steps"] == 2 and math.isfinite(result["accuracy_after"])


@pytest.mark.parametrize("script", ["gsm8k_grpo.sh", "gsm8k_ppo.sh"])
def test_gpu_recipes_use_only_known_config_keys(script):
    from hybridflow.config.loader import load_config
    from hybridflow.devtools.shell_words import read_script

    # the script's own variables expanded as bash would (ROLLOUT=${ROLLOUT:-vllm}, MODEL_PATH=...)
    commands = [
        c.words
        for c in read_script(os.path.join(REPO, "recipes", script), cwd=REPO).commands()
        if "hybridflow.main_ppo" in c.words
    ]
    assert len(commands) == 1
    overrides = [w for w in commands[0][commands[0].index("hybridflow.main_ppo") + 1 :] if "=" in w]
    assert len(overrides) > 20
    cfg = load_config("ppo_trainer", overrides)
    assert cfg.algorithm.adv_estimator == ("grpo" if "grpo" in script else "gae")
