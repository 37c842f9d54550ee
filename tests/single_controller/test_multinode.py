"""hybridflow on an existing multi-node Ray cluster: two raylets on this machine, loopback only.

Drivers run as subprocesses that join the cluster through RAY_ADDRESS (as ``ray job submit`` and
``ray_kwargs.ray_init.address`` do), so they never meet the test session's own local Ray. Order
matters: the last test removes a node from the module's cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.subprocess_env import pythonpath_with

pytest.importorskip("ray")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))


def _env(address: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with(REPO_ROOT, HERE)
    env.update(
        {
            "RAY_ADDRESS": address,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


class LoopbackCluster:
    def __init__(self, nodes: int = 2, cpus: int = 2):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "loopback_cluster.py"), "--nodes", str(nodes), "--cpus", str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(""),
        )
        info = json.loads(self.proc.stdout.readline())
        self.address, self.head, self.nodes = info["address"], info["head"], info["nodes"]

    def remove(self, node_id: str) -> None:
        self.proc.stdin.write(f"remove {node_id}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == f"removed {node_id}"

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)
        except Exception:
            self.proc.terminate()  # it shuts the cluster down on SIGTERM too
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def cluster():
    c = LoopbackCluster(nodes=2, cpus=2)
    yield c
    c.close()


def _driver(code: str, cluster: LoopbackCluster, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_env(cluster.address),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **popen,
    )


def _result(out: str) -> dict:
    line = next(line for line in out.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.mark.slow
def test_grpo_on_two_nodes(cluster, tiny_model_dir, tiny_data_dir, tmp_path):
    """`python -m hybridflow.main_ppo trainer.nnodes=2` on the cluster: trains 2 steps, one rank per node."""
    from tests.trainer.e2e_helpers import base_overrides, read_metrics

    overrides = base_overrides(
        tiny_model_dir, tiny_data_dir, tmp_path, estimator="grpo", n=2, batch=4, steps=2, world=2
    )
    overrides += ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]  # after world=2's n_gpus_per_node=2
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hybridflow.main_ppo", *overrides],
        env=_env(cluster.address),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    steps = read_metrics(tmp_path)
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["critic/advantages/max"] > 0 for m in steps)
    print(f"GRPO on two nodes: {time.monotonic() - start:.1f}s")


TWO_NODES = """
    import json, ray
    import workers_for_tests as W
    from hybridflow.single_controller.base import WorkerDiedError
    from hybridflow.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridflow.single_controller.ray.init import init_ray

    init_ray({"address": None})  # the address comes from RAY_ADDRESS, as under `ray job submit`
    ray.cloudpickle.register_pickle_by_value(W)
    try:
        RayResourcePool(process_on_nodes=[1, 1, 1], use_gpu=False).get_placement_groups()
        too_many = None
    except RuntimeError as e:
        too_many = str(e)
    pool = RayResourcePool(process_on_nodes=[1, 1], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(cls=ray.remote(W.EchoWorker)), name_prefix="multinode")
    locs = group._locations
    result = {"nodes": [l.node_id for l in locs], "ips": [l.node_ip for l in locs], "too_many": too_many,
              "sums": group.all_reduce(1.0),  # gloo across the two nodes, rendezvous at rank 0's node
              "master": group.execute_all_sync("get_master_addr_port")}
    handles = group.execute_all_async("sleep", 120)
    print("READY" + json.dumps(result), flush=True)
    try:
        group._resolve("sleep", [0, 1], handles)
    except WorkerDiedError as e:
        print("RESULT" + json.dumps({"rank": e.rank, "text": str(e) + "\\n" + "\\n".join(getattr(e, "__notes__", []))}))
"""


@pytest.mark.slow  # ~25 s: a two-raylet cluster of its own (the default command's time budget is 8 min)
def test_two_nodes_placement_rendezvous_and_a_lost_node(cluster):
    """One driver: a [1, 1] pool takes one rank on each node, the ranks rendezvous over the nodes'
    addresses, a pool asking for more nodes than exist is refused by name, and when a node goes
    away mid-call the error names that node and the ranks it held."""
    proc = _driver(TWO_NODES, cluster, stdin=subprocess.DEVNULL)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("READY"):
            got = json.loads(line[len("READY") :])
            break
    else:
        pytest.fail("".join(lines)[-3000:])
    # one rank per node, although one node could hold both
    assert sorted(got["nodes"]) == sorted(cluster.nodes)
    assert got["ips"] == ["127.0.0.1", "127.0.0.1"]  # the driver joined on loopback, as did every node
    # all_reduce of value * (rank + 1): 1 * 1 + 1 * 2 = 3 on both ranks
    assert got["sums"] == [3.0, 3.0]
    assert got["master"][0] == got["master"][1] and got["master"][0][0] == "127.0.0.1"
    assert "spans 3 nodes" in got["too_many"] and "2 alive node(s)" in got["too_many"]

    victim = next(n for n in got["nodes"] if n != cluster.head)
    start = time.monotonic()
    cluster.remove(victim)
    out, _ = proc.communicate(timeout=120)
    elapsed = time.monotonic() - start
    lost = _result(out)
    rank = got["nodes"].index(victim)
    assert lost["rank"] == rank
    # named: the node's id and address, and the ranks it held; not a 120 s wait for the survivor
    assert f"node {victim} (address 127.0.0.1:" in lost["text"], lost["text"]
    assert f"was lost; it held ranks [{rank}]" in lost["text"] and "'multinode'" in lost["text"]
    assert elapsed < 60, elapsed
