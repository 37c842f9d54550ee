"""Experiment tracking: ``trainer.logger=[...]`` names the backends a run's metrics go to.

    console       one line per step on stdout
    file, jsonl   one JSON line per step (``$HYBRIDFLOW_FILE_LOGGER_PATH`` or ``<log_dir>/metrics.jsonl``);
                  ``file`` is veRL's name, ``jsonl`` says what it writes
    tensorboard   ``$TENSORBOARD_DIR`` or ``<log_dir>/tensorboard``                  extra: [tensorboard]
    wandb         offline unless ``WANDB_API_KEY`` is set (no account needed)       extra: [wandb]
    mlflow        ``$MLFLOW_TRACKING_URI`` or sqlite ``<log_dir>/mlflow.db``        extra: [mlflow]
    swanlab       offline unless ``SWANLAB_API_KEY`` is set (``$SWANLAB_MODE`` wins) extra: [swanlab]
    trackio       Hugging Face's local-first tracker (``$TRACKIO_DIR``; ``trackio show``) extra: [trackio]
    clearml       a ClearML task per run (its server from ``clearml.conf``); keys ``a/b`` are
                  title ``a``, series ``b``                                          extra: [clearml]
    plot          reward/accuracy curves redrawn after every validation
                  (``$HYBRIDFLOW_PLOT_PATH`` or ``<log_dir>/curves.png``)           extra: [plot]

Optional packages are imported only when their backend is asked for, and a missing one fails at
start-up with the pip command that installs its extra. Users add backends with ``LOGGER_BACKENDS``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

from hybridflow.utils.nested_dict import leaf_items
from hybridflow.utils.plotting import CurveRecorder
from hybridflow.utils.registry import Registry

# factory(project_name, experiment_name, config, log_dir) -> object with log(data, step) and finish()
LOGGER_BACKENDS: Registry[Callable[..., Any]] = Registry("logger backend")


def require(module: str, backend: str, extra: str):
    """Import an optional backend's package, or fail naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"trainer.logger backend {backend!r} needs the {module.split('.')[0]!r} package, which is "
            f"not installed: pip install 'hybridflow[{extra}]'"
        ) from e


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class _Console:
    def log(self, data: dict[str, float], step: int) -> None:
        print(f"step:{step} - " + " - ".join(f"{k}:{_fmt(data[k])}" for k in sorted(data)), flush=True)

    def finish(self):
        pass


class _JsonlFile:
    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")

    def log(self, data, step):
        clean = {k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k, v in data.items()}
        self._fh.write(json.dumps({"step": step, **clean}) + "\n")
        self._fh.flush()

    def finish(self):
        self._fh.close()


class _TensorBoard:
    def __init__(self, log_dir: str):
        self.writer = require("torch.utils.tensorboard", "tensorboard", "tensorboard").SummaryWriter(log_dir)

    def log(self, data, step):
        for k, v in data.items():
            self.writer.add_scalar(k, v, step)

    def finish(self):
        self.writer.close()


class _Wandb:
    def __init__(self, project: str, name: str, config: dict):
        wandb = require("wandb", "wandb", "wandb")
        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"  # never reach the network unasked
        self.run = wandb.init(project=project, name=name, config=config, mode=mode)

    def log(self, data, step):
        self.run.log(data, step=step)

    def finish(self):
        self.run.finish()


_MLFLOW_BAD_CHARS = re.compile(r"[^/\w.\- :]")


def mlflow_key(key: str) -> str:
    """MLflow allows letters, digits, ``_ - . / : `` and spaces in metric names: '@' becomes '_at_'
    (veRL's spelling, so dashboards match), anything else '_', and runs of '/' one '/'."""
    return _MLFLOW_BAD_CHARS.sub("_", re.sub(r"/+", "/", key.replace("@", "_at_")))


class _Mlflow:
    """A run in ``$MLFLOW_TRACKING_URI``, else in a sqlite store ``<log_dir>/mlflow.db`` with its artifacts in
    ``<log_dir>/mlflow_artifacts`` (mlflow 3 refuses its old file store by default, and would otherwise put
    artifacts in ``./mlruns`` of the working directory). mlflow sets ``MLFLOW_TRACKING_URI`` in the process
    environment; ``finish`` puts back what was there."""

    def __init__(self, project: str, name: str, config: dict, log_dir: str):
        self.mlflow = require("mlflow", "mlflow", "mlflow")
        self._saved_uri = os.environ.get("MLFLOW_TRACKING_URI")
        uri, artifacts = self._saved_uri, None
        if not uri:
            os.makedirs(log_dir, exist_ok=True)
            uri = "sqlite:///" + os.path.abspath(os.path.join(log_dir, "mlflow.db"))
            artifacts = "file://" + os.path.abspath(os.path.join(log_dir, "mlflow_artifacts"))
        self.mlflow.set_tracking_uri(uri)
        client = self.mlflow.MlflowClient()
        experiment = client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(project, artifact_location=artifacts)
        )
        self.mlflow.start_run(experiment_id=experiment_id, run_name=name)
        params = {mlflow_key(k): str(v)[:500] for k, v in leaf_items(config or {}, sep="/") if not isinstance(v, dict)}
        if params:
            self.mlflow.log_params(params)

    def log(self, data, step):
        self.mlflow.log_metrics({mlflow_key(k): float(v) for k, v in data.items()}, step=step)

    def finish(self):
        if self.mlflow.active_run() is not None:
            self.mlflow.end_run()
        self.mlflow.set_tracking_uri(self._saved_uri)
        if self._saved_uri is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)


class _Swanlab:
    def __init__(self, project: str, name: str, config: dict, log_dir: str):
        self.swanlab = require("swanlab", "swanlab", "swanlab")
        key = os.environ.get("SWANLAB_API_KEY")
        if key:
            self.swanlab.login(api_key=key)
        mode = os.environ.get("SWANLAB_MODE") or ("cloud" if key else "offline")  # no account needed offline
        self.swanlab.init(
            project=project,
            experiment_name=name,
            config={"FRAMEWORK": "hybridflow", **(config or {})},
            logdir=os.environ.get("SWANLAB_LOG_DIR") or os.path.join(log_dir, "swanlog"),
            mode=mode,
        )

    def log(self, data, step):
        self.swanlab.log(data, step=step)

    def finish(self):
        self.swanlab.finish()


class _Trackio:
    def __init__(self, project: str, name: str, config: dict, log_dir: str):
        self.trackio = require("trackio", "trackio", "trackio")
        self.trackio.init(project=project, name=name, config=config or {})

    def log(self, data, step):
        self.trackio.log(data, step=step)

    def finish(self):
        self.trackio.finish()


class _ClearML:
    """One ClearML task per (project, experiment), continued by a resumed run (veRL's settings)."""

    def __init__(self, project: str, name: str, config: dict, log_dir: str):
        clearml = require("clearml", "clearml", "clearml")
        self.task = clearml.Task.init(project_name=project, task_name=name, continue_last_task=True, output_uri=False)
        self.task.connect_configuration(config or {}, name="Hyperparameters")

    def log(self, data, step):
        logger = self.task.get_logger()
        for key, value in data.items():
            title, _, series = key.partition("/")
            logger.report_scalar(title=title, series=series or title, value=float(value), iteration=step)

    def finish(self):
        self.task.close()


def _plot(project, name, config, log_dir):
    try:
        path = os.environ.get("HYBRIDFLOW_PLOT_PATH") or os.path.join(log_dir, "curves.png")
        return CurveRecorder(path, title=f"{project} / {name}")
    except ImportError as e:
        raise ImportError(
            "trainer.logger backend 'plot' needs matplotlib, which is not installed: pip install 'hybridflow[plot]'"
        ) from e


def _file(project, name, config, log_dir):
    return _JsonlFile(os.environ.get("HYBRIDFLOW_FILE_LOGGER_PATH") or os.path.join(log_dir, "metrics.jsonl"))


LOGGER_BACKENDS.register("console", lambda project, name, config, log_dir: _Console())
LOGGER_BACKENDS.register("file", _file)
LOGGER_BACKENDS.register("jsonl", _file)
LOGGER_BACKENDS.register(
    "tensorboard",
    lambda project, name, config, log_dir: _TensorBoard(
        os.environ.get("TENSORBOARD_DIR") or os.path.join(log_dir, "tensorboard")
    ),
)
LOGGER_BACKENDS.register("wandb", lambda project, name, config, log_dir: _Wandb(project, name, config or {}))
LOGGER_BACKENDS.register("mlflow", _Mlflow)
LOGGER_BACKENDS.register("swanlab", _Swanlab)
LOGGER_BACKENDS.register("trackio", _Trackio)
LOGGER_BACKENDS.register("clearml", _ClearML)
LOGGER_BACKENDS.register("plot", _plot)

SUPPORTED = tuple(LOGGER_BACKENDS.names())


class Tracking:
    """``Tracking(project_name, experiment_name, default_backend=["console", "file"], config={}, log_dir=".")``."""

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend="console",
        config: dict | None = None,
        log_dir: str = ".",
    ):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [b for b in backends if b not in LOGGER_BACKENDS]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; supported: {LOGGER_BACKENDS.names()}")
        self.loggers = []
        try:
            for b in dict.fromkeys(backends):  # 'file' and 'jsonl' both asked for: still one file
                factory = LOGGER_BACKENDS[b]
                if factory is _file and any(isinstance(x, _JsonlFile) for x in self.loggers):
                    continue
                self.loggers.append(factory(project_name, experiment_name, config or {}, log_dir))
        except BaseException:
            self.finish()
            raise

    def log(self, data: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(data, step)

    def finish(self) -> None:
        for logger in self.loggers:
            logger.finish()
        self.loggers = []
