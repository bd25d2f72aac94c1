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


def test_a_clusters_links_may_be_described_and_enter_its_fingerprint() -> None:
    from autoslapo.cluster import link_overrides

    preset = ClusterSpec(gpus=64)
    slow = ClusterSpec.described(64, links=link_overrides({"inter_node_gbps": 6.25}, lambda k: k))
    assert (slow.inter_node_gbps, slow.intra_node_gbps) == (6.25, preset.intra_node_gbps)
    assert slow.fingerprint() != preset.fingerprint()
    assert ClusterSpec(gpus=64, inter_node_gbps=25.0).fingerprint() == preset.fingerprint()  # the preset's own value
    assert link_overrides({"inter_node_gbps": None, "intra_node_gbps": 64}, lambda k: k) == {"intra_node_gbps": 64.0}


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), 1e5, True, "6.25"])
def test_a_bad_link_bandwidth_names_the_rule_the_value_and_a_fix(value: object) -> None:
    from autoslapo.cluster import link_overrides

    with pytest.raises(UsageError) as err:
        link_overrides({"inter_node_gbps": value}, lambda k: "--" + k.replace("_", "-"))
    text = str(err.value)
    assert text.startswith("--inter-node-gbps is GB/s a device") and "above 0 and at most 10,000" in text
    assert f"got {value!r}" in text and "e.g. 6.25" in text and "\n" not in text


@pytest.mark.parametrize(("name", "preset"), [
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100 80GB PCIe", "a100-80gb"), ("NVIDIA A100-SXM4", "a100-80gb"),
    ("Tesla V100-SXM2-16GB", "v100-16gb"), ("Tesla V100-PCIE-32GB", "v100-32gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("NVIDIA H200", "h200-141gb"), ("nvidia b200", "b200-180gb"), ("NVIDIA GeForce RTX 4090", None),
])
def test_a_cuda_devices_name_gives_its_preset(name: str, preset: str | None) -> None:
    from autoslapo.cluster import DEVICES, preset_for_device_name

    assert preset_for_device_name(name) == preset
    assert preset is None or preset in DEVICES
