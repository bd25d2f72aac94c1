"""A trial whose ranks span several machines of a Ray cluster.

The local launcher (``autoslapo.runtime.launcher.launch``) runs every rank of a trial on one
machine. A trial of 64 GPUs on 8-GPU nodes needs 8 machines: ``launch_on_nodes`` runs one local
launch per machine, each starting its slice of the ranks (``NodeSlice``), all meeting at the
TCP store that global rank 0 serves on the first machine, as ``torchrun`` does across nodes. Ray
places the slices: each is a task in its own bundle of a placement group (``{"CPU": k}`` or
``{"GPU": k}`` for k ranks), so the devices a slice uses are reserved for it. Everything a local
launch does per machine (timeouts, the memory cap, no process, port or /dev/shm file left behind,
the root-cause reason of a failure) holds per slice; the slices' outcomes are merged into one.
"""

from __future__ import annotations

import socket
from typing import Any

from autoslapo.errors import ConfigError
from autoslapo.runtime.launcher import LaunchOutcome, NodeSlice, is_peer_lost, launch

__all__ = ["bundles_for", "launch_on_nodes", "merge_outcomes"]

# How a merged status is chosen when slices disagree: a slice's own failure explains the others'
# (its peers then fail on a lost connection or wait until the timeout).
_PRIORITY = {"oom": 0, "failed": 1, "timeout": 2, "complete": 3}


def bundles_for(ranks_per_node: list[int], device: str) -> list[dict[str, float]]:
    """The placement-group bundles of a trial's rank slices (one a machine)."""
    if device == "cuda":
        return [{"CPU": 1.0, "GPU": float(k)} for k in ranks_per_node]
    return [{"CPU": float(k)} for k in ranks_per_node]


def _probe() -> tuple[str, int]:
    """This machine's address and a free TCP port for the rank-0 store."""
    import ray

    host = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return host, port


def _launch_slice(entry: str, payload: dict[str, Any], node: NodeSlice, kw: dict[str, Any]) -> dict[str, Any]:
    out = launch(entry, node.world_size, payload, node=node, **kw)
    return {**out.__dict__, "host": socket.gethostname()}


def merge_outcomes(parts: list[LaunchOutcome], offsets: list[int], hosts: list[str]) -> LaunchOutcome:
    """One outcome for the whole world from its slices' (in rank order).

    Values, peaks and logs are concatenated in rank order; the status is the slice's whose failure
    explains the others' (out of memory, then a failure of its own, then a timeout), its reason
    prefixed with the machine and ranks it happened on.
    """
    worst = min(range(len(parts)), key=lambda i: (_PRIORITY[parts[i].status], is_peer_lost(parts[i].reason)))
    w = parts[worst]
    reason = w.reason
    if w.status != "complete":
        last = offsets[worst] + len(w.values) - 1
        reason = f"on {hosts[worst]} (ranks {offsets[worst]}-{last}): {w.reason}"
    return LaunchOutcome(
        status=w.status,
        reason=reason,
        values=[v for p in parts for v in p.values],
        peak_rss_bytes=[b for p in parts for b in p.peak_rss_bytes],
        elapsed_s=max(p.elapsed_s for p in parts),
        logs=[log for p in parts for log in p.logs],
        launch_id=",".join(p.launch_id for p in parts),
        oom_evidence=w.oom_evidence,
    )


def launch_on_nodes(
    entry: str,
    payload: dict[str, Any],
    ranks_per_node: list[int],
    *,
    timeout_s: float,
    mem_cap_bytes: int | None = None,
    device: str = "cpu",
    placement_group: Any = None,
    bundle_offset: int = 0,
) -> LaunchOutcome:
    """Run ``entry`` on ``sum(ranks_per_node)`` ranks, ``ranks_per_node[i]`` of them on machine ``i``.

    Takes: the entry and payload (as ``launch``); the ranks of each machine; the trial's wall-clock
    limit, memory cap and device; a Ray placement group whose bundles ``bundle_offset ..
    bundle_offset + len(ranks_per_node) - 1`` hold the slices (default: the placement group this
    task runs in, e.g. a Ray Tune trial's, else one made here with a bundle a slice, PACK).
    Needs Ray initialized (joined to the cluster). Returns the merged LaunchOutcome.
    Raises: ConfigError for an empty or non-positive split, Ray not initialized, or a placement
    group too small.
    """
    if not ranks_per_node or any(k < 1 for k in ranks_per_node):
        raise ConfigError(f"every machine of a trial needs at least one rank: got {ranks_per_node}")
    import ray
    from ray.util.placement_group import placement_group as make_pg
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        raise ConfigError("a trial spanning machines runs through Ray: this process has not joined a cluster; "
                          "call ray.init(address=...) first (the tuner's --ray-address does)")
    owned = None
    pg = placement_group or ray.util.get_current_placement_group()
    if pg is None:
        owned = pg = make_pg(bundles_for(ranks_per_node, device), strategy="PACK")
        bundle_offset = 0
        ray.get(pg.ready(), timeout=timeout_s)
    if bundle_offset + len(ranks_per_node) > pg.bundle_count:
        raise ConfigError(f"the placement group has {pg.bundle_count} bundles; the trial's {len(ranks_per_node)} "
                          f"machine slices need bundles {bundle_offset}..{bundle_offset + len(ranks_per_node) - 1}")
    try:
        def on(i: int) -> Any:
            return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle_offset + i)

        host, port = ray.get(ray.remote(num_cpus=0)(_probe).options(scheduling_strategy=on(0)).remote())
        world = sum(ranks_per_node)
        offsets = [sum(ranks_per_node[:i]) for i in range(len(ranks_per_node))]
        kw = {"timeout_s": timeout_s, "mem_cap_bytes": mem_cap_bytes, "device": device}
        task = ray.remote(_launch_slice)
        refs = []
        for i, k in enumerate(ranks_per_node):
            node = NodeSlice(offsets[i], k, world, host, port)
            res = {"num_cpus": 0, "num_gpus": k if device == "cuda" else 0}
            refs.append(task.options(scheduling_strategy=on(i), **res).remote(entry, payload, node, kw))
        raw = ray.get(refs)
    finally:
        if owned is not None:
            remove_placement_group(owned)
    hosts = [r.pop("host") for r in raw]
    return merge_outcomes([LaunchOutcome(**r) for r in raw], offsets, hosts)
