"""Experiment tracking: console, jsonl file, tensorboard, wandb — each backend imported only when asked for."""

from __future__ import annotations

import json
import math
import os
from typing import Any

SUPPORTED = ("console", "file", "tensorboard", "wandb")


class _Console:
    def log(self, data: dict[str, float], step: int) -> None:
        keys = sorted(data)
        print(f"step:{step} - " + " - ".join(f"{k}:{_fmt(data[k])}" for k in keys), flush=True)

    def finish(self):
        pass


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


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
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir)

    def log(self, data, step):
        for k, v in data.items():
            self.writer.add_scalar(k, v, step)

    def finish(self):
        self.writer.close()


class _Wandb:
    def __init__(self, project: str, name: str, config: dict):
        import wandb

        mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"  # never reach the network unasked
        self.run = wandb.init(project=project, name=name, config=config, mode=mode)

    def log(self, data, step):
        self.run.log(data, step=step)

    def finish(self):
        self.run.finish()


class Tracking:
    """``Tracking(project_name, experiment_name, default_backend=["console", "file"], config={})``."""

    def __init__(self, project_name: str, experiment_name: str, default_backend="console", config: dict | None = None,
                 log_dir: str = "."):
        backends = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [b for b in backends if b not in SUPPORTED]
        if unknown:
            raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; supported: {list(SUPPORTED)}")
        self.loggers = []
        for b in backends:
            if b == "console":
                self.loggers.append(_Console())
            elif b == "file":
                path = os.environ.get("HYBRIDFLOW_FILE_LOGGER_PATH") or os.path.join(log_dir, "metrics.jsonl")
                self.loggers.append(_JsonlFile(path))
            elif b == "tensorboard":
                self.loggers.append(_TensorBoard(os.environ.get("TENSORBOARD_DIR") or os.path.join(log_dir, "tensorboard")))
            elif b == "wandb":
                self.loggers.append(_Wandb(project_name, experiment_name, config or {}))

    def log(self, data: dict[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(data, step)

    def finish(self) -> None:
        for logger in self.loggers:
            logger.finish()
