"""recipes/real_model.py: the word problems it trains on, the main_ppo command line it builds, and (slow) a
one-step run on the real model."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import openai_agent
import pandas as pd
import pytest
import real_model  # recipes/real_model.py (recipes/ is on pytest.ini's pythonpath)
import real_model_tools
import word_problems

from hybridflow.rewards.scorers import default_compute_score
from tests.subprocess_env import pythonpath_with

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _solve(question: str) -> int:
    """The answer computed again from the question's words (independent of the generator's arithmetic)."""
    numbers = [int(x) for x in re.findall(r"\d+", question)]
    if " loose " in question:
        return numbers[0] * numbers[1] + numbers[2]
    if " finds " in question:
        return sum(numbers)
    if " packs of " in question:
        return numbers[0] * numbers[1] - numbers[2]
    if " more and then loses " in question:
        return numbers[0] + numbers[1] - numbers[2]
    if " gets " in question:
        return numbers[0] + numbers[1]
    if " gives " in question:
        return numbers[0] - numbers[1]
    if " bags with " in question:
        return numbers[0] * numbers[1]
    if " already has " in question:
        return numbers[0] // numbers[1] + numbers[2]
    if " equally among " in question:
        return numbers[0] // numbers[1]
    raise AssertionError(f"unknown story: {question}")


def test_word_problems_are_gsm8k_rows_with_right_answers_and_a_disjoint_heldout(tmp_path):
    paths = word_problems.write_word_problems(str(tmp_path), seed=3, train_size=300, test_size=100)
    train, heldout = pd.read_parquet(paths["train"]), pd.read_parquet(paths["heldout"])
    assert len(train) == 300 and len(heldout) == 100
    assert not set(train["extra_info"].map(lambda e: e["question"])) & set(
        heldout["extra_info"].map(lambda e: e["question"])
    )
    for frame in (train, heldout):
        for row in frame.itertuples():
            question, truth = row.extra_info["question"], row.reward_model["ground_truth"]
            assert int(truth) == _solve(question) and int(truth) >= 0
            assert [m["role"] for m in row.prompt] == ["user"] and "####" in row.prompt[0]["content"]
            # the gsm8k rule scorer grades it: the right number after '#### ' scores 1, a wrong one 0
            assert default_compute_score(row.data_source, f"so\n#### {truth}", truth) == 1.0
            assert default_compute_score(row.data_source, f"so\n#### {int(truth) + 1}", truth) == 0.0
    kinds = {
        k
        for k in ("gets", "gives", "bags with")
        if any(k in q for q in train["extra_info"].map(lambda e: e["question"]))
    }
    assert kinds == {"gets", "gives", "bags with"}
    again = word_problems.write_word_problems(str(tmp_path / "again"), seed=3, train_size=300, test_size=100)
    assert pd.read_parquet(again["train"]).equals(train)  # the same seed gives the same problems
    other = word_problems.write_word_problems(str(tmp_path / "other"), seed=4, train_size=300, test_size=100)
    assert not pd.read_parquet(other["train"])["extra_info"].equals(train["extra_info"])


def test_committed_answer_is_the_number_after_the_marker_else_the_last_number():
    assert word_problems.committed_correct("3 + 5 = 8\n#### 8\nSo 2 apples are left.", "8")  # restated: still 8
    assert not word_problems.committed_correct("3 + 5 = 9\n#### 9\nThe answer is 8.", "8")  # committed to 9
    assert word_problems.committed_correct("3 + 5 = 8 apples", "8")  # no marker: the last number
    assert not word_problems.committed_correct("8 apples and then 3", "8")
    assert word_problems.committed_correct("####$1,200.", "1200") and not word_problems.committed_correct("none", "1")


def test_the_recipe_command_line_uses_only_known_keys(tmp_path):
    from hybridflow.config.loader import load_config

    args = real_model.parse(["--steps", "7", "--rl_override", "actor_rollout_ref.actor.clip_ratio=0.3"])
    paths = {"train": str(tmp_path / "t.parquet"), "heldout": str(tmp_path / "h.parquet")}
    for rollout in ("vllm", "hf"):
        overrides = real_model.rl_args(str(tmp_path / "model"), paths, str(tmp_path / "run"), rollout, args)
        cfg = load_config("ppo_trainer", overrides)  # an unknown key would fail here
        assert cfg.actor_rollout_ref.rollout.name == rollout and cfg.trainer.total_training_steps == 7
        assert cfg.actor_rollout_ref.actor.clip_ratio == 0.3  # the user's override comes last


def test_the_kl_term_and_the_lr_decay_reach_the_config_and_the_other_recipes_keep_theirs(tmp_path, capsys):
    from hybridflow.config.loader import load_config

    paths = {"train": str(tmp_path / "t.parquet"), "heldout": str(tmp_path / "h.parquet")}

    def actor_of(args):
        return load_config("ppo_trainer", real_model.rl_args("m", paths, str(tmp_path), "vllm", args)).actor_rollout_ref

    aref = actor_of(real_model.parse([]))
    assert aref.actor.use_kl_loss and aref.actor.kl_loss_coef == 0.1 and aref.actor.kl_loss_type == "low_var_kl"
    assert aref.ref.log_prob_micro_batch_size_per_gpu == aref.actor.ppo_micro_batch_size_per_gpu
    assert aref.actor.optim.lr_scheduler_type == "cosine" and aref.actor.optim.min_lr_ratio == 0.1
    off = actor_of(real_model.parse(["--kl_coef", "0", "--lr_schedule", "constant"]))
    assert not off.actor.use_kl_loss and off.actor.optim.lr_scheduler_type == "constant"
    for refused, message in (
        (["--lr_schedule", "constant", "--min_lr_ratio", "0.2"], "--min_lr_ratio is the floor of the cosine decay"),
        (["--kl_coef", "-0.1"], "--kl_coef -0.1: a KL penalty is 0 or positive"),
    ):
        with pytest.raises(SystemExit):
            real_model.parse(refused)
        assert message in capsys.readouterr().err
    assert actor_of(real_model.parse(["--min_lr_ratio", "0.3"])).actor.optim.min_lr_ratio == 0.3
    # the tools and OpenAI-agent recipes keep what they were measured with: no KL term, a constant lr
    for args in (real_model_tools.parse([])[1], openai_agent.parse([])):
        assert args.kl_coef == 0 and args.lr_schedule == "constant"


def test_the_problem_kinds_are_options_and_an_unknown_one_is_named(capsys):
    args = real_model.parse([])
    assert args.kinds == real_model.KINDS and args.hi == real_model.HI and args.heldout_kind == real_model.HELDOUT_KIND
    assert args.heldout_kind not in args.kinds + args.warmup_kinds  # the held-out kind is never trained on
    args = real_model.parse(["--kinds", "add, two_step", "--hi", "300", "--heldout_kind", "mul_add"])
    assert args.kinds == ("add", "two_step") and args.hi == 300 and args.heldout_kind == "mul_add"
    with pytest.raises(SystemExit):
        real_model.parse(["--kinds", "add,mul_div"])
    assert "unknown problem kind 'mul_div'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        real_model.parse(["--heldout_kind", "mul_sub"])  # the default training kinds hold it
    assert "--heldout_kind mul_sub is also trained on" in capsys.readouterr().err
    assert real_model.parse(["--heldout_kind", "add", "--warmup_steps", "0"]).heldout_kind == "add"  # no warm-up
    _, tools_args = real_model_tools.parse([])  # the tools recipe's problems are its own products
    with pytest.raises(SystemExit):
        real_model_tools.parse(["--kinds", "add"])
    assert "--kinds is not used here" in capsys.readouterr().err


def test_the_openai_agent_recipe_runs_the_agent_loop_on_the_real_model_recipe_s_grpo(tmp_path):
    import openai_agent

    from hybridflow.config.loader import load_config

    args = openai_agent.parse(["--steps", "4", "--rollout", "vllm", "--rl_override", "trainer.save_freq=2"])
    paths = {"train": str(tmp_path / "t.parquet"), "heldout": str(tmp_path / "h.parquet")}
    loops = str(tmp_path / "loops.yaml")
    for rollout in ("vllm", "hf"):
        overrides = openai_agent.grpo_args("m", paths, loops, str(tmp_path / "run"), rollout, args)
        cfg = load_config("ppo_trainer", overrides)
        rollout_cfg = cfg.actor_rollout_ref.rollout
        assert rollout_cfg.name == rollout and rollout_cfg.agent.default_agent_loop == "openai_agent"
        assert rollout_cfg.agent.agent_loop_config_path == loops and cfg.data.max_response_length == 192
        # validation before and after (test_freq = steps), no checkpoint, whatever real_model.rl_args had set
        assert cfg.trainer.val_before_train and cfg.trainer.test_freq == 4
        assert cfg.trainer.save_freq == 2  # the user's override comes after the recipe's own (-1)
    with pytest.raises(SystemExit, match="--warmup_steps is not used here"):
        openai_agent.parse(["--warmup_steps", "3"])
    with pytest.raises(SystemExit, match="--test_freq is not used here"):
        openai_agent.parse(["--test_freq=2"])


def _equations_hold(working: str) -> bool:
    """Each ``a op b = c`` of a worked answer, computed again here."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}
    found = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", working)
    return bool(found) and all(ops[op](int(a), int(b)) == int(c) for a, op, b, c in found)


def test_the_warmup_rows_show_right_working_then_the_marked_answer_and_the_sft_keys_are_known(tmp_path):
    from hybridflow.config.loader import load_config

    args = real_model.parse(["--warmup_steps", "6", "--seed", "2"])
    path = str(tmp_path / "warmup.parquet")
    real_model.write_warmup(path, args)
    rows = pd.read_parquet(path)
    assert len(rows) == 6 * real_model.WARMUP_BATCH
    for question, answer in zip(rows["question"], rows["answer"], strict=True):
        working, marked = answer.split("\n#### ")
        assert _equations_hold(working), answer
        assert int(marked) == _solve(question.split(" Answer briefly")[0]) == int(working.rsplit("= ", 1)[1])
    train = word_problems.make_rows(200, 2, "train", real_model.KINDS, real_model.HI)
    assert not set(rows["question"]) & {r["prompt"][0]["content"] for r in train}  # its own split
    overrides = real_model.warmup_args("m", path, str(tmp_path / "sft"), args)
    cfg = load_config("sft_trainer", overrides)  # an unknown key would fail here
    assert cfg.trainer.total_training_steps == 6 and cfg.data.train_files == path


def test_the_tools_recipe_passes_its_template_and_tools_to_main_ppo(tmp_path):
    from hybridflow.config.loader import load_config

    turns = "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5"
    own, args = real_model_tools.parse(["--steps", "3", "--sft_steps", "5", "--rl_override", turns])
    assert own.sft_steps == 5 and args.steps == 3 and args.workdir == "real_model_tools_out"
    with open(real_model_tools.TEMPLATE) as f:
        template = f.read()
    paths = {"train": "t.parquet", "heldout": "h.parquet", "tools": str(tmp_path / "calc.yaml")}
    cfg = load_config("ppo_trainer", real_model_tools.rl_args("m", paths, "run", "vllm", args, template))
    assert cfg.actor_rollout_ref.model.custom_chat_template == template  # the Jinja text arrives unchanged
    assert cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path == paths["tools"]
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 5  # the user's, not the recipe's 3
    assert cfg.actor_rollout_ref.rollout.max_model_len == real_model_tools.PROMPT_LENGTH + args.response_length
    # forwards capped at 64 x (128 + 48) tokens, the single-turn recipe's: 32 x (256 + 96) here in bf16
    micro = cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
    single = load_config("ppo_trainer", real_model.rl_args("m", paths, "run", "vllm", real_model.parse([])))
    bf16 = real_model.precision(args.precision) == "bf16"
    assert micro == (32 if bf16 else 16) and single.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == (
        64 if bf16 else 16
    )
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == micro
    assert real_model.forward_samples(64, 10_000_000) == 1 and real_model.forward_samples(64, 10) == 64


def test_the_tools_recipe_refuses_the_single_turn_warmup_options_by_name(capsys):
    for option in ("--warmup_steps", "--warmup_lr=1e-5"):
        with pytest.raises(SystemExit):
            real_model_tools.parse([option, "3"] if "=" not in option else [option])
        assert option.split("=")[0] in capsys.readouterr().err


def test_well_formed_tool_calls():
    assert real_model_tools.well_formed('{"name": "calc", "arguments": {"expr": "347*82"}}')
    for bad in ('{"name": "calc", "arguments": "347*82"}', '{"name": "calc" "arguments": {}}', '["calc"]', "347*82"):
        assert not real_model_tools.well_formed(bad), bad


@pytest.mark.slow
def test_one_step_on_the_real_model(smollm2_gguf, tmp_path):
    """The whole recipe, tiny: convert, data, eval, one GRPO step through main_ppo, export, eval, JSON."""
    work = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(REPO, "recipes", "real_model.py"),
            "--steps",
            "1",
            "--batch",
            "2",
            "--n",
            "2",
            "--heldout",
            "4",
            "--response_length",
            "8",
            "--test_freq",
            "1",
            "--rollout",
            "hf",
            "--warmup_steps",
            "1",
            "--gguf",
            smollm2_gguf,
            "--workdir",
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, PYTHONPATH=pythonpath_with(REPO), HYBRIDFLOW_CACHE=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(os.listdir(tmp_path / "cache" / "gguf")) >= 1  # the recipe converted through the library's GGUF cache
    result = json.loads((work / "real_model_result.json").read_text())
    assert result["steps"] == 1 and result["heldout_problems"] == 4
    for part in ("", "committed_", "lenient_", "heldout_kind_", "heldout_kind_committed_"):
        for when in ("base", "before", "after"):  # base: before the warm-up
            assert 0.0 <= result[f"{part}accuracy_{when}"] <= 1.0
    questions = {
        n: pd.read_parquet(work / "data" / f"{n}.parquet")["extra_info"].map(lambda e: e["question"])
        for n in ("train", "heldout_kind")
    }
    # the held-out kind (div_add: a share, then an addition) never occurs in training
    assert all(" already has " in q for q in questions["heldout_kind"]) and not any(
        " already has " in q for q in questions["train"]
    )
    assert all(math.isfinite(v) for v in result["phase_seconds"].values())
    assert result["turned_right"] + result["turned_wrong"] <= 4 and len(result["answers_turned_right"]) <= 4


def test_changed_answers_pairs_each_problem_before_and_after():
    def evaluation(*right):
        return {
            "answers": [
                {"response": f"r{i}{x}", "ground_truth": str(i), "committed_right": x} for i, x in enumerate(right)
            ]
        }

    changed = real_model.changed_answers(evaluation(False, True, False, True), evaluation(True, True, False, False))
    assert changed["turned_right"] == 1 and changed["turned_wrong"] == 1
    assert changed["answers_turned_right"] == [{"before": "r0False", "after": "r0True", "ground_truth": "0"}]
    assert changed["answers_turned_wrong"] == [{"before": "r3True", "after": "r3False", "ground_truth": "3"}]
    with pytest.raises(ValueError):  # answers of different problem sets are not compared
        real_model.changed_answers(evaluation(True), evaluation(True, False))
