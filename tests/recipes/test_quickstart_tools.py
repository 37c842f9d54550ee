"""The tool-use quickstart: its helpers (fast) and a --quick end-to-end run (slow).

The --quick run checks the plumbing only (data -> multi-turn SFT -> agent eval -> GRPO with the tool
agent through main_ppo -> export -> eval -> JSON + PNG); the learning target is measured by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import quickstart_tools  # recipes/quickstart_tools.py (recipes/ is on pytest.ini's pythonpath)

from hybridflow.config.loader import load_config
from hybridflow.trainer.config_checks import validate_ppo_config
from tests.subprocess_env import pythonpath_with

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_outcomes_and_summary_by_hand():
    right = {
        "response": '<tool_call>\n{"name": "calc", "arguments": {"expr": "12*34"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        "#### 408<|im_end|>",
        "ground_truth": "408",
        "score": 1.0,
        "num_turns": 4,
    }
    wrong_call = dict(right, response=right["response"].replace("12*34", "12*43").replace("408", "516"), score=0.0)
    head = {"response": "#### 400<|im_end|>", "ground_truth": "408", "score": 0.0, "num_turns": 2}
    assert quickstart_tools.tool_outcome(right) == {"tool": True, "tool_correct": True, "correct": True}
    assert quickstart_tools.tool_outcome(wrong_call) == {"tool": True, "tool_correct": False, "correct": False}
    s = quickstart_tools.summarize([right, wrong_call, head, head])
    # 1 of 4 right; 2 of 4 called the tool; 1 of 4 got the right product back; 1 of the 2 calls was right
    assert s == {
        "accuracy": 0.25,
        "tool_share": 0.5,
        "tool_correct_share": 0.25,
        "correct_given_tool": 0.5,
        "accuracy_given_tool": 0.5,
        "mean_turns": 3.0,
        "n": 4,
    }


def test_rl_args_compose_and_validate(tmp_path):
    args = quickstart_tools.parse(["--workdir", str(tmp_path), "--interaction"])
    paths = {k: str(tmp_path / f"{k}.x") for k in ("train", "val", "tools", "interaction")}
    (tmp_path / "tools.x").write_text("tools: []\n")
    (tmp_path / "interaction.x").write_text("interaction: []\n")
    overrides = quickstart_tools.rl_args("/m", paths, quickstart_tools.FULL, str(tmp_path / "run"), args)
    cfg = load_config("ppo_trainer", overrides)
    validate_ppo_config(cfg)
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert mt.tool_config_path == paths["tools"] and mt.interaction_config_path == paths["interaction"]
    assert cfg.data.max_response_length == quickstart_tools.INTERACTION_RESPONSE_LENGTH


def test_curves_from_metric_rows():
    rows = [
        {"step": 0, "val-core/openai/gsm8k/reward/mean@1": 0.1},
        {"step": 1, "critic/score/mean": 0.2, "agent/num_turns/mean": 2.5, "agent/tool_calls": 0.4},
    ]
    c = quickstart_tools.curves(rows)
    assert c == {
        "val_accuracy": [(0, 0.1)],
        "train_reward": [(1, 0.2)],
        "mean_turns": [(1, 2.5)],
        "tool_calls": [(1, 0.4)],
    }


@pytest.mark.slow
def test_quickstart_tools_quick_writes_json_and_png(tmp_path):
    work = tmp_path / "qt"
    env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO))
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "recipes", "quickstart_tools.py"),
            "--quick",
            "--workdir",
            str(work),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.load(open(work / "quickstart_tools_result.json"))
    assert result["steps"] == 2 and os.path.getsize(result["png"]) > 1000
    assert set(result["before"]) >= {"accuracy", "tool_share", "tool_correct_share", "mean_turns"}
    assert result["curves"]["mean_turns"] and result["curves"]["val_accuracy"]
