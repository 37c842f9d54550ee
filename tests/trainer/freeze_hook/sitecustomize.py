"""Test-only: freeze one worker of a ``python -m hybridflow.main_ppo`` run at a named phase.

On PYTHONPATH with ``HYBRIDFLOW_TEST_FREEZE=<phase>[#<n>]@<rank>[:kill]`` set, Python imports this file
at start-up in every process of the run; it patches the driver only (the process running main_ppo.py):
the ``n``-th time (default: first) the driver calls ``<phase>`` on a worker group (a registered method
such as ``update_actor``, matched by the end of its remote name) or, for ``generate``, right after the
engines were prepared for a generation, rank ``<rank>`` of that group is frozen before the call:

- Ray: the worker process gets SIGSTOP (``:kill``: SIGKILL, a dead worker);
- in-process: the group's thread (``generate``: the rollout engine's event loop) is given a job that
  never ends.

``:kill_engine`` SIGKILLs the rollout engine's own process instead: vLLM's ``VLLM::EngineCore`` under the
worker (or under the driver, in process), else the worker process itself (the hf engine runs in it).
``+<seconds>`` (after ``kill`` or ``kill_engine``) kills that long after the call started, from a
thread: mid-generation. The hook prints the kill's and the generation error's ``time.monotonic()``
(one clock for every process of the machine), the killed group's processes (workers and their
children) and, per training step, the prompt ids the driver trained on.

So the library's own waits meet a real hang; nothing in hybridflow knows about this file.
"""

import importlib.abc
import os
import signal
import sys
import threading
import time

SPEC = os.environ.get("HYBRIDFLOW_TEST_FREEZE")
_seen = 0  # calls of the phase so far


def _is_driver() -> bool:
    return os.path.basename(sys.argv[0] if sys.argv else "") == "main_ppo.py"


def _phase() -> str:
    return SPEC.split("@")[0].split("#")[0]


def _wanted(method: str) -> bool:
    return method == _phase() or method.endswith("_" + _phase())


def _freeze(group, what: str, engines: bool = False) -> None:
    global _seen
    if not _is_driver():
        return
    _seen += 1
    nth = SPEC.split("@")[0].partition("#")[2]
    if _seen != int(nth or 1):
        return
    rank_part = SPEC.split("@")[1]
    rank, _, action = rank_part.partition(":")
    rank = int(rank)
    action, _, delay = action.partition("+")
    if action == "kill_engine" or delay:
        threading.Thread(target=_kill_later, args=(group, rank, action, float(delay or 0)), daemon=True).start()
        return
    if hasattr(group, "_host"):  # in-process: the worker is this process; occupy its thread for good
        if engines:
            worker = group.workers[rank]
            loops = [
                getattr(getattr(role, "rollout_host", None), "engine_loop", None)  # the host is a member
                for role in getattr(worker, "_roles", {"": worker}).values()
            ]
            loops = [loop for loop in loops if loop is not None]
            if not loops:  # a hook that freezes nothing would let the test pass for the wrong reason
                raise RuntimeError(f"freeze hook: no rollout engine loop on rank {rank} of {group.name!r}")
            for loop in loops:
                loop.loop.call_soon_threadsafe(threading.Event().wait)
        else:
            group._host.thread.submit(threading.Event().wait)
        how = "blocked"
    else:
        pid = group._locations[rank].pid
        os.kill(pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        how = "killed" if action == "kill" else "stopped"
    print(f"[freeze hook] {how} rank {rank} of worker group {group.name!r} before {what}", file=sys.stderr, flush=True)


def _kill_later(group, rank: int, action: str, delay: float) -> None:
    import psutil

    time.sleep(delay)
    worker = psutil.Process(os.getpid() if hasattr(group, "_host") else group._locations[rank].pid)
    processes = [worker, *worker.children(recursive=True)]
    cores = [p for p in processes if "EngineCore" in p.name()]
    victim = cores[0] if cores and action == "kill_engine" else worker
    if action == "kill_engine" and victim.pid == os.getpid():
        raise RuntimeError("freeze hook: no engine process to kill in the driver")  # would kill the test's run
    pids = [p.pid for p in processes if p.pid != os.getpid()]
    victim.kill()
    print(
        f"[freeze hook] killed pid {victim.pid} ({victim.name()}) of rank {rank} of worker group {group.name!r} "
        f"at {time.monotonic():.3f}; processes {pids}",
        file=sys.stderr,
        flush=True,
    )


def _patch_worker_group(module) -> None:
    original = module.WorkerGroup._call

    def _call(self, method, ranks, per_args, per_kwargs):
        if _wanted(method):
            _freeze(self, method)
        return original(self, method, ranks, per_args, per_kwargs)

    module.WorkerGroup._call = _call


def _patch_manager(module) -> None:
    original = module.AgentLoopManager._run_workers

    def _run_workers(self, prompts):
        if _phase() == "generate":
            _freeze(self.rollout_wg, "generate", engines=True)
        try:
            return original(self, prompts)
        except BaseException as e:
            print(
                f"[freeze hook] generate raised {type(e).__name__} at {time.monotonic():.3f}",
                file=sys.stderr,
                flush=True,
            )
            raise

    module.AgentLoopManager._run_workers = _run_workers


def _patch_trainer(module) -> None:
    original = module.RayPPOTrainer.train_step

    def train_step(self, batch):
        if _is_driver():
            ids = [int(i) for i in batch.non_tensor_batch["index"]]
            print(f"[freeze hook] step {self.global_steps} prompts {ids}", file=sys.stderr, flush=True)
        return original(self, batch)

    module.RayPPOTrainer.train_step = train_step


PATCHES = {
    "hybridflow.single_controller.base.worker_group": _patch_worker_group,
    "hybridflow.agent_loop.manager": _patch_manager,
    "hybridflow.trainer.ppo.ray_trainer": _patch_trainer,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds the modules above with the other finders and patches them once they are executed."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


if SPEC:
    sys.meta_path.insert(0, _PatchAfterImport())
