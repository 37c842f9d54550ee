"""`init_ray`: how every hybridflow entry point starts or joins Ray.

A cluster address (``ray_init.address`` or the ``RAY_ADDRESS`` environment variable) joins that
cluster. Without one, a new LOCAL Ray is started with safe defaults: every Ray process binds the
loopback interface only (``_node_ip_address="127.0.0.1"``; Ray then makes its gRPC and HTTP
servers listen on 127.0.0.1), and the dashboard with its job-submission API is off unless
``ray_init.include_dashboard: true`` asks for it (and then it too listens on 127.0.0.1 only).
``address="local"`` makes sure a ``ray start`` cluster someone else runs on this machine is not
joined by accident.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["init_ray", "LOOPBACK", "DEFAULT_WORKER_ENV"]

LOOPBACK = "127.0.0.1"

# Set in every worker unless the caller's runtime_env says otherwise. NCCL_* / CUDA_* are left alone:
# they belong to the user and the cluster.
DEFAULT_WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false"}


def _section(cfg: Any) -> Mapping:
    """The ``ray_init`` section as a plain mapping: accepts the section, a whole config with
    ``ray_kwargs.ray_init`` (veRL 0.9's tree) or ``ray_init``, or None."""
    if cfg is None:
        return {}
    if not isinstance(cfg, Mapping):  # an OmegaConf DictConfig is a MutableMapping; anything else:
        cfg = dict(cfg)
    if "ray_kwargs" in cfg and isinstance(cfg["ray_kwargs"], Mapping):
        cfg = cfg["ray_kwargs"]
    if "ray_init" in cfg and isinstance(cfg["ray_init"], Mapping):
        cfg = cfg["ray_init"]
    return cfg


def _runtime_env(user_env: Mapping | None, runtime_env: Mapping | None) -> dict:
    """``ray_init.runtime_env`` (its unset fields dropped) merged with the caller's, as veRL merges its
    defaults with the user's: DEFAULT_WORKER_ENV < the caller's env_vars < the user's (ray_init.runtime_env)."""
    user_env = {k: v for k, v in dict(user_env or {}).items() if v is not None}
    env = {**dict(runtime_env or {}), **user_env}
    env["env_vars"] = {
        **DEFAULT_WORKER_ENV,
        **dict((runtime_env or {}).get("env_vars") or {}),
        **dict(user_env.get("env_vars") or {}),
    }
    return env


def init_ray(ray_init_cfg: Any = None, num_cpus: int | None = None, runtime_env: Mapping | None = None) -> bool:
    """Start or join Ray; return True if this call initialised it, False if Ray was already up.

    ``ray_init_cfg`` is the ``ray_init`` config section (``address``, ``num_cpus``, ``num_gpus``,
    ``include_dashboard``, ``runtime_env``); the ``num_cpus`` argument wins over ``ray_init.num_cpus``.
    """
    import ray

    if ray.is_initialized():
        return False
    with _callers_sigterm_handler_kept():
        return _start_or_join(ray, ray_init_cfg, num_cpus, runtime_env)


@contextlib.contextmanager
def _callers_sigterm_handler_kept():
    """``ray.init`` installs its own SIGTERM handler; a caller that had one of its own (the command
    line's orderly stop, a user's) keeps it. A process with none gets Ray's (exit on SIGTERM)."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(before):
            signal.signal(signal.SIGTERM, before)


def _start_or_join(ray, ray_init_cfg, num_cpus, runtime_env) -> bool:
    cfg = _section(ray_init_cfg)
    env = _runtime_env(cfg.get("runtime_env"), runtime_env)
    address = cfg.get("address") or os.environ.get("RAY_ADDRESS")
    if address:
        # Joining a cluster: its resources, bind addresses and dashboard are the cluster's business.
        # A cluster on this machine's loopback (tests, a laptop) is joined on loopback too.
        with _loopback_node_ip() if _is_loopback_address(address) else contextlib.nullcontext():
            ray.init(address=address, runtime_env=env)
        return True

    num_cpus = num_cpus if num_cpus is not None else cfg.get("num_cpus")
    num_gpus = cfg.get("num_gpus")
    include_dashboard = bool(cfg.get("include_dashboard") or False)
    with _loopback_node_ip():
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            runtime_env=env,
            _node_ip_address=LOOPBACK,
            include_dashboard=include_dashboard,
            dashboard_host=LOOPBACK,
            # Ray starts workers at nice 15; hybridflow's workers ARE the job's compute (the driver
            # mostly waits), and at nice 15 they lose the CPU to every other process on a shared
            # machine (measured: rollout 0.73x a same-thread direct generate; benchmarks/README.md)
            _system_config={"worker_niceness": 0},
        )
    return True


def _is_loopback_address(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@contextlib.contextmanager
def _loopback_node_ip():
    """Keep Ray from replacing ``_node_ip_address="127.0.0.1"`` with the machine's routable IP.

    Ray (2.4x+) resolves a loopback node address to the host's outward IP unless
    ``ray_constants.ENABLE_RAY_CLUSTER`` is off (the switch behind RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER,
    read once at import). It only decides which IP the node's processes are told to bind, so it is
    turned off for the duration of ``ray.init`` in this process and restored afterwards.
    """
    from ray._private import ray_constants

    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
