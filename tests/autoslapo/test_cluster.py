"""``ClusterSpec`` bounds: absurd device counts are refused with rule, value and fix."""

from __future__ import annotations

import pytest

from autoslapo.cluster import MAX_GPUS, MAX_GPUS_PER_NODE, ClusterSpec
from autoslapo.errors import UsageError


def test_the_largest_allowed_cluster_is_accepted() -> None:
    c = ClusterSpec(gpus=MAX_GPUS, gpus_per_node=8)
    assert c.nodes == MAX_GPUS // 8
    assert ClusterSpec(gpus=MAX_GPUS_PER_NODE, gpu_type="cpu", gpus_per_node=MAX_GPUS_PER_NODE).nodes == 1


@pytest.mark.parametrize(("gpus", "per_node", "match"), [
    (10**12, 8, r"--gpus must be at most 1,048,576 \(2\*\*20, beyond the largest machines built\): "
                r"got 1,000,000,000,000; give a smaller --gpus"),
    (MAX_GPUS + 8, 8, r"--gpus must be at most"),
    (4096, 4096, r"--gpus-per-node must be at most 1,024 .*got 4,096; give a smaller --gpus-per-node"),
])
def test_absurd_counts_are_refused(gpus: int, per_node: int, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        ClusterSpec(gpus=gpus, gpus_per_node=per_node)
