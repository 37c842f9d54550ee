"""``ray_kwargs`` (veRL 0.9.1's spelling of Ray's start-up; the earlier ``ray_init`` is in
``hybridflow.config.legacy``)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.status import honoured, refused

__all__ = ["RayInitConfig", "RayKwargsConfig", "timeline_problem"]

_ONLY = "hybridflow passes only address, num_cpus, num_gpus, include_dashboard and runtime_env to ray.init"


@dataclass
class RayInitConfig(BaseConfig):
    """``ray_kwargs.ray_init``: the arguments of ray.init."""

    num_cpus: int | None = doc(None, "CPUs Ray may use; null: all (set it under SLURM or in containers)")
    num_gpus: int | None = doc(
        None,
        "GPUs Ray may use; null: the ones it detects (veRL's examples add it with +, e.g. where a privileged "
        "container hides the devices from Ray's detection)",
    )
    runtime_env: dict = doc(
        {"py_executable": None},
        "Ray runtime_env for every worker (py_executable: the workers' interpreter; env_vars, pip, ...)",
        keys={"py_executable": honoured()},
    )
    address: str | None = doc(None, "hybridflow: null starts a local Ray unless RAY_ADDRESS is set")
    include_dashboard: bool = doc(False, "hybridflow: start the dashboard (it listens on 127.0.0.1 only)")


@dataclass
class RayKwargsConfig(BaseConfig):
    """``ray_kwargs``: Ray start-up."""

    ray_init: RayInitConfig = section(RayInitConfig, "arguments of ray.init", keys={"**": refused(_ONLY)})
    timeline_json_file: str | None = doc(
        None,
        "after the run, Ray's timeline of every worker call (Chrome trace JSON: chrome://tracing or Perfetto) is "
        "written to this file (Ray reports calls once a second: the last second's may be missing); null: none. "
        "Needs trainer.backend=ray",
    )


def timeline_problem(ray_kwargs: RayKwargsConfig, backend: str) -> str | None:
    """Why ``ray_kwargs.timeline_json_file`` cannot be written by this run (None: it can)."""
    if ray_kwargs.timeline_json_file and backend != "ray":
        return (
            f"ray_kwargs.timeline_json_file={ray_kwargs.timeline_json_file} is Ray's record of its workers' calls; "
            f"trainer.backend={backend} runs no Ray workers: set trainer.backend=ray or drop the key"
        )
    return None
