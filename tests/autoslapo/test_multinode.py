"""Trials whose ranks span the machines of a Ray cluster (``autoslapo.runtime.multinode``).

The cluster is Ray's own multi-node simulation (``ray.cluster_utils.Cluster``): separate raylets,
so separate Ray nodes with their own resources, on this one machine. Each slice of a trial's
ranks runs in its node's placement-group bundle and meets the others at global rank 0's store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.runtime.launcher import LaunchOutcome, NodeSlice
from autoslapo.runtime.multinode import bundles_for, merge_outcomes


def _outcome(status: str, reason: str = "", n: int = 2) -> LaunchOutcome:
    return LaunchOutcome(status, reason, [{"rank": i} for i in range(n)], [1] * n, 1.0, [""] * n, "x")  # type: ignore[arg-type]


def test_merged_outcome_names_the_machine_and_ranks_of_the_root_cause() -> None:
    parts = [_outcome("failed", "rank 1: RuntimeError: Connection reset by peer"),
             _outcome("oom", "rank 0: out of memory"), _outcome("complete")]
    out = merge_outcomes(parts, [0, 2, 4], ["a", "b", "c"])
    assert out.status == "oom" and out.reason == "on b (ranks 2-3): rank 0: out of memory"
    assert len(out.values) == len(out.peak_rss_bytes) == 6
    # a failure of a rank's own explains a lost connection elsewhere
    parts = [_outcome("failed", "rank 0: RuntimeError: Connection reset by peer"),
             _outcome("failed", "rank 1: ValueError: bad shape")]
    assert merge_outcomes(parts, [0, 2], ["a", "b"]).reason == "on b (ranks 2-3): rank 1: ValueError: bad shape"
    assert merge_outcomes([_outcome("complete"), _outcome("complete")], [0, 2], ["a", "b"]).status == "complete"


def test_node_slices_and_bundles_are_checked() -> None:
    from autoslapo.errors import ConfigError

    NodeSlice(2, 2, 4, "10.0.0.1", 29500).check(4)
    with pytest.raises(ConfigError, match="inside the job's world"):
        NodeSlice(3, 2, 4, "10.0.0.1", 29500).check(4)
    with pytest.raises(ConfigError, match="host and a port"):
        NodeSlice(0, 2, 4, "10.0.0.1", 0).check(4)
    from autoslapo.runtime.multinode import launch_on_nodes

    with pytest.raises(ConfigError, match="at least one rank"):
        launch_on_nodes("m:f", {}, [2, 0], timeout_s=10)
    with pytest.raises(ConfigError, match="has not joined a cluster"):
        launch_on_nodes("m:f", {}, [2, 2], timeout_s=10)
    assert bundles_for([2, 2], "cpu") == [{"CPU": 2.0}, {"CPU": 2.0}]
    assert bundles_for([8], "cuda") == [{"CPU": 1.0, "GPU": 8.0}]


@pytest.fixture
def ray_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=3)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_a_trial_spanning_two_machines_trains_like_one(ray_cluster: Any, tmp_path: Path) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from autoslapo.runtime.multinode import launch_on_nodes
    from autoslapo.runtime.train import reference_losses

    ray.init(address=ray_cluster.address, log_to_driver=False)
    spec = ModelSpec.from_name("gpt2-tiny", seq_len=32)
    config = ScheduleConfig(tp=2, dp=2, zero_stage=1, precision="fp32")  # a tp pair on each machine
    payload = {"runs": [{"spec": spec.to_dict(), "config": config.to_dict(), "steps": 2, "warmup": 0}]}
    pg = placement_group([{"CPU": 2.0}, {"CPU": 2.0}], strategy="STRICT_SPREAD")  # one slice a machine
    ray.get(pg.ready(), timeout=60)
    try:
        out = launch_on_nodes("autoslapo.runtime.train:train_many_entry", payload, [2, 2], timeout_s=300,
                              placement_group=pg)
    finally:
        remove_placement_group(pg)
    assert out.status == "complete", (out.reason, out.logs)
    want = reference_losses(spec, global_batch=config.global_batch, micro_batch=config.micro_batch, steps=2)
    for rank, value in enumerate(out.values):
        assert value is not None and value[0]["rank"] == rank
        assert value[0]["losses"] == pytest.approx(want, abs=1e-5)
    assert len(out.launch_id.split(",")) == 2  # two local launches, one a machine


@pytest.mark.ray
@pytest.mark.slow
def test_ray_dispatch_spreads_a_real_trial_over_the_machines(ray_cluster: Any, tmp_path: Path) -> None:
    from store import open_store
    from tuner import TuneOptions, tune

    store = open_store(f"sqlite:///{tmp_path / 't.db'}")
    cluster = ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=2)  # 2 machines of 2 ranks
    try:
        out = tune(TuneOptions(model=ModelSpec.from_name("bert-tiny"), cluster=cluster, backend="local",
                               dispatch="ray", ray_address=ray_cluster.address, trials=2, max_concurrent=1,
                               baselines=False, study="spread", steps=2), store)
        rows = [t for t in store.trials("spread") if t.status != "pruned"]
        assert out.launched == len(rows) == 2
        for t in rows:
            assert t.status == "complete", t.reason
            assert t.result["extra"]["machines"] == 2 and t.result["extra"]["world_size"] == 4
    finally:
        store.close()
