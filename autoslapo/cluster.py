"""``ClusterSpec``: how many devices of which kind, and how they are connected. Pure data.

Device presets carry published figures: memory, dense 16-bit tensor-core peak (bf16/fp16), fp32
peak, and per-GPU link bandwidths (NVLink within a node; the node's network share across nodes).
A profile measured by ``autoslapo profile`` overrides them for its device (see ``with_profile``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from autoslapo.errors import ConfigError, UsageError

GiB = 1024**3
MiB = 1024**2

# Bounds that only typos and absurd values reach: the largest machines built have a few hundred
# thousand GPUs, and the largest NVLink domain announced (NVL576) 576 GPUs.
MAX_GPUS = 2**20  # 1,048,576
MAX_GPUS_PER_NODE = 1024
_LIMITS = {"gpus": (MAX_GPUS, "2**20, beyond the largest machines built"),
           "gpus_per_node": (MAX_GPUS_PER_NODE, "beyond the largest NVLink domain, 576 GPUs")}


def cli_flag(name: str) -> str:
    """The command-line flag of a cluster field or link: ``inter_node_gbps`` -> ``--inter-node-gbps``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator kind. Bandwidths are GB/s per device, one direction (what a ring sees)."""

    name: str
    memory_bytes: int
    peak_tflops: float  # dense bf16/fp16 tensor-core peak
    peak_tflops_fp32: float
    intra_node_gbps: float
    inter_node_gbps: float
    flash_attention: bool
    bf16: bool
    #: TensorFloat-32 tensor cores (Ampere and later: half the 16-bit dense peak, per the A100 and
    #: H100 datasheets, 156 of 312 and 495 of 989 TFLOP/s), which PyTorch's cuDNN convolutions use
    #: for fp32 tensors by default (``torch.backends.cudnn.allow_tf32``; its matmuls do not).
    tf32: bool = False
    #: Special-function results (exp2, rsqrt, ...) a second, 10^12: 16 a clock an SM on compute
    #: capability 7.0-10.0 (CUDA C++ Programming Guide, arithmetic instruction throughput), a quarter
    #: of V100's and A100's 64 FP32 lanes an SM (fp32 peak / 8) and an eighth of H100's and B200's
    #: 128 (fp32 peak / 16; H100: 3.9, as Shah et al. 2024 give it). A GPU's fused attention runs
    #: its softmax's exponentials on them (``autoslapo.cost.kernels``).
    sfu_tops: float = 0.0


# Sources: NVIDIA V100/A100/H100/H200 datasheets (dense, no sparsity); NVLink 2/3/4 per-GPU
# bandwidth (150/300/450 GB/s one way); inter-node: 8x HDR/NDR InfiniBand per DGX node shared by
# 8 GPUs (25 / 50 GB/s per GPU); V100: p3dn nodes, 100 Gb/s EFA per node (1.56 GB/s per GPU).
# B200: the HGX B200 datasheet's figures a GPU (its 16-bit and TF32 tensor-core rates are quoted
# with sparsity, 4.5 and 2.2 PFLOP/s: dense is half; fp32 75 TFLOP/s; 180 GB of HBM3e, of which
# nvidia-smi reports 183,359 MiB), NVLink 5 (1.8 TB/s both ways, 900 one way) and a DGX B200's
# eight 400 Gb/s ConnectX-7 ports (50 GB/s a GPU).
DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        DeviceSpec("v100-16gb", 16160 * MiB, 125.0, 15.7, 150.0, 1.5625, False, False, sfu_tops=1.96),
        DeviceSpec("v100-32gb", 32510 * MiB, 125.0, 15.7, 150.0, 1.5625, False, False, sfu_tops=1.96),
        DeviceSpec("a100-40gb", 40960 * MiB, 312.0, 19.5, 300.0, 25.0, True, True, tf32=True, sfu_tops=2.44),
        DeviceSpec("a100-80gb", 81920 * MiB, 312.0, 19.5, 300.0, 25.0, True, True, tf32=True, sfu_tops=2.44),
        DeviceSpec("h100-80gb", 81559 * MiB, 989.0, 67.0, 450.0, 50.0, True, True, tf32=True, sfu_tops=3.9),
        DeviceSpec("h200-141gb", 143771 * MiB, 989.0, 67.0, 450.0, 50.0, True, True, tf32=True, sfu_tops=3.9),
        DeviceSpec("b200-180gb", 183359 * MiB, 2250.0, 75.0, 900.0, 50.0, True, True, tf32=True, sfu_tops=4.7),
        # A CPU rank of this kind of machine (2 cores, 24 GiB, gloo over loopback). Rough defaults:
        # `autoslapo profile` measures the real figures and `with_profile` applies them.
        DeviceSpec("cpu", 12 * GiB, 0.05, 0.05, 1.0, 1.0, False, True),
    ]
}

#: The device preset of a described cluster when none is named (``estimate``, ``tune --backend sim``,
#: the service).
DEFAULT_GPU_TYPE = "a100-80gb"


def preset_for_device_name(name: str) -> str | None:
    """The device preset of a CUDA device by the name nvidia-smi or torch gives it ("NVIDIA
    A100-SXM4-40GB" -> "a100-40gb"): its generation, then the size the name states, else that
    generation's largest; None for a device without a preset."""
    lowered = name.lower().replace(" ", "")
    presets = [d for d in DEVICES if "-" in d and d.split("-", 1)[0] in lowered]
    return next((d for d in presets if d.split("-", 1)[1] in lowered), presets[-1]) if presets else None


# A cluster's links, as its user may describe them when they are not the preset's (a node with
# fewer NICs than a DGX, PCIe instead of NVLink): field -> what it is. GB/s a device, one direction.
LINKS: dict[str, str] = {
    "intra_node_gbps": "within a node (NVLink or PCIe)",
    "inter_node_gbps": "across nodes (the node's network shared by its devices)",
}
# an example value a person may write for each link (named in the error for a bad one)
LINK_EXAMPLES: dict[str, str] = {
    "intra_node_gbps": "e.g. 32 for PCIe 4.0 x16 between the GPUs",
    "inter_node_gbps": "e.g. 6.25 for a node's 4x 100 Gb/s NICs shared by 8 GPUs",
}
MAX_LINK_GBPS = 10_000.0  # beyond any link built (NVLink 5: 900 GB/s a GPU one way)


def link_overrides(given: Mapping[str, Any], name: Callable[[str], str]) -> dict[str, float]:
    """The link bandwidths a user gave (None: the preset's), checked; ``name(field)`` is how that user
    writes a field (``--inter-node-gbps`` on the command line, ``inter_node_gbps`` in a request)."""
    out: dict[str, float] = {}
    for key in LINKS:
        value = given.get(key)
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not 0 < value <= MAX_LINK_GBPS:
            raise UsageError(f"{name(key)} is GB/s a device, one direction, {LINKS[key]}: it must be above 0 and "
                             f"at most {MAX_LINK_GBPS:,.0f}, got {value!r}; {LINK_EXAMPLES[key]}, or leave it out for the "
                             "preset's")
        out[key] = float(value)
    return out


def links_text(values: Mapping[str, float]) -> str:
    """Link bandwidths for a person: ``{"inter_node_gbps": 6.25}`` -> "inter-node 6.25 GB/s"."""
    return ", ".join(f"{key.split('_')[0]}-node {float(v):g} GB/s" for key, v in values.items() if key in LINKS)


@dataclass(frozen=True)
class ClusterSpec:
    """``gpus`` devices of ``gpu_type``, ``gpus_per_node`` to a node.

    Device figures left at 0 are filled from the preset. TP stays within a node unless
    ``allow_cross_node_tp``. Validated on construction; round-trips through ``to_dict``.
    """

    gpus: int
    gpu_type: str = DEFAULT_GPU_TYPE
    gpus_per_node: int = 8
    memory_bytes: int = 0
    peak_tflops: float = 0.0
    peak_tflops_fp32: float = 0.0
    intra_node_gbps: float = 0.0
    inter_node_gbps: float = 0.0
    allow_cross_node_tp: bool = False

    def __post_init__(self) -> None:
        if self.gpu_type not in DEVICES:
            close = difflib.get_close_matches(self.gpu_type, list(DEVICES), n=2, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(
                f"--gpu-type must be one of {', '.join(DEVICES)}: got {self.gpu_type!r}{hint}"
            )
        for name, (limit, why) in _LIMITS.items():
            v = getattr(self, name)
            flag = cli_flag(name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UsageError(f"{flag} must be a positive integer: got {v!r}")
            if v > limit:
                raise UsageError(f"{flag} must be at most {limit:,} ({why}): got {v:,}; give a smaller {flag}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise UsageError(
                f"--gpus must fill whole nodes: got --gpus {self.gpus} with --gpus-per-node "
                f"{self.gpus_per_node} ({self.gpus / self.gpus_per_node:.2f} nodes); use a multiple of "
                f"{self.gpus_per_node} or change --gpus-per-node"
            )
        dev = DEVICES[self.gpu_type]
        for name in ("memory_bytes", "peak_tflops", "peak_tflops_fp32", "intra_node_gbps", "inter_node_gbps"):
            v = getattr(self, name)
            if v < 0:
                raise UsageError(f"{name} must not be negative: got {v}")
            if not v:
                object.__setattr__(self, name, getattr(dev, name))

    @property
    def device(self) -> DeviceSpec:
        return DEVICES[self.gpu_type]

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)

    @property
    def devices_per_node(self) -> int:
        """Devices actually in one node (fewer than ``gpus_per_node`` on a partial single node)."""
        return min(self.gpus, self.gpus_per_node)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict; ``ClusterSpec.from_dict(c.to_dict()) == c``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClusterSpec:
        """Inverse of ``to_dict``; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown cluster spec keys {unknown}; valid keys are {sorted(known)}")
        return cls(**d)

    def fingerprint(self) -> str:
        """Stable hash of what the cost model depends on (size, device figures, links)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @classmethod
    def described(cls, gpus: int, gpu_type: str | None = None, gpus_per_node: int | None = None, *,
                  allow_cross_node_tp: bool = False, links: Mapping[str, float] | None = None) -> ClusterSpec:
        """The cluster an estimate describes: ``gpu_type`` defaults to an A100-80GB, ``gpus_per_node``
        to every device of a CPU machine, else to 8 (or ``gpus`` when fewer); ``links``: bandwidths
        that replace the preset's (``link_overrides``)."""
        gpu_type = gpu_type or DEFAULT_GPU_TYPE
        per_node = gpus_per_node if gpus_per_node is not None else (gpus if gpu_type == "cpu" else min(8, gpus))
        return cls(gpus=gpus, gpu_type=gpu_type, gpus_per_node=per_node,
                   allow_cross_node_tp=allow_cross_node_tp).with_links(links or {})

    def link_values(self) -> dict[str, float]:
        """The link bandwidths that are not the device preset's (``{"inter_node_gbps": 6.25}``; {} if none)."""
        return {key: getattr(self, key) for key in LINKS if getattr(self, key) != getattr(self.device, key)}

    def own_links(self) -> str:
        """The links that are not the device preset's, for a person: "inter-node 6.25 GB/s" ("" if none)."""
        return links_text(self.link_values())

    def described_as(self) -> str:
        """"64 x a100-80gb", with the links that are not the preset's: "64 x a100-80gb (inter-node 6.25 GB/s)"."""
        own = self.own_links()
        return f"{self.gpus} x {self.gpu_type}" + (f" ({own})" if own else "")

    def with_links(self, links: Mapping[str, float]) -> ClusterSpec:
        """The same cluster with the link bandwidths ``links`` gives (``link_overrides``); others kept."""
        return replace(self, intra_node_gbps=links.get("intra_node_gbps", self.intra_node_gbps),
                       inter_node_gbps=links.get("inter_node_gbps", self.inter_node_gbps))

    def with_gpus(self, gpus: int) -> ClusterSpec:
        """The same cluster with another device count."""
        return replace(self, gpus=gpus)

    def with_profile(self, profile: dict[str, Any]) -> ClusterSpec:
        """Override the device figures with a measured profile (keys as in this class)."""
        keys = ("memory_bytes", "peak_tflops", "peak_tflops_fp32", "intra_node_gbps", "inter_node_gbps")
        return replace(self, **{k: profile[k] for k in keys if profile.get(k)})
