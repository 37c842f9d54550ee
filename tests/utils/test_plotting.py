"""Curves from logged metrics, the matplotlib figure (axes, labels, legend), ``python -m hybridflow.plot``,
and the terminal-aware progress display."""

from __future__ import annotations

import io
import json
import sys

import pytest

from hybridflow.utils.plotting import curves_from_rows, read_metrics_jsonl
from hybridflow.utils.progress import Progress, progress_mode

ROWS = [
    {"step": 0, "val-core/openai/gsm8k/reward/mean@1": 0.3},
    {"step": 1, "critic/score/mean": 0.25, "actor/pg_loss": 1.0},
    {"step": 2, "critic/score/mean": "nan"},  # the file logger writes non-finite values as strings
    {
        "step": 2,
        "critic/score/mean": 0.5,
        "val-core/openai/gsm8k/reward/mean@1": 0.4,
    },  # a resumed run logs step 2 again
]


def test_curves_keep_the_last_finite_value_per_step():
    assert curves_from_rows(ROWS) == {
        "validation openai/gsm8k (mean@1)": [(0, 0.3), (2, 0.4)],
        "training reward (mean)": [(1, 0.25), (2, 0.5)],
    }


def test_a_scorer_reporting_acc_draws_its_core_acc():
    """veRL's val-core holds acc instead of reward when the scorer reports acc."""
    rows = [{"step": 0, "val-core/math/acc/mean@4": 0.5, "val-aux/math/reward/mean@4": 0.7}]
    assert curves_from_rows(rows) == {"validation math (mean@4)": [(0, 0.5)]}


def test_sft_logs_give_loss_curves_and_rl_logs_hide_them():
    assert curves_from_rows([{"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.5, "val/loss": 1.7}]) == {
        "training loss": [(1, 2.0), (2, 1.5)],
        "validation loss": [(2, 1.7)],
    }
    assert list(curves_from_rows([{"step": 1, "train/loss": 2.0, "critic/score/mean": 0.1}])) == [
        "training reward (mean)"
    ]


def test_figure_has_axes_labels_legend_and_the_points():
    pytest.importorskip("matplotlib")
    from hybridflow.utils.plotting import build_figure

    fig = build_figure(curves_from_rows(ROWS), title="run")
    (ax,) = fig.axes
    assert (
        ax.get_xlabel() == "training step" and ax.get_ylabel() == "score (mean per sample)" and ax.get_title() == "run"
    )
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "validation openai/gsm8k (mean@1)",
        "training reward (mean)",
    ]
    assert [list(zip(line.get_xdata(), line.get_ydata())) for line in ax.get_lines()] == [
        [(0, 0.3), (2, 0.4)],
        [(1, 0.25), (2, 0.5)],
    ]
    assert ax.get_ylim() == pytest.approx((-0.02, 1.02))  # scores in [0, 1]: the full range, so runs compare


def _write_log(tmp_path) -> str:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def test_plot_entry_point_draws_a_png_from_a_run_directory(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from hybridflow import plot

    _write_log(tmp_path)
    out = plot.main([str(tmp_path)])
    assert out == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "training reward (mean): 2 points, last 0.500 at step 2" in capsys.readouterr().out
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(out).shape
    assert (width, height) == (800, 450)  # 8 x 4.5 inches at 100 dpi


def test_plot_entry_point_errors_are_messages(tmp_path, capsys, monkeypatch):
    from hybridflow import plot

    with pytest.raises(SystemExit) as info:
        plot.main([str(tmp_path)])  # no metrics.jsonl there
    assert info.value.code == 2 and "metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "m.jsonl").write_text(json.dumps({"step": 1, "actor/pg_loss": 1.0}) + "\n")
    with pytest.raises(SystemExit):
        plot.main([str(tmp_path / "m.jsonl")])
    assert "no training reward" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    with pytest.raises(SystemExit) as info:
        plot.main([_write_log(tmp_path)])
    assert info.value.code == 1 and "hybridflow[plot]" in capsys.readouterr().err


def test_read_metrics_names_the_bad_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"m.jsonl:2"):
        read_metrics_jsonl(str(path))


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_lines_elsewhere(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_PROGRESS", raising=False)
    term, pipe = _Terminal(), io.StringIO()
    assert progress_mode(term) == "bar" and progress_mode(pipe) == "lines"
    bar = Progress(4, stream=term)
    bar.update(score=0.5)
    bar.close()
    assert "\r" in term.getvalue() and "1/4" in term.getvalue()  # tqdm redraws in place
    lines = Progress(4, initial=2, stream=pipe, desc="generate", unit="sample")
    lines.update(2, score=0.25)
    text = pipe.getvalue()
    assert text.count("\n") == 1 and "\r" not in text
    assert text.startswith("[generate] 4/4 samples (100%) score=0.250 ") and text.rstrip().endswith("eta 0s")
    monkeypatch.setenv("HYBRIDFLOW_PROGRESS", "off")
    quiet = io.StringIO()
    Progress(3, stream=quiet).update()
    assert quiet.getvalue() == ""
