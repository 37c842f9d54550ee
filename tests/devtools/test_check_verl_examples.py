"""The example checker reads veRL scripts the way bash would expand them (without running them) and
sorts each main_ppo command line into OK / REFUSED / ERROR."""

import json
import os
import textwrap

import pytest

from hybridflow.devtools.check_verl_examples import (
    Result,
    check_examples,
    find_commands,
    judge_with_verl,
    main,
    summary,
)
from hybridflow.devtools.shell_words import ShellReader
from hybridflow.devtools.verl_reference import split_args


def _words(script: str, **kw) -> list[list[str]]:
    return [c.words for c in ShellReader(textwrap.dedent(script), **kw).commands()]


def test_variables_arrays_and_quotes_expand_as_in_bash():
    words = _words(
        """
        A=${A:-x}                      # a default
        B="a b"
        ARR=(one "two three"
             four)                     # an array over two lines
        S="
          k1=$A \\
          k2=2"
        T="${S//k2/K2}"
        python -m m "${ARR[@]}" $B "$B" "$@" ${@:1} $T $UNKNOWN $((2*3)) 2>&1 | tee log
    """,
        cwd="/repo",
    )
    # "${ARR[@]}": one word per element; $B unquoted splits, "$B" does not; "$@" and ${@:1} give nothing;
    # an unset variable becomes a marker; arithmetic is evaluated; | starts the next command
    assert words == [
        [
            "python",
            "-m",
            "m",
            "one",
            "two three",
            "four",
            "a",
            "b",
            "a b",
            "k1=x",
            "K2=2",
            "UNSET_UNKNOWN",
            "6",
            "2>&1",
        ],
        ["tee", "log"],
    ]


def test_if_follows_the_branch_whose_test_holds():
    script = """
        backend=fsdp
        if [[ $backend == "megatron" ]]; then
            EXTRA="actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"
        elif [ "$backend" = fsdp ]; then
            EXTRA="actor_rollout_ref.actor.fsdp_config.param_offload=True"
        else
            EXTRA="x=1"
        fi
        run $EXTRA
    """
    assert _words(script) == [["run", "actor_rollout_ref.actor.fsdp_config.param_offload=True"]]


def test_script_location_idioms_and_the_working_directory(tmp_path):
    script = 'HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)\nROOT=$(pwd)\nrun "$HERE" "$ROOT" "$HOME"\n'
    assert _words(script, script_dir="/repo/examples/x", cwd="/repo") == [["run", "/repo/examples/x", "/repo", "/root"]]


def _examples(tmp_path):
    ex = tmp_path / "verl" / "examples"
    (ex / "grpo").mkdir(parents=True)
    (ex / "grpo" / "run_ok.sh").write_text(
        textwrap.dedent("""\
        set -x
        train=$HOME/data/gsm8k/train.parquet
        NNODES=${NNODES:-1}
        ARGS=(
            data.train_batch_size=16   # prompts per step
            actor_rollout_ref.rollout.n=4
        )
        python3 -m verl.trainer.main_ppo \\
            algorithm.adv_estimator=grpo \\
            data.train_files="['$train']" \\
            "${ARGS[@]}" \\
            trainer.nnodes=$NNODES \\
            trainer.n_gpus_per_node=$GPUS_PER_NODE \\
            actor_rollout_ref.actor.entropy_coeff=0.001 \\
            trainer.total_epochs=2 $@ 2>&1 | tee log.txt
        """)
    )
    (ex / "grpo" / "run_sglang.sh").write_text(
        "python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=sglang\n"
    )
    (ex / "grpo" / "run_typo.sh").write_text("python3 -m verl.trainer.main_ppo data.train_batch_sizee=3\n")
    (ex / "grpo" / "prepare.sh").write_text("python3 examples/data_preprocess/gsm8k.py\n")  # no main_ppo: skipped
    (ex / "mega").mkdir()
    (ex / "mega" / "run.sh").write_text(
        "python3 -m verl.trainer.main_ppo --config-path=config --config-name='ppo_megatron_trainer' trainer.nnodes=1\n"
    )
    (ex / "multiturn" / "config").mkdir(parents=True)
    (ex / "multiturn" / "config" / "mt_grpo.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "actor_rollout_ref:\n  rollout:\n    multi_turn:\n      enable: true\n"
    )
    (ex / "multiturn" / "run.sh").write_text(
        'PROJECT_DIR="$(pwd)"\npython3 -m verl.trainer.main_ppo --config-path="$PROJECT_DIR/examples/multiturn/config" '
        "--config-name='mt_grpo' data.train_batch_size=8\n"
    )
    return ex


def test_verdicts_of_example_command_lines(tmp_path):
    ex = _examples(tmp_path)
    lines, args = find_commands(ex / "grpo" / "run_ok.sh", cwd=ex.parent)[0]
    assert lines == 8
    assert "data.train_files=['/root/data/gsm8k/train.parquet']" in args and "trainer.nnodes=1" in args
    assert "data.train_batch_size=16" in args and "2>&1" not in args

    results = {r.script: r for r in check_examples(ex)}
    assert set(results) == {
        "grpo/run_ok.sh",
        "grpo/run_sglang.sh",
        "grpo/run_typo.sh",
        "mega/run.sh",
        "multiturn/run.sh",
    }
    ok = results["grpo/run_ok.sh"]
    assert ok.verdict == "OK", ok.message
    # $GPUS_PER_NODE is never set: the override is left out, so the key keeps hybridflow's default
    assert not any(a.startswith("trainer.n_gpus_per_node") for a in ok.args)
    assert results["grpo/run_sglang.sh"].verdict == "REFUSED"
    assert "actor_rollout_ref.rollout.name='sglang' is not supported" in results["grpo/run_sglang.sh"].message
    assert results["grpo/run_typo.sh"].verdict == "ERROR"
    assert "Did you mean: data.train_batch_size" in results["grpo/run_typo.sh"].message
    assert results["mega/run.sh"].verdict == "REFUSED" and "Megatron" in results["mega/run.sh"].message
    multi = results["multiturn/run.sh"]
    assert multi.verdict == "OK", multi.message  # a user yaml extending ppo_trainer, multi-turn on: honoured


def test_command_line_summary(tmp_path, capsys):
    ex = _examples(tmp_path)
    assert main([str(ex), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "5 main_ppo command lines in 5 files: 2 OK, 2 REFUSED, 1 ERROR" in out
    assert len(json.loads((tmp_path / "r.json").read_text())) == 5


# --- the example goal: keys honoured since, refusals that name what is missing -------------------------
def test_newly_honoured_keys_compose_and_kept_refusals_name_the_missing_backend(tmp_path):
    ex = tmp_path / "verl" / "examples"
    (ex / "goal" / "config").mkdir(parents=True)
    # a user yaml over ppo_trainer carrying a chat template, as veRL's geo3k multi-turn configs do
    (ex / "goal" / "config" / "templated.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
        "actor_rollout_ref:\n  model:\n    custom_chat_template: "
        "\"{% for m in messages %}{{ m['content'] }}{% endfor %}\"\n"
    )
    run = "python3 -m verl.trainer.main_ppo"
    scripts = {
        "hsdp.sh": f"{run} actor_rollout_ref.actor.fsdp_config.fsdp_size=2 actor_rollout_ref.ref.fsdp_config.fsdp_size=2 "  # noqa: E501
        "critic.model.fsdp_config.fsdp_size=4",
        "template.sh": f'{run} --config-path="$(pwd)/examples/goal/config" --config-name=templated',
        "npu.sh": f"{run} trainer.device=npu",
        "npu_prof.sh": f"{run} actor_rollout_ref.actor.profiler.tool_config.npu.contents=['npu','cpu']",
        "sglang.sh": f"{run} actor_rollout_ref.rollout.name=sglang",
        "trtllm.sh": f"{run} actor_rollout_ref.rollout.name=trtllm",
        "vlm.sh": f"{run} actor_rollout_ref.actor.freeze_vision_tower=True",
        "mega.sh": f"{run} --config-path=config --config-name=ppo_megatron_trainer.yaml",
    }
    for name, text in scripts.items():
        (ex / "goal" / name).write_text(text + "\n")
    results = {r.script.removeprefix("goal/"): r for r in check_examples(ex)}
    assert results["hsdp.sh"].verdict == "OK", results["hsdp.sh"].message
    assert results["template.sh"].verdict == "OK", results["template.sh"].message
    named = {
        "npu.sh": "Ascend NPU",
        "npu_prof.sh": "Ascend NPU",
        "sglang.sh": "SGLang",
        "trtllm.sh": "TensorRT-LLM",
        "vlm.sh": "vision-language",
        "mega.sh": "Megatron",
    }
    for script, name in named.items():
        assert results[script].verdict == "REFUSED" and name in results[script].message, (
            script,
            results[script].message,
        )


def test_summary_counts_against_the_lines_verl_accepts():
    def result(verdict, verl, message="", verl_message=""):
        return Result("s.sh", 1, verdict, message, [], verl, verl_message)

    sglang = "error:\n  actor_rollout_ref.rollout.name='sglang' is not supported by hybridflow: SGLang ..."
    results = [
        result("OK", "ACCEPTS"),
        result("OK", "REJECTS", verl_message="ConfigCompositionException: x"),
        result("REFUSED", "ACCEPTS", sglang),
        result("REFUSED", "REJECTS", sglang, "ValueError: y"),
        result("ERROR", "ACCEPTS", "error: invalid overrides:\n  unknown config key 'a.b'"),
    ]
    lines = summary(results)
    assert lines[0] == "5 main_ppo command lines in 1 files: 2 OK, 2 REFUSED, 1 ERROR"
    # veRL accepts lines 1, 3 and 5; of those only the first composes in hybridflow
    assert lines[1] == "veRL accepts 3 of 5; hybridflow composes 1 of the 3 that veRL accepts"
    assert "  veRL rejects (1): ConfigCompositionException: x" in lines
    # the refusal keys are counted among the lines veRL accepts only (one sglang line, not two)
    assert "keys that refused (among those veRL accepts), most often first: actor_rollout_ref.rollout.name (1)" in lines
    assert "  ERROR (1): unknown config key 'a.b'" in lines


def test_verl_reference_reads_hydras_command_line_flags():
    assert split_args(["--config-path=config", "--config-name", "ppo_megatron_trainer.yaml", "a=1", "+b=2"]) == (
        "config",
        "ppo_megatron_trainer.yaml",
        ["a=1", "+b=2"],
    )
    assert split_args(["-cp", "/abs", "-cn='x'", "c=3"]) == ("/abs", "x", ["c=3"])
    assert split_args(["a=1"]) == (None, None, ["a=1"])


VERL_PYTHON = os.environ.get("HYBRIDFLOW_VERL_PYTHON", "/work/verl_venv/bin/python")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(VERL_PYTHON), reason="needs an interpreter with verl installed")
def test_verl_judges_with_its_own_config():
    # veRL wants the micro-batch sizes set (null by default) and a mini-batch within the batch
    base = [
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    ]
    verdicts = judge_with_verl(
        [
            base + ["data.train_batch_size=16"],
            base + ["data.train_batch_sizee=16"],  # not a veRL key
            base
            + ["data.train_batch_size=3"],  # 3 prompts x 1 sample over veRL's default 8 GPUs: validate_config refuses
            ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml"] + base,  # relative to verl/trainer/
        ],
        VERL_PYTHON,
    )
    assert [accepted for accepted, _ in verdicts] == [True, False, False, True]
    assert "data.train_batch_sizee" in verdicts[1][1] and "real_train_batch_size (3)" in verdicts[2][1]


def test_sft_and_generation_server_lines_compose_into_their_configs(tmp_path, capsys):
    ex = tmp_path / "verl" / "examples"
    (ex / "sft").mkdir(parents=True)
    torchrun = "torchrun --standalone --nnodes=1 --nproc_per_node=2 -m verl.trainer.sft_trainer"
    (ex / "sft" / "run_fsdp.sh").write_text(
        f"{torchrun} data.train_files=$HOME/data/train.parquet data.messages_key=messages engine=fsdp optim.lr=1e-4 "
        "engine.ulysses_sequence_parallel_size=2 trainer.logger='[\"console\"]'\n"
    )
    (ex / "sft" / "run_megatron.sh").write_text(f"{torchrun} engine=megatron optim=megatron\n")
    (ex / "gen").mkdir()
    (ex / "gen" / "run.sh").write_text(
        "python3 -m verl.trainer.main_generation_server data.train_files=$HOME/t.parquet "
        "+data.output_path=$HOME/o.parquet actor_rollout_ref.rollout.n=4\n"
    )
    results = {r.script: r for r in check_examples(ex)}
    assert results["sft/run_fsdp.sh"].entry == "sft_trainer" and results["sft/run_fsdp.sh"].verdict == "OK", results
    megatron = results["sft/run_megatron.sh"]
    assert megatron.verdict == "REFUSED" and "'engine=megatron' is not supported" in megatron.message
    generation = results["gen/run.sh"]
    assert generation.entry == "main_generation_server" and generation.verdict == "OK", generation.message
    assert main([str(ex)]) == 0
    out = capsys.readouterr().out
    assert "2 sft_trainer command lines in 2 files: 1 OK, 1 REFUSED, 0 ERROR" in out
    assert "1 main_generation_server command lines in 1 files: 1 OK, 0 REFUSED, 0 ERROR" in out
