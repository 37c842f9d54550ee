"""trainer.logger backends: jsonl file, lazy tensorboard/wandb (wandb offline without a key),
log_val_generations and the progress bar."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.utils.tracking import Tracking


def test_file_logger_writes_one_json_line_per_step(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "metrics.jsonl"
    monkeypatch.setenv("HYBRIDFLOW_FILE_LOGGER_PATH", str(path))
    tracker = Tracking("proj", "exp", ["file"], log_dir=str(tmp_path / "unused"))
    for step in (1, 2, 3):
        tracker.log({"critic/score/mean": step / 10, "val/acc": float("nan") if step == 2 else 0.5}, step=step)
    tracker.finish()
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    rows = [json.loads(line) for line in lines]  # strict JSON: NaN is written as a string, not a bare NaN
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["critic/score/mean"] for r in rows] == [0.1, 0.2, 0.3]
    assert rows[1]["val/acc"] == "nan" and rows[2]["val/acc"] == 0.5
    assert not (tmp_path / "unused").exists()  # the env path wins over log_dir


def test_file_logger_default_path_is_log_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_FILE_LOGGER_PATH", raising=False)
    tracker = Tracking("proj", "exp", "file", log_dir=str(tmp_path))
    tracker.log({"a": 1.0}, step=7)
    tracker.finish()
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 7, "a": 1.0}


def test_console_logger_prints_sorted_metrics(capsys):
    Tracking("p", "e", ["console"]).log({"b": 0.123456, "a": 2}, step=4)
    assert capsys.readouterr().out.strip() == "step:4 - a:2 - b:0.1235"


def test_unknown_backend_names_the_supported_ones():
    with pytest.raises(ValueError, match="tensorboard"):
        Tracking("p", "e", ["console", "mlflowz"])


def test_importing_tracking_imports_no_optional_backend():
    # a fresh interpreter: no optional backend (nor matplotlib) may be imported by the module (which the
    # trainers import), the progress display, the plot entry point, or by console/file
    code = (
        "import sys, os, tempfile; import hybridflow.utils.tracking as t; import hybridflow.plot; "
        "import hybridflow.utils.progress; "
        "d = tempfile.mkdtemp(); t.Tracking('p', 'e', ['console', 'file'], log_dir=d).log({'x': 1.0}, 1); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wandb', 'tensorboard', 'tensorboardX', "
        "'mlflow', 'swanlab', 'matplotlib') "
        "or m.startswith('torch.utils.tensorboard')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


class _FakeRun:
    def __init__(self, **kwargs):
        self.init_kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, data, step=None):
        self.logged.append((dict(data), step))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        run = _FakeRun(**kwargs)
        module.runs.append(run)
        return run

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_wandb_is_offline_without_api_key(fake_wandb, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    tracker = Tracking("proj", "exp", ["wandb"], config={"lr": 1e-4})
    tracker.log({"critic/score/mean": 0.5}, step=3)
    tracker.finish()
    (run,) = fake_wandb.runs
    assert run.init_kwargs == {"project": "proj", "name": "exp", "config": {"lr": 1e-4}, "mode": "offline"}
    assert run.logged == [({"critic/score/mean": 0.5}, 3)] and run.finished


def test_wandb_goes_online_with_api_key(fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    Tracking("proj", "exp", ["wandb"])
    assert fake_wandb.runs[0].init_kwargs["mode"] == "online"


def test_tensorboard_writes_every_scalar(monkeypatch, tmp_path):
    written = []

    class SummaryWriter:
        def __init__(self, log_dir):
            self.log_dir, self.closed = log_dir, False
            written.append(("init", log_dir))

        def add_scalar(self, key, value, step):
            written.append((key, value, step))

        def close(self):
            written.append(("close",))

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    tracker = Tracking("p", "e", ["tensorboard", "console"])
    tracker.log({"a": 1.0, "b": 2.0}, step=5)
    tracker.finish()
    assert written == [("init", str(tmp_path / "tb")), ("a", 1.0, 5), ("b", 2.0, 5), ("close",)]


# ------------------------------------------------------------------------------ trainer-side output


def _trainer_with(log_val_generations: int, tokenizer):
    from hybridflow.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer = object.__new__(RayPPOTrainer)  # only the config and tokenizer are needed here
    trainer.config = OmegaConf.create({"trainer": {"log_val_generations": log_val_generations}})
    trainer.tokenizer = tokenizer
    return trainer


def test_log_val_generations_logs_k_samples(tiny_tokenizer, caplog):
    from hybridflow.protocol import DataProto

    texts = ["12+3=15\n#### 15", "#### 7", "#### 9"]
    ids = [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id] for t in texts]
    width = max(map(len, ids))
    responses = torch.tensor([row + [tiny_tokenizer.pad_token_id] * (width - len(row)) for row in ids])
    batch = DataProto.from_dict(
        tensors={"responses": responses}, non_tensors={"data_source": np.array(["openai/gsm8k"] * 3, dtype=object)}
    )
    caplog.set_level(logging.INFO, logger="hybridflow")
    _trainer_with(2, tiny_tokenizer)._log_val_generations(batch, [1.0, 0.0, 1.0])
    lines = [m for m in caplog.messages if m.startswith("[val sample]")]
    assert lines == [
        f"[val sample] score=1.000 response={texts[0]!r}",
        f"[val sample] score=0.000 response={texts[1]!r}",
    ]
    caplog.clear()
    _trainer_with(0, tiny_tokenizer)._log_val_generations(batch, [1.0, 0.0, 1.0])
    assert not [m for m in caplog.messages if "[val sample]" in m]


def test_training_progress_shows_latest_score_as_plain_lines_off_a_terminal(capsys, monkeypatch):
    from hybridflow.utils.progress import Progress

    monkeypatch.delenv("HYBRIDFLOW_PROGRESS", raising=False)
    bar = Progress(total=3, initial=1)  # capsys's stderr is not a terminal
    bar.update(score=0.625)
    bar.close()
    err = capsys.readouterr().err
    assert "2/3" in err and "score=0.625" in err and "\r" not in err


# ------------------------------------------------------------------------------ more backends


def test_jsonl_is_the_file_backend_and_both_write_one_file(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_FILE_LOGGER_PATH", raising=False)
    tracker = Tracking("p", "e", ["file", "jsonl"], log_dir=str(tmp_path))
    tracker.log({"a": 1.0}, step=1)
    tracker.finish()
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == ['{"step": 1, "a": 1.0}']


@pytest.mark.parametrize(
    "backend,module,extra",
    [
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow", "mlflow"),
        ("swanlab", "swanlab", "swanlab"),
        ("trackio", "trackio", "trackio"),
        ("clearml", "clearml", "clearml"),
        ("tensorboard", "torch.utils.tensorboard", "tensorboard"),
        ("plot", "matplotlib", "plot"),
    ],
)
def test_missing_optional_package_names_its_extra(backend, module, extra, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(ImportError, match=rf"trainer.logger backend '{backend}'.*pip install 'hybridflow\[{extra}\]'"):
        Tracking("p", "e", ["console", backend], log_dir=str(tmp_path))


def test_every_backend_has_an_extra_in_setup_py():
    import os
    import re

    setup_text = open(os.path.join(os.path.dirname(__file__), "..", "..", "setup.py")).read()
    for extra in ("tensorboard", "wandb", "mlflow", "swanlab", "trackio", "clearml", "plot", "loggers"):
        assert re.search(rf'"{extra}": \[', setup_text), extra


def test_mlflow_writes_a_local_store_in_the_run_dir_and_sanitises_metric_names(monkeypatch, tmp_path):
    """Real mlflow (the [trace] extra brings mlflow-skinny and its sqlite store): the run lands in
    <log_dir>/mlflow.db, nothing in the working directory, and the process's store setting is put back."""
    mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed (pip install 'hybridflow[mlflow]')")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("alembic")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    tracker = Tracking("proj", "exp", ["mlflow"], config={"trainer": {"lr": 0.1}}, log_dir=str(run_dir))
    tracker.log({"val-core/openai/gsm8k/reward/mean@1": 0.5, "critic/score/mean": 0.25}, step=4)
    tracker.finish()
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no ./mlruns
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("proj")
    assert experiment.artifact_location == f"file://{run_dir / 'mlflow_artifacts'}"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "exp" and run.data.params == {"trainer/lr": "0.1"}
    # '@' is not allowed in MLflow metric names: veRL's spelling '_at_'
    assert run.data.metrics == {"val-core/openai/gsm8k/reward/mean_at_1": 0.5, "critic/score/mean": 0.25}
    assert [m.step for m in client.get_metric_history(run.info.run_id, "critic/score/mean")] == [4]


def test_swanlab_is_offline_without_api_key(monkeypatch, tmp_path):
    seen = {}
    fake = types.ModuleType("swanlab")
    fake.init = lambda **kw: seen.update(init=kw)
    fake.log = lambda data, step: seen.setdefault("log", []).append((data, step))
    fake.finish = lambda: seen.update(finished=True)
    fake.login = lambda **kw: seen.update(login=kw)
    monkeypatch.setitem(sys.modules, "swanlab", fake)
    for var in ("SWANLAB_API_KEY", "SWANLAB_MODE", "SWANLAB_LOG_DIR"):
        monkeypatch.delenv(var, raising=False)
    tracker = Tracking("proj", "exp", ["swanlab"], config={"x": 1}, log_dir=str(tmp_path))
    tracker.log({"a": 1.0}, step=2)
    tracker.finish()
    assert seen["init"] == {
        "project": "proj",
        "experiment_name": "exp",
        "config": {"FRAMEWORK": "hybridflow", "x": 1},
        "logdir": str(tmp_path / "swanlog"),
        "mode": "offline",
    }
    assert "login" not in seen and seen["log"] == [({"a": 1.0}, 2)] and seen["finished"]


def test_plot_backend_redraws_after_each_validation(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    from hybridflow.utils import plotting

    drawn = []
    real = plotting.draw_curves
    monkeypatch.setattr(
        plotting, "draw_curves", lambda path, curves, title="": drawn.append(curves) or real(path, curves, title)
    )
    monkeypatch.delenv("HYBRIDFLOW_PLOT_PATH", raising=False)
    tracker = Tracking("proj", "exp", ["plot"], log_dir=str(tmp_path))
    tracker.log({"val-core/toy/reward/mean@1": 0.2}, step=0)  # validation before training: drawn
    tracker.log({"critic/score/mean": 0.1, "actor/pg_loss": 3.0}, step=1)  # no validation: not drawn yet
    assert len(drawn) == 1
    tracker.log({"critic/score/mean": 0.3, "val-core/toy/reward/mean@1": 0.4}, step=2)
    assert drawn[-1] == {
        "validation toy (mean@1)": [(0, 0.2), (2, 0.4)],
        "training reward (mean)": [(1, 0.1), (2, 0.3)],
    }
    tracker.log({"critic/score/mean": 0.5}, step=3)
    tracker.finish()  # the last training point since the last validation
    assert len(drawn) == 3 and drawn[-1]["training reward (mean)"][-1] == (3, 0.5)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trackio_and_clearml_get_veRLs_calls(monkeypatch, tmp_path):
    """veRL 0.9's trackio and clearml backends: a run per experiment, scalars per step (fake packages record
    the calls; the real ones are optional extras)."""
    seen = {}
    trackio = types.ModuleType("trackio")
    trackio.init = lambda **kw: seen.update(trackio_init=kw)
    trackio.log = lambda data, step: seen.setdefault("trackio_log", []).append((data, step))
    trackio.finish = lambda: seen.update(trackio_finished=True)

    class Logger:
        def report_scalar(self, **kw):
            seen.setdefault("scalars", []).append(kw)

    class Task:
        @classmethod
        def init(cls, **kw):
            seen.update(clearml_init=kw)
            return cls()

        def connect_configuration(self, config, name):
            seen.update(clearml_config=(config, name))

        def get_logger(self):
            return Logger()

        def close(self):
            seen.update(clearml_closed=True)

    clearml = types.ModuleType("clearml")
    clearml.Task = Task
    monkeypatch.setitem(sys.modules, "trackio", trackio)
    monkeypatch.setitem(sys.modules, "clearml", clearml)
    tracker = Tracking("proj", "exp", ["trackio", "clearml"], config={"x": 1}, log_dir=str(tmp_path))
    tracker.log({"critic/score/mean": 0.5, "perf/throughput": 3}, step=2)
    tracker.finish()
    assert seen["trackio_init"] == {"project": "proj", "name": "exp", "config": {"x": 1}}
    assert seen["trackio_log"] == [({"critic/score/mean": 0.5, "perf/throughput": 3}, 2)]
    assert seen["clearml_init"] == {
        "project_name": "proj",
        "task_name": "exp",
        "continue_last_task": True,
        "output_uri": False,
    }
    assert seen["clearml_config"] == ({"x": 1}, "Hyperparameters")
    assert seen["scalars"] == [
        {"title": "critic", "series": "score/mean", "value": 0.5, "iteration": 2},
        {"title": "perf", "series": "throughput", "value": 3.0, "iteration": 2},
    ]
    assert seen["trackio_finished"] and seen["clearml_closed"]
