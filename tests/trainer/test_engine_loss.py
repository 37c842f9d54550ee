"""A rollout engine killed in the middle of a generation (issue 31.1).

The driver must raise ``RolloutEngineDiedError`` naming the engine, the worker group and rank and the
step within seconds, leave none of the group's processes behind, and a rerun with resume_mode=auto
must continue from the last checkpoint with exactly the prompts an uninterrupted run would have seen.

The unit tests hold the conversion (a request whose engine is gone fails naming it, whatever way the
death surfaced); the end-to-end cases run ``python -m hybridflow.main_ppo`` with the test-only hook
(``freeze_hook/sitecustomize.py``) SIGKILLing the engine's process mid-generation: the hf engine (it runs
in the worker process) colocated with the actor, in a separate rollout pool, and vLLM's EngineCore.
Each is two whole runs (the killed one and the resumed one), minutes on a loaded 2-core machine: slow.
"""

from __future__ import annotations

import asyncio
import importlib.util
import pickle
import re

import psutil
import pytest
import torch

from hybridflow.agent_loop.server_manager import ServerHandle, ServerManager
from hybridflow.main_ppo import EXIT_CODE_WORKER_DIED
from hybridflow.protocol import DataProto
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.server import EngineDeadError, RolloutEngineDiedError, TokenOutput, engine_death_named
from hybridflow.single_controller.base.errors import WorkerDiedError, WorkerError
from tests.trainer.e2e_helpers import base_overrides
from tests.trainer.test_hang_exit_codes import SEPARATE_POOL, _last_error, _run_main_ppo
from tests.trainer.test_worker_loss import _expected_order


class RayActorError(RuntimeError):  # what Ray raises for a call on an actor whose process died (matched by name)
    pass


class DeadHandle(ServerHandle):
    def __init__(self, error):
        self.error = error

    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        raise self.error


class LiveHandle(ServerHandle):
    async def generate(self, prompt_ids, params, request_id, logprobs=True):
        return TokenOutput([1, 2], [0.0, 0.0])


@pytest.mark.parametrize(
    "death",
    [
        RayActorError("The actor died unexpectedly before finishing this task.\n\tpid: 123"),
        EngineDeadError("vLLM's engine core process is gone"),
    ],
    ids=["worker process", "engine process"],
)
def test_a_request_to_a_dead_engine_names_the_engine_group_and_rank(death):
    dead = DeadHandle(death)
    dead.origin = ("vllm", "trainer:actor_rollout", 1)
    manager = ServerManager([LiveHandle(), dead])
    manager.in_flight[0] = 5  # the next trajectory goes to the dead one
    with pytest.raises(RolloutEngineDiedError) as info:
        asyncio.run(manager.generate("train3:7", [5, 6], SamplingParams()))
    err = info.value
    assert isinstance(err, WorkerDiedError)  # main_ppo's dead-worker exit code
    assert (err.engine, err.group, err.rank) == ("vllm", "trainer:actor_rollout", 1)
    text = str(err)
    assert "rollout engine 'vllm' of worker group 'trainer:actor_rollout', rank 1 died" in text, text
    assert "'train3:7/0'" in text and type(death).__name__ in text and str(death).splitlines()[0] in text
    err.step = 3  # the agent loop worker that ran the batch knows the step
    err.add_note("sample 7")
    back = pickle.loads(pickle.dumps(err))  # it crosses from the agent loop worker to the driver
    assert str(back) == str(err) and "at global step 3" in str(back) and back.__notes__ == ["sample 7"]


def test_other_errors_of_a_request_pass_unchanged():
    manager = ServerManager([DeadHandle(ValueError("prompt too long"))])
    with pytest.raises(ValueError, match="prompt too long"):
        asyncio.run(manager.generate("train1:0", [5], SamplingParams()))


def test_the_vllm_server_turns_vllms_engine_death_into_engine_dead_error():
    """vLLM's AsyncLLM raises its own EngineDeadError for every request once its EngineCore process is gone
    (seen 0.1 s after a SIGKILL on CPU); the server raises the rollout interface's, which the handles know."""
    import itertools
    import types

    from hybridflow.workers.rollout.vllm_server import VLLMServer

    class VLLMEngineDeadError(Exception):  # vllm.v1.engine.exceptions.EngineDeadError, matched by name
        pass

    VLLMEngineDeadError.__name__ = "EngineDeadError"

    async def generate(**_):
        raise VLLMEngineDeadError("EngineCore encountered an issue")
        yield

    server = object.__new__(VLLMServer)
    server.__dict__.update(_closed=False, _asleep=set(), _not_real_reason=None, _in_flight=set(), _lora=None)
    server._abort_requested = set()
    server._update_done, server._ids = asyncio.Event(), itertools.count()
    server._update_done.set()
    server.settings = types.SimpleNamespace(max_model_len=64)
    server._sampling_params = lambda *a, **k: None
    server.engine = types.SimpleNamespace(generate=generate)
    with pytest.raises(EngineDeadError, match="engine core process is gone"):
        asyncio.run(server.generate([5, 6], SamplingParams(), "train1:0"))
    assert not server._in_flight


class EngineGoneGroup:
    """A colocated rollout group whose rank 1 finds its engine dead at ``failing`` (the worker's error as the
    backend hands it over: the traceback as text, the original exception as ``cause``)."""

    name = "trainer:actor_rollout"

    def __init__(self, failing: str, cause: BaseException):
        self.failing, self.cause = failing, cause

    def _call(self, method, result):
        if method == self.failing:
            raise WorkerError(self.name, f"actor_rollout_{method}", 1, f"Traceback ...\n{self.cause}", cause=self.cause)
        return result

    def prepare_rollout(self, version):
        return self._call("prepare_rollout", [{"timing_s/update_weights": 0.5}, {}])

    def release_rollout(self):
        return self._call("release_rollout", [None, None])


def _colocated_manager(group):
    from hybridflow.agent_loop.manager import AgentLoopManager

    manager = object.__new__(AgentLoopManager)
    manager.__dict__.update(rollout_wg=group, engine="vllm", hybrid_engine=True)
    manager._run_workers = lambda prompts: [DataProto.from_dict(tensors={"ids": torch.zeros(2, 3)})]
    return manager


@pytest.mark.parametrize(
    "failing, during",
    [
        ("prepare_rollout", "prepare_rollout (waking it and loading the new weights)"),
        ("release_rollout", "release_rollout (putting it to sleep)"),
    ],
)
@pytest.mark.parametrize("validate", [False, True])
def test_an_engine_found_dead_between_generations_names_it_the_step_and_what_ran(failing, during, validate):
    """vLLM's EngineCore killed while the actor trained: the next call that touches the engine (the weight
    push, the sleep) fails in the worker; the driver names the engine, rank and step as for a death
    mid-generation (main_ppo's dead-worker exit code), and says what was running."""
    cause = EngineDeadError("vLLM's engine core process is gone (EngineCore encountered an issue)")
    manager = _colocated_manager(EngineGoneGroup(failing, cause))
    prompts = DataProto.from_dict(
        tensors={"ids": torch.zeros(2, 3)}, meta_info={"global_steps": 2, "validate": validate}
    )
    with pytest.raises(RolloutEngineDiedError) as info:
        manager.generate_sequences(prompts)
    err = info.value
    assert isinstance(err, WorkerDiedError) and (err.engine, err.group, err.rank) == ("vllm", EngineGoneGroup.name, 1)
    text = str(pickle.loads(pickle.dumps(err)))
    step = "2 (validation)" if validate else "2"
    assert f"rollout engine 'vllm' of worker group {EngineGoneGroup.name!r}, rank 1 died during {during}" in text, text
    assert f"at global step {step} " in text and "EngineDeadError: vLLM's engine core process is gone" in text, text
    assert "generation" not in text, text


def test_other_failures_between_generations_pass_unchanged():
    manager = _colocated_manager(EngineGoneGroup("prepare_rollout", ValueError("bad bucket")))
    prompts = DataProto.from_dict(tensors={"ids": torch.zeros(2, 3)}, meta_info={"global_steps": 2})
    with pytest.raises(WorkerError) as info:
        manager.generate_sequences(prompts)
    assert type(info.value) is WorkerError and isinstance(info.value.cause, ValueError)


def test_a_separate_pools_weight_push_names_the_rollout_rank_whose_engine_died():
    """The trainer's rank 0 pushes to the rollout workers: the error names the receiver, not the sender."""
    from hybridflow.workers.rollout.weight_transfer import LocalWeightTarget, push_weights

    class Receiver:
        def receive_weights(self, bucket):
            raise EngineDeadError("vLLM's engine core process is gone")

    class Alive:
        def receive_weights(self, bucket):
            return len(bucket)

    targets = [LocalWeightTarget(Alive(), rank=0), LocalWeightTarget(Receiver(), rank=1)]
    for target in targets:
        target.group = "trainer:rollout"
    weights = [("w", torch.zeros(4))]
    with pytest.raises(RolloutEngineDiedError) as info:
        with engine_death_named("vllm", "the weight push (version 3) to the separate rollout pool", 3):
            try:  # what the in-process backend does with the sending rank's error
                push_weights(weights, targets, version=3, bucket_bytes=1 << 20)
            except Exception as e:
                raise WorkerError("trainer:actor_rollout", "actor_rollout_send_weights", 0, str(e), cause=e) from e
    err = info.value
    assert (err.group, err.rank, err.step) == ("trainer:rollout", 1, 3), str(err)
    assert "died during the weight push (version 3) to the separate rollout pool at global step 3" in str(err)


def test_the_vllm_server_names_an_engine_death_met_by_a_weight_update():
    import types

    from hybridflow.workers.rollout.vllm_server import VLLMServer
    from hybridflow.workers.rollout.vllm_weights import BucketFiles

    class VLLMEngineDeadError(Exception):  # vllm.v1.engine.exceptions.EngineDeadError, matched by name
        pass

    VLLMEngineDeadError.__name__ = "EngineDeadError"

    async def collective_rpc(*_, **__):
        raise VLLMEngineDeadError("EngineCore encountered an issue")

    server = object.__new__(VLLMServer)
    server.__dict__.update(_closed=False, _asleep=set(), _in_flight=set(), _updating=False, _update_started=False)
    server.__dict__.update(_pending_adapter=[], _not_real_reason=None, _update_done=asyncio.Event())
    server._bucket_files = BucketFiles()
    server._tied = types.SimpleNamespace(start_update=lambda: None, expand=lambda name, t: [(name, t)])
    server.engine = types.SimpleNamespace(collective_rpc=collective_rpc)
    with pytest.raises(EngineDeadError, match="engine core process is gone"):
        asyncio.run(server.load_weights([("model.w", torch.zeros(2))]))
    assert not server._updating and server._not_real_reason  # the half-done update is refused afterwards


# ------------------------------------------------------------------------------------------ end to end
KILL = re.compile(r"\[freeze hook\] killed pid (\d+) \((.*?)\) of rank (\d+) .* at ([\d.]+); processes \[(.*?)\]")
RAISED = re.compile(r"\[freeze hook\] generate raised (\w+) at ([\d.]+)")
STEP = re.compile(r"\[freeze hook\] step (\d+) prompts \[(.*?)\]")
VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.load_format=auto",
    "actor_rollout_ref.rollout.dtype=float32",
]
NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def _steps(stderr: str) -> dict[int, list[int]]:
    return {int(s): [int(i) for i in ids.split(", ")] for s, ids in STEP.findall(stderr)}


def _two_step_overrides(tiny_model_dir, tiny_data_dir, tmp_path, extra):
    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, steps=2, world=2, response_length=64, backend="ray"
    )
    return [o for o in overrides if not o.startswith("trainer.save_freq=")] + [
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.logger=['console']",
        "actor_rollout_ref.rollout.ignore_eos=True",  # every trajectory runs its 64 tokens
        "ray_kwargs.ray_init.num_cpus=4",
        *extra,
    ]


def _assert_none_left(killed: re.Match) -> None:
    pids = [int(p) for p in killed.group(5).split(", ") if p]
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=15)
    left = [(p.pid, p.name()) for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes of the killed group left behind: {left}"


@pytest.mark.parametrize(
    "engine, extra, rank, victim, action",
    [
        pytest.param("hf", [], 1, "ray::", "kill_engine", id="hf-colocated", marks=pytest.mark.slow),
        pytest.param("hf", SEPARATE_POOL, 0, "ray::", "kill_engine", id="hf-separate-pool", marks=pytest.mark.slow),
        pytest.param(
            "vllm", VLLM, 1, "VLLM::Engine", "kill_engine", id="vllm-colocated", marks=[pytest.mark.slow, NEEDS_VLLM]
        ),
        # the worker that hosts vLLM's engine: its EngineCore and VLLM::Worker must not outlive it
        pytest.param("vllm", VLLM, 1, "ray::", "kill", id="vllm-worker-killed", marks=[pytest.mark.slow, NEEDS_VLLM]),
        pytest.param(
            "vllm",
            VLLM + SEPARATE_POOL,
            0,
            "VLLM::Engine",
            "kill_engine",
            id="vllm-separate",
            marks=[pytest.mark.slow, NEEDS_VLLM],
        ),
    ],
)
def test_an_engine_killed_mid_generation_stops_the_run_and_resume_loses_no_prompt(
    engine, extra, rank, victim, action, tiny_model_dir, tiny_data_dir, tiny_tokenizer, tmp_path
):
    from hybridflow.config.loader import load_config

    overrides = _two_step_overrides(tiny_model_dir, tiny_data_dir, tmp_path, extra)
    # the second generation (step 2), 0.2 s after it started: well before its 64-token trajectories end
    proc = _run_main_ppo(overrides, f"generate#2@{rank}:{action}+0.2", timeout=900)
    killed, raised = KILL.search(proc.stderr), RAISED.search(proc.stderr)
    assert killed and raised, proc.stderr[-6000:]
    assert victim in killed.group(2) and int(killed.group(3)) == rank, killed.group(0)
    noticed = float(raised.group(2)) - float(killed.group(4))
    print(f"{engine}: the driver raised {noticed:.2f} s after the kill")
    assert raised.group(1) == "RolloutEngineDiedError" and 0 < noticed < 10.0, (raised.group(0), noticed)
    assert proc.returncode == EXIT_CODE_WORKER_DIED, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    first = _last_error(proc.stderr, "RolloutEngineDiedError").splitlines()[0]
    assert f"rollout engine {engine!r} of worker group" in first and f"rank {rank} died" in first, first
    assert "at global step 2" in first, first
    _assert_none_left(killed)

    first_run = _steps(proc.stderr)
    proc = _run_main_ppo(overrides, "none@0", timeout=900)  # resume_mode=auto (the default); no phase named none
    assert proc.returncode == 0, proc.stderr[-6000:]
    second_run = _steps(proc.stderr)
    expected = _expected_order(load_config("ppo_trainer", overrides), tiny_tokenizer, steps=2)
    assert sorted(second_run) == [2], second_run  # resumed from step 1's checkpoint
    assert [first_run[1], second_run[2]] == expected  # nothing lost, nothing repeated


@pytest.mark.slow
@NEEDS_VLLM
def test_a_vllm_engine_killed_between_generations_stops_the_run_at_the_next_weight_push(
    tiny_model_dir, tiny_data_dir, tmp_path
):
    """EngineCore SIGKILLed while step 1's actor trains (colocated): step 2's weight push meets the dead
    engine; the run ends as for a death mid-generation, saying it was the weight push."""
    overrides = _two_step_overrides(tiny_model_dir, tiny_data_dir, tmp_path, VLLM)
    proc = _run_main_ppo(overrides, "update_actor#1@1:kill_engine", timeout=900)
    killed = KILL.search(proc.stderr)
    assert killed and "VLLM::Engine" in killed.group(2) and int(killed.group(3)) == 1, proc.stderr[-6000:]
    assert proc.returncode == EXIT_CODE_WORKER_DIED, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    first = _last_error(proc.stderr, "RolloutEngineDiedError").splitlines()[0]
    assert "rollout engine 'vllm' of worker group" in first and "rank 1 died during prepare_rollout" in first, first
    assert "at global step 2" in first and "EngineDeadError" in first, first
    _assert_none_left(killed)
