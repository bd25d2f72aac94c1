"""Exhaustive search over schedules with the cost model: ``candidate_configs``, ``sweep``, ``best_config``.

Pure. Every knob left free is enumerated over its valid values for the model and cluster: TP
degrees that divide the heads and the MLP width and stay within a node, pipeline degrees that
divide the layers, micro-batches in powers of two, checkpoint ratios in quarters, ZeRO stages
(0-1 with pipelines), attention kernels the device has, sequence parallelism when TP > 1. The
batch: ``global_batch`` fixes the micro-batches per step; without it a step runs one micro-batch
per replica (``4 pp`` with pipelines, so the bubble stays small). For a fixed layout, a larger
micro-batch never needs less memory, so the search stops growing it at the first that does not fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autoslapo.config import ScheduleConfig
from autoslapo.cost.device import DevicePerf, device_perf
from autoslapo.cost.estimate import Estimate, estimate
from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CKPT_RATIOS = (0.0, 0.25, 0.5, 0.75, 1.0)
KNOBS = ("tp", "pp", "dp", "micro_batch", "grad_accum", "ckpt_ratio", "zero_stage", "attn_kernel",
         "sequence_parallel", "precision", "pipeline_schedule", "virtual_stages", "compile_layers",
         "fuse_bias_gelu", "ckpt_placement")


def default_precision(cluster: ClusterSpec) -> str:
    """bf16 where the device has it (GPUs), fp16 on V100, fp32 on CPU ranks."""
    if cluster.gpu_type == "cpu":
        return "fp32"
    return "bf16" if cluster.device.bf16 else "fp16"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _layouts(model: ModelSpec, cluster: ClusterSpec, fixed: dict[str, Any]) -> Iterator[tuple[int, int, int]]:
    g = cluster.gpus
    for tp in _divisors(g):
        if "tp" in fixed and tp != fixed["tp"]:
            continue
        if model.heads % tp or model.kv_heads % tp or model.ffn % tp:
            continue
        if tp > cluster.devices_per_node and not cluster.allow_cross_node_tp:
            continue
        for pp in _divisors(g // tp):
            if "pp" in fixed and pp != fixed["pp"]:
                continue
            if model.layers % pp:
                continue
            dp = g // (tp * pp)
            if "dp" in fixed and dp != fixed["dp"]:
                continue
            yield tp, pp, dp


def candidate_configs(model: ModelSpec, cluster: ClusterSpec, *, global_batch: int | None = None,
                      **fixed: Any) -> Iterator[list[ScheduleConfig]]:
    """Valid configs, grouped by everything but the micro-batch (each group in growing micro-batch).

    ``fixed`` pins knobs by ScheduleConfig field name; unknown names raise ``ConfigError``.
    """
    bad = sorted(set(fixed) - set(KNOBS))
    if bad:
        raise ConfigError(f"unknown knobs {bad}; valid knobs are {sorted(KNOBS)}")
    fixed = {k: v for k, v in fixed.items() if v is not None}
    dev = cluster.device
    precision = fixed.get("precision", default_precision(cluster))
    kernels: list[Any] = [fixed["attn_kernel"]] if "attn_kernel" in fixed else (
        ["eager", "sdpa", "flash"] if dev.flash_attention else ["eager", "sdpa"])
    ckpts = [fixed["ckpt_ratio"]] if "ckpt_ratio" in fixed else list(CKPT_RATIOS)
    mbs = [fixed["micro_batch"]] if "micro_batch" in fixed else list(MICRO_BATCHES)
    base = {k: fixed[k] for k in ("compile_layers", "fuse_bias_gelu", "ckpt_placement") if k in fixed}
    for tp, pp, dp in _layouts(model, cluster, fixed):
        zeros = [fixed["zero_stage"]] if "zero_stage" in fixed else ([0, 1] if pp > 1 else [0, 1, 2, 3])
        sps = [fixed["sequence_parallel"]] if "sequence_parallel" in fixed else (
            [False, True] if tp > 1 and model.seq_len % tp == 0 else [False])
        sched = fixed.get("pipeline_schedule", "1f1b")
        vs = fixed.get("virtual_stages", 2 if sched == "interleaved" else 1)
        for zero in zeros:
            if pp > 1 and zero >= 2:
                continue
            for attn in kernels:
                for sp in sps:
                    for ckpt in ckpts:
                        group = []
                        for mb in mbs:
                            if global_batch is not None:
                                if global_batch % (mb * dp):
                                    continue
                                ga = global_batch // (mb * dp)
                            else:
                                ga = fixed.get("grad_accum", 4 * pp if pp > 1 else 1)
                            try:
                                cfg = ScheduleConfig(
                                    tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=ga, ckpt_ratio=ckpt,
                                    zero_stage=zero, attn_kernel=attn, sequence_parallel=sp,
                                    pipeline_schedule=sched, virtual_stages=vs, precision=precision,
                                    **base,
                                ).validate(model, cluster)
                            except ConfigError:
                                continue
                            group.append(cfg)
                        if group:
                            yield group


def sweep(model: ModelSpec, cluster: ClusterSpec, configs: Iterable[ScheduleConfig], *,
          profile: dict[str, Any] | None = None) -> list[Estimate]:
    """Estimates for many configs (assumed valid: they are not re-validated), sharing one device model."""
    perf = device_perf(cluster, profile)
    return [estimate(model, c, cluster, perf=perf, validate=False) for c in configs]


def best_config(model: ModelSpec, cluster: ClusterSpec, *, global_batch: int | None = None,
                profile: dict[str, Any] | None = None, perf: DevicePerf | None = None,
                **fixed: Any) -> Estimate:
    """The schedule with the highest predicted samples/s that fits, over every free knob.

    Takes knobs to pin (``tp=8``, ``zero_stage=1`` ...) and optionally the global batch.
    Returns its ``Estimate``. Raises ``ConfigError`` when no valid config exists, or when none
    fits in memory (naming the smallest footprint found).
    """
    perf = perf or device_perf(cluster, profile)
    best: Estimate | None = None
    smallest: Estimate | None = None
    seen = 0
    for group in candidate_configs(model, cluster, global_batch=global_batch, **fixed):
        for cfg in group:
            est = estimate(model, cfg, cluster, perf=perf, validate=False)
            seen += 1
            if not est.fits:
                if smallest is None or est.memory_per_device_bytes < smallest.memory_per_device_bytes:
                    smallest = est
                break  # larger micro-batches of this layout need more memory still
            if best is None or (est.samples_per_s, -est.memory_per_device_bytes) > (
                    best.samples_per_s, -best.memory_per_device_bytes):
                best = est
    if best is not None:
        return replace(best, breakdown={**best.breakdown, "searched": seen})
    if smallest is None:
        raise ConfigError(
            f"no valid schedule for {model.preset} on {cluster.gpus} x {cluster.gpu_type} with {fixed}"
            f"{'' if global_batch is None else f' and global batch {global_batch}'}; relax the fixed knobs"
        )
    raise ConfigError(
        f"no schedule fits in memory: the smallest needs {smallest.memory_per_device_bytes / 2**30:.1f} "
        f"GiB per device, {cluster.gpu_type} has {cluster.memory_bytes / 2**30:.1f} GiB; use more or "
        f"larger devices, or a smaller model"
    )
