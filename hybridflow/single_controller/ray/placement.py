"""Placement groups of a resource pool: one per node, and every one on a node of its own.

``process_on_nodes=[n0, n1, ...]`` means n0 processes on one node, n1 on another, ... Each entry is
a STRICT_PACK placement group (its bundles share a node); groups are placed one after the other,
each told to avoid the nodes the earlier ones took (a bundle label selector on Ray's built-in
``ray.io/node-id`` label), so a pool of two entries spans two nodes even when one node could hold
both.
"""

from __future__ import annotations

import time

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

NODE_ID_LABEL = "ray.io/node-id"


def alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def place_one_group_per_node(
    bundles_per_node: list[list[dict]], name_prefix: str, lifetime: str | None, timeout_s: float
) -> list:
    """Placement groups, the i-th holding ``bundles_per_node[i]`` on a node no other group uses.

    Raises GetTimeoutError (after removing what it placed) when a group cannot be placed in time."""
    pgs, used = [], []
    deadline = time.monotonic() + timeout_s
    try:
        for i, bundles in enumerate(bundles_per_node):
            selector = [{NODE_ID_LABEL: f"!in({','.join(used)})"}] * len(bundles) if used else None
            pg = placement_group(
                bundles,
                strategy="STRICT_PACK",
                name=f"{name_prefix}_{i}",
                lifetime=lifetime,
                bundle_label_selector=selector,
            )
            pgs.append(pg)
            ray.get(pg.ready(), timeout=max(0.1, deadline - time.monotonic()))
            if len(bundles_per_node) > 1:
                used.append(node_of(pg))
    except GetTimeoutError:
        for pg in pgs:
            remove_placement_group(pg)
        raise
    return pgs


def node_of(pg, bundle_index: int = 0) -> str:
    return placement_group_table(pg)["bundles_to_node_id"][bundle_index]


def check_cluster_fits(pools: dict[str, list[int]], use_gpu: bool) -> None:
    """All pools together must fit the cluster: fail at start with the numbers, never wait forever."""
    need = sum(sum(s) for s in pools.values())
    kind = "GPU" if use_gpu else "CPU"
    have = ray.cluster_resources().get(kind, 0)
    if need > have:
        detail = ", ".join(f"{pool}: {sum(s)} ({'+'.join(map(str, s))} per node)" for pool, s in pools.items())
        raise RuntimeError(
            f"the resource pools need {need} {kind}s in total ({detail}) but the Ray cluster has "
            f"{have:g}: lower trainer.nnodes / n_gpus_per_node (or rollout.nnodes / n_gpus_per_node) "
            "or start Ray with more resources"
        )
