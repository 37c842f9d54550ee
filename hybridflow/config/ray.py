"""``ray_kwargs`` (veRL 0.9.1's spelling of Ray's start-up; the earlier ``ray_init`` is in
``hybridflow.config.legacy``)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.base import BaseConfig, doc, section
from hybridflow.config.status import honoured, refused

__all__ = ["RayInitConfig", "RayKwargsConfig"]

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
    timeline_json_file: str | None = doc(None, "a Ray timeline file", refused="Ray timelines are not implemented")
