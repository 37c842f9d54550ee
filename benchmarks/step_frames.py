"""How deep one GRPO step goes: the call frames a reader follows from ``train_step`` to the engine's
decode step and to the policy loss.

    python benchmarks/step_frames.py [--verbose]

One in-process GRPO step on the tiny model (trainer.backend=inprocess, 2 prompts x 2 samples, 4 tokens).
A step crosses threads (the driver waits while the worker group's thread, the agent loop's event loop and
the engine's decode thread run), so a chain is counted per thread and added up, hybridflow's own frames
only (no stdlib, torch or asyncio frames):

- to the decode step: the driver thread from ``train_step`` to its wait, at the moment the engine
  decodes; the agent loop's frames when it sends the request (``HFServer.generate`` is called); the
  engine's frames at the decode step (``HFServer._decode_loop``, plus the request's ``generate``).
- to the loss: the driver thread from ``train_step`` to its wait; the worker's thread from the worker
  group's call to the policy loss function.

The second column leaves out the single controller's own frames (dispatch, execution, waits).
tests/trainer/test_step_frames.py holds the counts below a bound.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

import hybridflow  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(hybridflow.__file__))


def own_frames(frames, start: str | None = None) -> list[str]:
    """hybridflow's frames of a stack (outermost first) as ``module:function``, from the first ``start``."""
    out = []
    for f in frames:
        path = os.path.abspath(f.filename)
        if not path.startswith(PACKAGE + os.sep):
            continue
        out.append(f"{os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, '.')}:{f.name}")
    if start is not None:
        first = next((i for i, name in enumerate(out) if name.endswith(":" + start)), None)
        out = out[first:] if first is not None else []
    return out


def main_thread_frames(timeout_s: float = 5.0) -> list[str]:
    """The driver's frames from ``train_step`` once it waits for the work (the first decode step may
    start while the driver is still handing out the rest of the batch)."""
    deadline = time.monotonic() + timeout_s
    while True:
        frame = sys._current_frames()[threading.main_thread().ident]
        frames = own_frames(traceback.extract_stack(frame), start="train_step")
        if (frames and frames[-1].endswith(":wait_with_deadline")) or time.monotonic() > deadline:
            return frames
        time.sleep(0.001)


def depth(parts: dict[str, list[str]], machinery: bool = True) -> int:
    """Frames of a chain over its threads; ``machinery=False`` leaves out the single controller's
    (dispatch, execution and waits: the same for every worker call)."""
    return sum(1 for frames in parts.values() for f in frames if machinery or not f.startswith("single_controller."))


def measure() -> dict[str, dict[str, list[str]]]:
    from hybridflow.algorithms.policy_loss import POLICY_LOSS_REGISTRY
    from hybridflow.workers.rollout.hf_server import HFServer

    chains: dict[str, dict[str, list[str]]] = {}
    generate, decode_loop = HFServer.generate, HFServer._decode_loop
    loss_fn = POLICY_LOSS_REGISTRY.get("vanilla")

    def recording_generate(self, *args, **kwargs):
        # called (the coroutine created) in the agent loop's thread: its stack is the request's path
        chains.setdefault("decode", {}).setdefault("agent loop", own_frames(traceback.extract_stack()))
        return generate(self, *args, **kwargs)

    def recording_decode_loop(self, loop):
        chain = chains.setdefault("decode", {})
        if "driver" not in chain:
            chain["driver"] = main_thread_frames()
            # the request's coroutine awaits on the engine's loop; the decode loop runs on the engine's thread
            chain["engine"] = ["workers.rollout.hf_server:generate", *own_frames(traceback.extract_stack())]
            chain["engine"].append("workers.rollout.hf_server:_decode_loop")
        return decode_loop(self, loop)

    def recording_loss(*args, **kwargs):
        if "loss" not in chains:
            worker = [*own_frames(traceback.extract_stack()), "algorithms.policy_loss:compute_policy_loss_vanilla"]
            chains["loss"] = {"driver": main_thread_frames(), "worker": worker}
        return loss_fn(*args, **kwargs)

    setup = C.GRPOSetup(prompts=2, n=2, response_length=4, train_size=8)
    HFServer.generate, HFServer._decode_loop = recording_generate, recording_decode_loop
    POLICY_LOSS_REGISTRY._entries["vanilla"] = recording_loss
    try:
        with tempfile.TemporaryDirectory() as root:
            data_dir, model_dir = C.make_assets(root, setup)
            overrides = C.grpo_overrides(data_dir, model_dir, root, setup, "inprocess", 1, steps=1)
            trainer, _ = C.build_trainer([*overrides, "trainer.logger=[]"])
            try:
                trainer.fit()
            finally:
                trainer.shutdown_workers()
    finally:
        HFServer.generate, HFServer._decode_loop = generate, decode_loop
        POLICY_LOSS_REGISTRY._entries["vanilla"] = loss_fn
    return chains


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", action="store_true", help="print every frame")
    args = parser.parse_args()
    C.set_threads(1)
    chains = measure()
    rows = []
    for target, parts in chains.items():
        per_thread = ", ".join(f"{name} {len(frames)}" for name, frames in parts.items())
        rows.append([target, depth(parts), depth(parts, machinery=False), per_thread])
        if args.verbose:
            for name, frames in parts.items():
                print(f"--- {target} / {name}")
                print("\n".join("  " + f for f in frames))
    header = ["to", "frames", "without dispatch", "  per thread"]
    C.print_table("hybridflow frames from train_step", header, rows, [8, 8, 18, 44])


if __name__ == "__main__":
    main()
