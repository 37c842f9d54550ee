"""SIGTERM ends the test run within seconds, with every teardown run (the shared Ray session stops).

pytest's own reaction to SIGTERM is the default one (the process dies: no teardown, Ray's processes
survive), and once Ray is up it is Ray's handler, ``sys.exit``, whose SystemExit pytest reports as one
failed test and then goes on with the next. This plugin (registered by tests/conftest.py; ``-p graceful_stop``
elsewhere) turns SIGTERM
into KeyboardInterrupt, which pytest treats as the end of the session: it stops, runs the session's
teardowns and exits. Ray replaces the handler when the session fixture starts it; the plugin puts its
own back right after any fixture setup that did that.
"""

from __future__ import annotations

import signal

import pytest

_previous = None


def _stop_the_run(signum, frame):
    raise KeyboardInterrupt("SIGTERM: the test run stops (teardowns run)")


def _ensure_installed() -> None:
    if signal.getsignal(signal.SIGTERM) is not _stop_the_run:
        signal.signal(signal.SIGTERM, _stop_the_run)


def pytest_configure(config):
    global _previous
    if signal.getsignal(signal.SIGTERM) is not _stop_the_run:
        _previous = signal.signal(signal.SIGTERM, _stop_the_run)


def pytest_unconfigure(config):
    if _previous is not None:
        signal.signal(signal.SIGTERM, _previous)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    try:
        return (yield)
    finally:
        if fixturedef.scope == "session":  # ray.init (the shared Ray) installs its own handler
            _ensure_installed()
