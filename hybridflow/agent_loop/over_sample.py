"""``rollout.over_sample_rate``: start every trajectory of a training batch, keep the first to finish.

Once ``int(N * (1 - over_sample_rate))`` (at least 1) of the N trajectories of one ``generate_sequences`` call have
finished, the rest are cut: the agent loop workers stop sending their requests, the engines abort the
ones in flight, and each cut trajectory becomes a padding sample. The batch keeps its N rows, so
nothing downstream changes shape; a padding sample has its prompt, an empty response (pad ids,
``response_mask`` and response attention 0, no log-probs) and counts for nothing in the loss.

This is what veRL's SGLang rollout did with the key (veRL <= 0.5, ``_create_padding_request``:
training batches only, validation untouched; veRL 0.9.1 still declares the key but no code reads it).
One difference: veRL also zeroed the padding sample's prompt attention, leaving a row that attends to
nothing; here the prompt stays visible (a row with no visible token makes padded attention produce
NaN), which changes nothing that is trained, since the response mask is 0.

The cut is counted over the whole batch, not per worker: the driver polls the workers' counts
(``OverSampleMonitor``) and, once the target is met, cuts every worker and aborts every engine (the
engines serve this batch only; streaming asynchronous training refuses the key). Trajectories that
finish between the target and the cut are kept, so at least the target is kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hybridflow.agent_loop.base import AgentLoopOutput

logger = logging.getLogger(__name__)

OVER_SAMPLE_ID = "over_sample_id"  # meta_info key: names one over-sampled call to its workers
ABORTED_METRIC = "agent/over_sample/aborted"  # trajectories cut in one call (summed over the workers)
POLL_S = 0.05  # how often the driver reads the workers' counts


def over_sample_target(n: int, rate: float) -> int:
    """Trajectories to keep out of ``n``: veRL's ``int(total * (1 - over_sample_rate))``, at least one (veRL
    waited for a first trajectory before it checked the target)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"actor_rollout_ref.rollout.over_sample_rate must be in [0, 1), got {rate}")
    return min(n, max(1, int(n * (1.0 - rate))))


class TrajectoryAborted(Exception):
    """Raised into an agent loop whose trajectory was cut: it ends at its next (or current) request."""


def padding_output(prompt_ids: list[int], with_logprobs: bool) -> AgentLoopOutput:
    """The sample a cut trajectory leaves: its prompt, no response (so the loss ignores it)."""
    return AgentLoopOutput(
        prompt_ids=list(prompt_ids),
        response_ids=[],
        response_mask=[],
        response_logprobs=[] if with_logprobs else None,
        num_turns=0,
    )


class CutServer:
    """What a loop of an over-sampled call sees as its server manager: requests of a cut call are
    not sent, and a request that comes back after the cut (aborted by the engine, or just finished)
    ends the trajectory. Everything else is the wrapped manager's."""

    def __init__(self, server_manager, is_cut: Callable[[], bool]):
        self._inner = server_manager
        self._is_cut = is_cut

    async def generate(self, request_id, prompt_ids, sampling_params):
        if self._is_cut():
            raise TrajectoryAborted(request_id)
        out = await self._inner.generate(request_id, prompt_ids, sampling_params)
        if self._is_cut():  # the workers are cut before the engines abort: every aborted request lands here
            raise TrajectoryAborted(request_id)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


class OverSampleMonitor:
    """A driver thread that cuts one call once its workers report ``target`` finished trajectories.

    ``progress()`` -> trajectories kept so far; ``cut()`` tells the workers and aborts the engines.
    ``stop()`` (when the call returned) ends the thread and re-raises what went wrong in it.
    """

    def __init__(self, target: int, progress: Callable[[], int], cut: Callable[[], None]):
        self.target, self._progress, self._cut = target, progress, cut
        self.cut_done = False
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="hybridflow-over-sample", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                try:
                    done = self._progress()
                except TimeoutError:  # a busy worker: read again at the next poll
                    continue
                if done >= self.target:
                    logger.info(
                        "over_sample_rate: %d trajectories finished (target %d): cutting the rest", done, self.target
                    )
                    self._cut()
                    self.cut_done = True
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by stop()
            self._error = e

    def stop(self, reraise: bool = True) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None and reraise:
            raise RuntimeError("rollout.over_sample_rate: cutting the slow trajectories failed") from self._error
