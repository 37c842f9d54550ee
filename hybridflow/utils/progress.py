"""Progress of a long loop where people look: a tqdm bar on an interactive terminal, one plain line
per update when stderr is a file or a pipe (CI logs, ``nohup``, Ray job logs), where a bar's
carriage returns would pile up as garbage.

``HYBRIDFLOW_PROGRESS=bar|lines|off`` overrides the choice. The training loop shows steps; a phase
that learns its own progress (an agent loop finishing trajectories one by one) can show it with
another ``Progress(total, desc="generate")``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

__all__ = ["Progress", "progress_mode"]


def progress_mode(stream: TextIO | None = None) -> str:
    """'bar' on a terminal, else 'lines'; ``HYBRIDFLOW_PROGRESS`` (bar, lines, off) wins."""
    forced = os.environ.get("HYBRIDFLOW_PROGRESS", "").strip().lower()
    if forced in ("bar", "lines", "off"):
        return forced
    stream = stream or sys.stderr
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):  # closed or exotic streams
        return "lines"


class Progress:
    """``Progress(total, initial=0, desc="training")``; ``update(n=1, **postfix)`` after each unit of work."""

    def __init__(
        self, total: int, initial: int = 0, desc: str = "training", unit: str = "step", stream: TextIO | None = None
    ):
        self.total, self.done, self.desc, self.unit = int(total), int(initial), desc, unit
        self.stream = stream or sys.stderr
        self.mode = progress_mode(self.stream)
        self.bar = None
        self._start, self._start_done = time.perf_counter(), self.done
        if self.mode == "bar":
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is a base requirement; a stripped environment gets lines
                self.mode = "lines"
            else:
                self.bar = tqdm(
                    total=self.total, initial=self.done, desc=desc, unit=unit, dynamic_ncols=True, file=self.stream
                )

    def update(self, n: int = 1, **postfix) -> None:
        self.done += n
        shown = {k: (f"{v:.3f}" if isinstance(v, float) else str(v)) for k, v in postfix.items()}
        if self.bar is not None:
            if shown:
                self.bar.set_postfix(shown, refresh=False)
            self.bar.update(n)
        elif self.mode == "lines":
            self.stream.write(self._line(shown) + "\n")
            self.stream.flush()

    def _line(self, shown: dict[str, str]) -> str:
        elapsed = time.perf_counter() - self._start
        rate = elapsed / max(self.done - self._start_done, 1)  # seconds per unit over this session
        left = max(self.total - self.done, 0) * rate
        pct = 100.0 * self.done / self.total if self.total else 100.0
        extras = "".join(f" {k}={v}" for k, v in shown.items())
        return (
            f"[{self.desc}] {self.done}/{self.total} {self.unit}s ({pct:.0f}%){extras} "
            f"{rate:.2f} s/{self.unit} eta {_duration(left)}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
