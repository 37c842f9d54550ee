"""Where each worker of a Ray group lives, its stacks taken on its own node, and lost nodes named.

``locate`` runs inside each actor once it is built (and installs the faulthandler stack-dump
handler there). ``collect_stacks`` takes every rank's stacks without calling the actors: the
processes may be busy, deadlocked or stopped. Processes on the driver's node are inspected
directly; for other nodes a zero-CPU Ray task pinned to that node does it, so a hang on a remote
node is reported the same way. ``describe_lost_nodes`` turns a dead actor into "node X (address)
was lost; it held ranks [...]".
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hybridflow.single_controller.base.stacks import dump_stacks, install_stack_dump_handler

COLLECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class WorkerLocation:
    pid: int
    node_id: str
    node_ip: str

    def __str__(self):
        return f"node {self.node_id[:12]} {self.node_ip}"


def locate(actor_self=None) -> WorkerLocation:
    """Run inside an actor (``actor.__ray_call__.remote(locate)``): its pid and node."""
    install_stack_dump_handler()
    return WorkerLocation(os.getpid(), ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())


def locate_from_gcs(actor) -> WorkerLocation | None:
    """Pid and node of an actor from Ray's actor table: known while its __init__ still runs."""
    try:
        from ray._private.state import actors

        info = actors(actor._actor_id.hex())
        if info.get("Pid"):
            return WorkerLocation(int(info["Pid"]), info["Address"]["NodeID"], info["Address"]["IPAddress"])
    except Exception:
        pass
    return None


@ray.remote(num_cpus=0)
def _dump_on_node(pids: list[int]) -> list[dict]:
    return [dump_stacks(pid) for pid in pids]


def collect_stacks(locations: list[WorkerLocation | None], ranks: list[int]) -> dict[int, dict]:
    """rank -> ``{"pid", "state", "tool", "text", "location"}`` (or ``"error"``) for ``ranks``."""
    here = ray.get_runtime_context().get_node_id()
    by_node: dict[str, list[int]] = {}
    out: dict[int, dict] = {}
    for r in ranks:
        loc = locations[r] if r < len(locations) else None
        if loc is None:
            out[r] = {"pid": None, "state": "unknown", "error": "location unknown (the worker never finished starting)"}
        else:
            by_node.setdefault(loc.node_id, []).append(r)
    remote = {}
    for node, node_ranks in by_node.items():
        if node != here:
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            remote[node] = _dump_on_node.options(scheduling_strategy=strategy).remote(
                [locations[r].pid for r in node_ranks]
            )
    for node, node_ranks in by_node.items():
        if node == here:
            infos = [dump_stacks(locations[r].pid) for r in node_ranks]
        else:
            try:
                infos = ray.get(remote[node], timeout=COLLECT_TIMEOUT_S)
            except Exception as e:
                lost = "" if node_alive(node) else "; the node is lost"
                infos = [
                    {
                        "pid": locations[r].pid,
                        "state": "unknown",
                        "error": f"stacks not taken on {locations[r]}{lost} ({type(e).__name__})",
                    }
                    for r in node_ranks
                ]
        for r, info in zip(node_ranks, infos):
            out[r] = {**info, "location": str(locations[r])}
    return {r: out[r] for r in sorted(out)}


def _nodes() -> dict[str, dict]:
    try:
        return {n["NodeID"]: n for n in ray.nodes()}
    except Exception:
        return {}


def node_alive(node_id: str) -> bool:
    node = _nodes().get(node_id)
    return node is None or bool(node.get("Alive", True))


def describe_node(node_id: str, nodes: dict | None = None) -> str:
    node = (nodes or _nodes()).get(node_id, {})
    addr = node.get("NodeManagerAddress", "?")
    port = node.get("NodeManagerPort")
    name = node.get("NodeName")
    extra = f", name {name}" if name and name != addr else ""
    return f"node {node_id} (address {addr}{':' + str(port) if port else ''}{extra})"


def _raylet_answers(node: dict, timeout_s: float = 2.0) -> bool:
    """A TCP connect to the node's raylet: refused or silent means the node is gone, even before the
    GCS's health checks (several seconds) mark it dead."""
    try:
        with socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=timeout_s):
            return True
    except (OSError, KeyError, ValueError):
        return False


def describe_lost_nodes(locations: list[WorkerLocation | None], wait_s: float = 0.0) -> str | None:
    """'node ... was lost; it held ranks [..]' for every node that held a rank and is dead (for the
    GCS, or its raylet does not answer), else None. ``wait_s``: how long to wait for the GCS."""
    deadline = time.monotonic() + wait_s
    held = {loc.node_id for loc in locations if loc is not None}
    while True:
        nodes = _nodes()
        dead = {n for n in held if n in nodes and not (nodes[n].get("Alive", True) and _raylet_answers(nodes[n]))}
        if dead or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if not dead:
        return None
    parts = []
    for node in sorted(dead):
        ranks = [r for r, loc in enumerate(locations) if loc is not None and loc.node_id == node]
        parts.append(f"{describe_node(node, nodes)} was lost; it held ranks {ranks}")
    return "; ".join(parts)
