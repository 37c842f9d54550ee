"""init_ray: a local Ray listens on loopback only and runs no dashboard; addresses and options are routed.

The real start runs in a subprocess so it never meets the session's Ray fixture.
"""

import ipaddress
import json
import os
import subprocess
import sys
import textwrap

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from hybridflow.single_controller.ray import init as init_mod  # noqa: E402
from hybridflow.single_controller.ray.init import init_ray  # noqa: E402
from tests.subprocess_env import pythonpath_with  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a fresh interpreter: start Ray through init_ray, run one task, then report every TCP socket
# that a process of this Ray (the driver and its descendants) listens on.
_PROBE = textwrap.dedent(
    """
    import json, os, psutil, ray
    from hybridflow.single_controller.ray.init import init_ray

    # ray_kwargs.ray_init.runtime_env reaches the workers (unset fields such as py_executable=None dropped)
    runtime_env = {"py_executable": None, "env_vars": {"NCCL_DEBUG": "WARN"}}
    started = init_ray({"num_cpus": 1, "address": None, "runtime_env": runtime_env})
    again = init_ray({"num_cpus": 1})

    @ray.remote(num_cpus=1)
    def env():
        return {k: os.environ.get(k) for k in ("TOKENIZERS_PARALLELISM", "NCCL_DEBUG")}

    worker_env = ray.get(env.remote())
    procs = [psutil.Process()] + psutil.Process().children(recursive=True)
    pids = {p.pid: " ".join(p.cmdline()) for p in procs}
    listening = [
        {"ip": c.laddr.ip, "port": c.laddr.port, "cmd": pids[c.pid][:120]}
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    node = ray._private.worker._global_node
    print("RESULT" + json.dumps({
        "started": started, "again": again, "worker_env": worker_env, "listening": listening,
        "node_ip": node.node_ip_address, "webui_url": node.address_info.get("webui_url"),
        "cpus": ray.cluster_resources().get("CPU"), "cmds": list(pids.values()),
    }))
    ray.shutdown()
    """
)


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # ::ffff:127.0.0.1 is IPv4 loopback seen through a dual-stack socket
    return addr.is_loopback


@pytest.fixture(scope="module")
def probe():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "NCCL_DEBUG")}
    env["PYTHONPATH"] = pythonpath_with(REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, f"probe failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT") :])


def test_local_ray_listens_on_loopback_only(probe):
    assert probe["node_ip"] == "127.0.0.1"
    # gcs_server, raylet, agents, driver and workers all listen somewhere: the check is not vacuous
    assert len(probe["listening"]) >= 5, probe["listening"]
    exposed = [s for s in probe["listening"] if not _is_loopback(s["ip"])]
    assert not exposed, f"listening on non-loopback addresses: {exposed}"


def test_no_dashboard(probe):
    assert not probe["webui_url"]
    assert not [s for s in probe["listening"] if s["port"] == 8265]
    # Ray keeps a head process for usage stats, but without its web frontend / job API
    for cmd in probe["cmds"]:
        if "dashboard/dashboard.py" in cmd:
            assert "--disable-frontend" in cmd


def test_second_call_is_a_no_op_and_options_apply(probe):
    assert probe["started"] is True and probe["again"] is False
    assert probe["cpus"] == 1.0
    # TOKENIZERS_PARALLELISM is set for workers; NCCL_* stays the user's business (unset here)
    assert probe["worker_env"] == {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "WARN"}


# ----------------------------------------------------------------- argument routing, without starting Ray


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_address_from_config_joins_cluster(recorded):
    assert init_ray({"address": "10.0.0.5:6379", "num_cpus": 8}) is True
    (kw,) = recorded
    assert kw["address"] == "10.0.0.5:6379"
    assert "num_cpus" not in kw and "_node_ip_address" not in kw  # a cluster's own settings are not overridden


def test_a_local_start_takes_num_cpus_and_num_gpus(recorded):
    init_ray({"num_cpus": 3, "num_gpus": 2})  # veRL's examples add +ray_kwargs.ray_init.num_gpus
    (kw,) = recorded
    assert kw["address"] == "local" and kw["num_cpus"] == 3 and kw["num_gpus"] == 2
    recorded.clear()
    init_ray({"num_cpus": 3})
    assert recorded[0]["num_gpus"] is None  # unset: Ray's own detection


def test_address_from_env_joins_cluster(recorded, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.6:6379")
    init_ray({"ray_init": {"address": None}})  # a whole config is accepted too
    assert recorded[0]["address"] == "10.0.0.6:6379"


def test_address_under_ray_kwargs(recorded):
    init_ray({"ray_kwargs": {"ray_init": {"address": "10.0.0.7:6379"}}})  # veRL 0.9's tree
    assert recorded[0]["address"] == "10.0.0.7:6379"


def test_loopback_cluster_is_joined_on_loopback(monkeypatch):
    """A cluster on 127.0.0.1 (tests, a laptop) is joined with Ray's loopback-to-routable-IP swap
    off, else the driver registers under the machine's IP and cannot reach the loopback GCS."""
    from ray._private import ray_constants

    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append((kw["address"], ray_constants.ENABLE_RAY_CLUSTER)))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = ray_constants.ENABLE_RAY_CLUSTER
    for address in ("127.0.0.1:6379", "localhost:6379", "10.0.0.5:6379"):
        init_ray({"address": address})
    assert seen == [("127.0.0.1:6379", False), ("localhost:6379", False), ("10.0.0.5:6379", before)]
    assert ray_constants.ENABLE_RAY_CLUSTER == before


def test_local_defaults_and_overrides(recorded):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"num_cpus": 3, "address": None, "timeline_json_file": None})
    user_env = {"env_vars": {"MY_VAR": "1", "TOKENIZERS_PARALLELISM": "true"}, "pip": ["x"]}
    init_ray(cfg, runtime_env=user_env)
    init_ray(OmegaConf.create({"include_dashboard": True}), num_cpus=2)
    local, dash = recorded
    assert local["address"] == "local"  # never silently joins someone's `ray start` cluster
    assert local["num_cpus"] == 3 and local["_node_ip_address"] == "127.0.0.1"
    assert local["include_dashboard"] is False
    # the caller's values win and the caller's dict is left as it was
    assert local["runtime_env"] == {"env_vars": {"MY_VAR": "1", "TOKENIZERS_PARALLELISM": "true"}, "pip": ["x"]}
    assert user_env == {"env_vars": {"MY_VAR": "1", "TOKENIZERS_PARALLELISM": "true"}, "pip": ["x"]}
    assert dash["num_cpus"] == 2 and dash["include_dashboard"] is True and dash["dashboard_host"] == "127.0.0.1"
    assert dash["runtime_env"] == {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}


def test_loopback_switch_is_restored(recorded):
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    init_ray()
    assert ray_constants.ENABLE_RAY_CLUSTER == before
    assert init_mod.LOOPBACK == "127.0.0.1"


def test_already_initialised_does_nothing(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("ray.init must not be called"))
    assert init_ray({"address": "10.0.0.5:6379"}) is False


def test_configured_runtime_env_merges_over_the_callers():
    """veRL merges ray_init.runtime_env over its defaults: the user's fields and env_vars win, unset ones drop."""
    configured = {"py_executable": "uv run", "pip": None, "env_vars": {"A": "user"}}
    caller = {"env_vars": {"A": "caller", "HYBRIDFLOW_DEVICE": "cpu"}, "working_dir": "/x"}
    assert init_mod._runtime_env(configured, caller) == {
        "py_executable": "uv run",
        "working_dir": "/x",
        "env_vars": {**init_mod.DEFAULT_WORKER_ENV, "A": "user", "HYBRIDFLOW_DEVICE": "cpu"},
    }
