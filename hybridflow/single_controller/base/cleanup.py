"""Cleanup that runs while an error is on its way to the user.

After a failure the driver still tidies up (release the engines, resume held requests, stop the
rollout servers). Those calls must not replace the failure: a group the watchdog already shut down is
skipped (a call on it would only raise ``WorkerGroupShutDownError``), and whatever a cleanup call on a
live group raises is logged and dropped, so the first error is the one the user sees.
"""

from __future__ import annotations

import logging

from hybridflow.single_controller.base.worker_group import WorkerGroup

logger = logging.getLogger(__name__)


def is_shut_down(group) -> bool:
    """True for a worker group that was shut down; False for a live one, None, or any other object."""
    return bool(getattr(group, "is_shut_down", False))


# how long a cleanup call may still run on the live ranks after it failed on a dead one (stopping a vLLM
# engine takes a few seconds)
SETTLE_S = 20.0


def cleanup_after_failure(target, method: str, *args, **kwargs) -> None:
    """``target.<method>(*args, **kwargs)``, a cleanup step (``target``: a worker group, or a driver-side
    object such as the agent loop manager) while another error propagates: skipped when ``target`` is
    None or a shut-down group; an exception it raises is logged (WARNING) and dropped. When it failed on
    a dead rank, the live ranks still running it get up to ``SETTLE_S`` to finish (``settle_unfinished``)
    before the caller goes on to kill them."""
    if target is None or is_shut_down(target):
        return
    try:
        getattr(target, method)(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the error being handled is the one to report
        first_line = (str(e).splitlines() or [""])[0]
        logger.warning(
            "cleanup %s() after an earlier failure failed too (ignored): %s: %s", method, type(e).__name__, first_line
        )
        if isinstance(target, WorkerGroup) and not target.settle_unfinished(SETTLE_S):
            logger.warning(
                "cleanup %s() still ran on live ranks after %.0f s; they are killed with it", method, SETTLE_S
            )
