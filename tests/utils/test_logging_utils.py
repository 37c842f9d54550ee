"""setup_cli_logging: what an entry point's main() turns on so that the library's messages reach the
user of the command line; the library itself never configures logging."""

import contextlib
import logging

import pytest

from hybridflow.utils.logging_utils import LOGGER_NAME, ConsoleHandler, setup_cli_logging


@pytest.fixture
def ours(monkeypatch):
    """hybridflow's logger as in a fresh process: no handler, no level."""
    logger = logging.getLogger(LOGGER_NAME)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    return logger


@contextlib.contextmanager
def bare_root(*handlers):
    """The root logger with only ``handlers`` (a ``python -m`` process has none; pytest's own are put back)."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = list(handlers)
    try:
        yield
    finally:
        root.handlers[:] = saved


def test_info_to_stdout_warnings_to_stderr_as_plain_lines(ours, capsys):
    with bare_root():
        setup_cli_logging()
        setup_cli_logging()  # idempotent: one handler
        assert [type(h) for h in ours.handlers] == [ConsoleHandler]
        log = logging.getLogger("hybridflow.trainer.some_module")
        log.debug("hidden")
        log.info("resumed from %s", "ckpt")
        log.warning("[config] a note")
        out, err = capsys.readouterr()  # the stream is looked up per record: capsys's replacement is seen
        assert out == "resumed from ckpt\n" and err == "[config] a note\n"
        logging.getLogger("other_library").warning("not ours")
        assert capsys.readouterr().out == ""


def test_an_applications_own_setup_is_kept(ours):
    with bare_root(logging.NullHandler()):
        ours.setLevel(logging.WARNING)
        setup_cli_logging()
        assert ours.handlers == [] and ours.level == logging.WARNING
