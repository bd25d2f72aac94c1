"""Collectives' seconds: NCCL's ring and, for an allreduce across nodes, its tree. Pure.

Ring cost (Patarasuk and Yuan, 2009; Thakur et al., 2005): an allreduce of ``n`` bytes over ``p``
ranks moves ``2 (p-1)/p n`` per rank, a reduce-scatter or all-gather ``(p-1)/p n``, with ``2 (p-1)``
(or ``p-1``) latency hops. Across nodes NCCL also runs allreduces as a double binary tree, chosen a
call by its own cost model (``collective_s``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.cost.device import DevicePerf


def collective_s(kind: str, nbytes: float, ranks: int, gbps: float, perf: DevicePerf, nodes: int = 1) -> float:
    """Seconds of a collective of ``nbytes`` over ``ranks`` ranks at ``gbps`` per link, the ranks on
    ``nodes`` nodes: a ring, or for an allreduce across nodes NCCL's tree where that is faster.

    NCCL chooses its algorithm a call by its own cost model (``ncclTopoTuneModel`` in NCCL's
    ``src/graph/tuning.cc``): a ring allreduce pays ``2 (p-1)`` hops; a double binary tree pays
    ``2 ((p/nodes - 1) + floor(log2(nodes)))`` (a chain within each node, a tree across nodes, whose
    depth is floor(log2 nodes); Sanders et al. 2009) and reaches 0.92 of the ring's bus bandwidth
    while moving the whole message twice (algorithm bandwidth half the bus bandwidth). So small
    allreduces over many nodes take the tree's few hops, large ones the ring's bandwidth. (NCCL's
    per-channel tree caps, 17.8 GB/s on Ampere and 36 on Hopper a channel beyond two nodes, do not
    bind with a DGX's 8 or more channels.) One hop latency serves both: NCCL's own tables give a
    tree hop about a ring hop's (Simple protocol: 4.0 against 3.4 us over NVLink, 14 against 14
    over the network, in its recent releases; 28 us a tree hop in 2.7's). Reduce-scatter and
    all-gather run as rings (NCCL has no tree for them; since 2.23 its PAT algorithm serves the case
    of one rank a node, not modelled).
    """
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    frac = (ranks - 1) / ranks
    steps = ranks - 1
    if kind == "allreduce":
        frac, steps = 2 * frac, 2 * steps
    ring = frac * nbytes / (gbps * 1e9 * perf.comm_eff) + steps * perf.coll_latency_s
    if kind != "allreduce" or nodes <= 1:
        return ring
    hops = 2 * (max(ranks // nodes - 1, 0) + int(math.log2(nodes)))
    tree = 2 * nbytes / (TREE_BW_FRAC * gbps * 1e9 * perf.comm_eff) + hops * perf.coll_latency_s
    return min(ring, tree)


# NCCL's tree allreduce reaches this fraction of the ring's bus bandwidth (``busBw * .92`` in
# ``ncclTopoTuneModel``, NCCL 2.8 on, src/graph/tuning.cc; 0.9 with an 80 GB/s cap before 2.8).
TREE_BW_FRAC = 0.92


def group_nodes(cluster: ClusterSpec, stride: int, size: int) -> int:
    """Nodes a group of ``size`` ranks spaced ``stride`` apart spans (ranks fill a node first)."""
    per_node = cluster.gpus_per_node
    if stride * size <= per_node:
        return 1
    return math.ceil(size / max(1, per_node // stride))


def group_bandwidth(cluster: ClusterSpec, stride: int, size: int) -> float:
    """Per-rank ring bandwidth (GB/s) of a group of ``size`` ranks spaced ``stride`` apart.

    Within a node: NVLink. Across nodes the ring's node-crossing hops bound it; with several group
    members in a node, NCCL runs one ring a NIC, so the bound is their share of the node's network.
    """
    per_node = cluster.gpus_per_node
    if stride * size <= per_node:
        return cluster.intra_node_gbps
    members = max(1, per_node // stride)
    return min(cluster.intra_node_gbps, members * cluster.inter_node_gbps)


def gradient_sync_s(nbytes: float, cluster: ClusterSpec, stride: int, ranks: int, perf: DevicePerf,
                    zero_stage: int) -> float:
    """Seconds to sum ``nbytes`` of gradients once over a data-parallel group of ``ranks`` ranks spaced
    ``stride`` apart: an allreduce without ZeRO (NCCL's ring, or its tree across nodes), ZeRO's
    reduce-scatter + all-gather of the same volume with it (rings: NCCL has no tree for them)."""
    nodes = group_nodes(cluster, stride, ranks) if zero_stage == 0 else 1
    return collective_s("allreduce", nbytes, ranks, group_bandwidth(cluster, stride, ranks), perf, nodes)
