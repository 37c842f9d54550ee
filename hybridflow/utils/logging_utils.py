"""hybridflow's messages go through ``logging``: each module logs to ``logging.getLogger(__name__)``,
so every logger sits under the ``hybridflow`` logger and an application configures them all at once.

The library never configures logging when imported. A command-line entry point calls
``setup_cli_logging()`` in its ``main()``: the user of ``python -m hybridflow.main_ppo`` then sees the
library's messages as plain lines, information on stdout (beside the console logger's step lines) and
warnings and errors on stderr. Where the application has configured logging already (a handler on
the root logger), its handlers receive the messages instead and nothing is added.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "hybridflow"


class ConsoleHandler(logging.Handler):
    """INFO and below to stdout, WARNING and above to stderr, as plain lines. The stream is looked up
    for each record, so a redirected ``sys.stdout`` (pytest's capture, a notebook) is followed."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def setup_cli_logging(level: int = logging.INFO) -> logging.Logger:
    """For an entry point's ``main()`` only: show hybridflow's messages of ``level`` and above.

    Idempotent; keeps a level the application set on the ``hybridflow`` logger, and adds no handler
    when the root logger has one (the application's own setup receives the records)."""
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(level)
    if not logging.getLogger().handlers and not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        logger.addHandler(ConsoleHandler())
    return logger
