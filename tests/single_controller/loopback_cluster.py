"""A multi-node Ray cluster on this machine, loopback only: a head raylet and N-1 more, each with its
own resources. Run as a process (``python loopback_cluster.py --nodes 2 --cpus 2``): it prints one
JSON line ``{"address", "head", "nodes": [node ids]}`` and then obeys stdin lines ``remove <node id>``
(answers ``removed <node id>``) and ``quit``.

Ray 2.60 turns ``ray start --address=127.0.0.1`` into the routable IP; ``ray.cluster_utils.Cluster``
with ``node_ip_address="127.0.0.1"`` and ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps every node on
loopback (see shared/DESIGN.md). Used by the multi-node tests; handy by hand too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when ray is imported: set first

from ray.cluster_utils import Cluster  # noqa: E402


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)  # through main's finally: a cluster shut down removes /tmp/ray/ray_current_cluster


def main() -> None:
    # SIGTERM shuts the cluster down too: killed without it, its address file stays behind and a later plain
    # ray.init() on this machine tries to join the dead cluster
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"node_ip_address": "127.0.0.1", "num_cpus": args.cpus, "include_dashboard": False},
    )
    nodes = {cluster.head_node.node_id: cluster.head_node}
    for _ in range(args.nodes - 1):
        node = cluster.add_node(node_ip_address="127.0.0.1", num_cpus=args.cpus)
        nodes[node.node_id] = node
    cluster.wait_for_nodes()
    print(json.dumps({"address": cluster.address, "head": cluster.head_node.node_id, "nodes": list(nodes)}), flush=True)
    try:
        for line in sys.stdin:
            cmd, *rest = line.split()
            if cmd == "remove":
                cluster.remove_node(nodes.pop(rest[0]), allow_graceful=False)
                print(f"removed {rest[0]}", flush=True)
            elif cmd == "quit":
                break
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
