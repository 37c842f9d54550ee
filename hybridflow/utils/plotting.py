"""Reward and accuracy curves from logged metrics, drawn with matplotlib (the ``[plot]`` extra).

matplotlib is imported only when a figure is drawn, so the library imports without it; drawing
without it raises an ImportError that names the extra. The curves, per step:

    training reward     ``critic/score/mean`` (the mean sequence score of the step's samples)
    validation          every ``val-core/<data source>/<reward|acc>/mean@<n>`` (greedy accuracy for a 0/1 scorer;
                        ``acc`` when the scorer reports it: veRL's core variable)

and, for an SFT log (no RL keys), ``train/loss`` and ``val/loss``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable

__all__ = ["PLOT_EXTRA_HINT", "read_metrics_jsonl", "curves_from_rows", "build_figure", "draw_curves", "CurveRecorder"]

PLOT_EXTRA_HINT = "pip install 'hybridflow[plot]' (or: pip install matplotlib)"
TRAIN_REWARD = "critic/score/mean"
_VAL_KEY = re.compile(r"^val-core/(?P<source>.+)/(?:reward|acc)/mean@(?P<n>\d+)$")
_SFT_KEYS = {"train/loss": "training loss", "val/loss": "validation loss"}

Curves = dict[str, list[tuple[int, float]]]


def read_metrics_jsonl(path: str) -> list[dict]:
    """Rows of a metrics JSONL log (``trainer.logger=[file]``/``jsonl``); a run directory means its
    ``metrics.jsonl``. Strings such as "nan" (how the file logger writes non-finite values) are kept."""
    if os.path.isdir(path):
        candidate = os.path.join(path, "metrics.jsonl")
        if not os.path.isfile(candidate):
            raise FileNotFoundError(
                f"{path!r} is a directory without a metrics.jsonl (write one with trainer.logger=[...,file])"
            )
        path = candidate
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON line ({e})") from None
    return rows


def _finite(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def curves_from_rows(rows: Iterable[dict]) -> Curves:
    """{label: [(step, value), ...]} for the training reward and each validation source; SFT losses
    when the rows hold no RL metric. A step logged twice (a resumed run) keeps its last value."""
    points: dict[str, dict[int, float]] = {}
    for row in rows:
        step = row.get("step")
        if step is None:
            continue
        for key, value in row.items():
            label = None
            if key == TRAIN_REWARD:
                label = "training reward (mean)"
            else:
                m = _VAL_KEY.match(key)
                if m:
                    label = f"validation {m['source']} (mean@{m['n']})"
                elif key in _SFT_KEYS:
                    label = _SFT_KEYS[key]
            v = _finite(value) if label else None
            if v is not None:
                points.setdefault(label, {})[int(step)] = v
    curves = {label: sorted(pts.items()) for label, pts in points.items()}
    if any(label not in _SFT_KEYS.values() for label in curves):  # an RL log: its losses are not these
        curves = {k: v for k, v in curves.items() if k not in _SFT_KEYS.values()}
    return curves


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(f"drawing curves needs matplotlib: {PLOT_EXTRA_HINT}") from e
    matplotlib.use("Agg", force=False)  # files only; never opens a window
    import matplotlib.pyplot as plt

    return plt


def build_figure(curves: Curves, title: str = ""):
    """A matplotlib Figure of the curves: x = training step, one labelled line per curve, a legend."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    losses = bool(curves) and all(label.endswith("loss") for label in curves)
    for label, pts in curves.items():
        steps, values = zip(*pts) if pts else ((), ())
        marker = "o" if label.startswith("validation") or len(pts) < 20 else None
        ax.plot(steps, values, marker=marker, markersize=4, linewidth=1.5, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("loss" if losses else "score (mean per sample)")
    if not losses and all(0.0 <= v <= 1.0 for pts in curves.values() for _, v in pts):
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title or ("training curves" if curves else "no reward, accuracy or loss metrics logged yet"))
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(loc="best")
    fig.tight_layout()
    return fig


def draw_curves(path: str, curves: Curves, title: str = "") -> str:
    """Write the curves as a PNG at ``path`` (axes, labels, legend); returns ``path``."""
    fig = build_figure(curves, title)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}.png"
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)  # a viewer never reads half a file
    finally:
        _pyplot().close(fig)
    return path


class CurveRecorder:
    """Keeps only the curve points of logged metrics (bounded by steps × curves, not by metrics) and
    redraws the PNG after every logged validation, and once more at the end."""

    def __init__(self, path: str, title: str = ""):
        _pyplot()  # fail at start-up, naming the extra, not after the first validation
        self.path, self.title = path, title
        self.rows: list[dict] = []
        self._dirty = False

    def log(self, data: dict, step: int) -> None:
        kept = {k: v for k, v in data.items() if k == TRAIN_REWARD or k in _SFT_KEYS or _VAL_KEY.match(k)}
        if kept:
            self.rows.append({"step": step, **kept})
            self._dirty = True
        if any(_VAL_KEY.match(k) or k == "val/loss" for k in kept):
            self.draw()

    def draw(self) -> str:
        self._dirty = False
        return draw_curves(self.path, curves_from_rows(self.rows), self.title)

    def finish(self) -> None:
        if self._dirty:
            self.draw()
