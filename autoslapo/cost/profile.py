"""Device profiles for the cost model: where they live, reading and writing them, and fitting them. Pure.

A profile is a JSON-safe dict of this machine's measured rates (``ClusterSpec.with_profile`` and
``DevicePerf.from_profile`` apply it). Measuring one runs rank processes and real trials, so that
lives beside the runtime (``autoslapo.runtime.profile.measure_profile``); this module holds what
needs no process: the default path, save/load, and the arithmetic that turns raw measurements
(per-rank benchmarks, peak memory of calibration steps, step times of calibration trials) into the
profile's keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoslapo.errors import UsageError

DEFAULT_DIR = Path("~/.cache/autoslapo/profiles")

__all__ = [
    "DEFAULT_DIR",
    "CalibrationRun",
    "combine_rank_measurements",
    "default_profile_path",
    "fit_memory_calibration",
    "fit_runtime_overheads",
    "load_profile",
    "save_profile",
]


def default_profile_path(gpu_type: str) -> Path:
    """Where a profile for ``gpu_type`` is saved by default."""
    return DEFAULT_DIR.expanduser() / f"{gpu_type}.json"


def save_profile(profile: dict[str, Any], path: Path) -> Path:
    """Write ``profile`` as JSON to ``path`` (parents created); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def load_profile(path: Path) -> dict[str, Any]:
    """Read a saved profile. Raises ``UsageError`` if it is missing or not a profile."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"profile not found: {path}; run `autoslapo profile` first") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"profile {path} is not readable JSON: {e}; re-run `autoslapo profile`") from None
    if not isinstance(data, dict) or "gpu_type" not in data:
        raise UsageError(f"{path} is not an autoslapo profile (no gpu_type); re-run `autoslapo profile`")
    return data


def fit_memory_calibration(
    peaks: Mapping[str, int], predicted: Mapping[str, float], states_bytes: float
) -> dict[str, Any]:
    """Activation slack, heap retention and fixed overhead from three training runs' peak memory.

    Takes the peak resident bytes and the cost model's predicted activation bytes of the runs
    ``b4`` (micro-batch 4), ``b16_ckpt`` (micro-batch 16, every layer checkpointed) and ``b16``
    (micro-batch 16), and the bytes of model states resident in the process. With ``A`` the
    predicted activations of a run and ``F`` those of the same run un-checkpointed, peak =
    fixed + states + s A + r F:

    * the two un-checkpointed runs (A = F) give the slope ``s + r``;
    * checkpointing at micro-batch 16 changes only A, which gives ``s`` (``activation_slack``:
      autograd's temporaries beyond the accounted tensors) and so ``r`` (``heap_retention``: what
      the allocator keeps of the activations every layer builds in forward and rebuilds in
      backward, see ``DevicePerf``);
    * the intercept, less the model states, is the process's fixed overhead.

    Returns the keys ``activation_slack``, ``heap_retention``, ``fixed_overhead_bytes`` and
    ``calibration_peaks``.
    """
    total = (peaks["b16"] - peaks["b4"]) / (predicted["b16"] - predicted["b4"])
    slack = (peaks["b16"] - peaks["b16_ckpt"]) / (predicted["b16"] - predicted["b16_ckpt"])
    # s may fall below 1: the transients the model counts at the backward peak (a layer's gradients)
    # are not all live at once in a checkpointed step
    total = max(total, 0.5)
    slack = min(max(slack, 0.5), total)
    retention = max(total - slack, 0.0)
    fixed = peaks["b4"] - (slack + retention) * predicted["b4"] - states_bytes
    return {"activation_slack": slack, "heap_retention": retention, "fixed_overhead_bytes": int(max(fixed, 0)),
            "calibration_peaks": dict(peaks)}


@dataclass(frozen=True)
class CalibrationRun:
    """One runtime-calibration trial: what it measured next to what the cost model predicts for it.

    ``grad_accum`` micro-batches a step under ZeRO ``zero_stage``; step times in seconds, memory in
    bytes; the prediction uses the profile's rates with no fixed cost.
    """

    grad_accum: int
    zero_stage: int
    step_s: float
    predicted_step_s: float
    peak_bytes: int
    predicted_bytes: int


def fit_runtime_overheads(runs: Sequence[CalibrationRun]) -> dict[str, Any]:
    """The runtime's fixed costs from calibration trials of a tiny model (almost all fixed cost).

    Takes three runs: 1 and 4 micro-batches without ZeRO, 1 micro-batch with ZeRO-1. The step
    time less the prediction, at 1 and 4 micro-batches, gives a cost a step and a cost a
    micro-batch; the first run's peak memory less the prediction is the process's fixed memory;
    the ZeRO-1 run's excess over that is what DeepSpeed's ZeRO optimizer adds. Returns the keys
    ``step_overhead_s``, ``microbatch_overhead_s``, ``fixed_overhead_bytes``,
    ``zero_overhead_bytes`` and the raw figures. Raises ``UsageError`` when a run is missing.
    """
    by_key = {(r.grad_accum, r.zero_stage): r for r in runs}
    missing = [k for k in ((1, 0), (4, 0), (1, 1)) if k not in by_key]
    if missing:
        raise UsageError(f"runtime calibration needs runs (grad_accum, zero_stage) (1, 0), (4, 0) and (1, 1): "
                         f"missing {missing}; run all three")
    one, four, zero = by_key[1, 0], by_key[4, 0], by_key[1, 1]
    fixed = int(max(one.peak_bytes - one.predicted_bytes, 0))
    residual = {1: one.step_s - one.predicted_step_s, 4: four.step_s - four.predicted_step_s}
    # A one-micro-batch step carries one micro-batch's overhead: its residual bounds the figure (a
    # loaded machine can slow the 4-micro-batch trial alone and inflate the difference).
    per_mb = min(max((residual[4] - residual[1]) / 3, 0.0), max(residual[1], 0.0))
    return {
        "calibration_step_s_accum1": one.step_s,
        "calibration_step_s_accum4": four.step_s,
        "calibration_peak_rss_bytes": one.peak_bytes,
        "calibration_peak_rss_bytes_zero1": zero.peak_bytes,
        "fixed_overhead_bytes": fixed,
        "zero_overhead_bytes": int(max(zero.peak_bytes - zero.predicted_bytes - fixed, 0)),
        "microbatch_overhead_s": per_mb,
        "step_overhead_s": max(residual[1] - per_mb, 0.0),
    }


def combine_rank_measurements(ranks: Sequence[Mapping[str, Any]], world: int) -> dict[str, Any]:
    """The rate keys of a profile from each rank's raw benchmarks, measured concurrently.

    The slowest rank governs a synchronous step: take the minimum rate and the maximum latency. The
    ring allreduce's per-hop latency comes from a small message and its bandwidth from a large one
    (big = 2 (p-1)/p * n / bw + 2 (p-1) * hop). Returns ``peak_tflops``, ``gemm_curve``,
    ``hbm_gbps``, ``mem_curve``, ``op_latency_s``, ``coll_latency_s``, the link bandwidths and the
    memory-calibration keys.
    """
    curve = [(ranks[0]["gemm_curve"][i][0], min(r["gemm_curve"][i][1] for r in ranks))
             for i in range(len(ranks[0]["gemm_curve"]))]
    small = max(r["allreduce_small_s"] for r in ranks)
    big = max(r["allreduce_big_s"] for r in ranks)
    nbytes = ranks[0]["allreduce_big_bytes"]
    steps = 2 * (world - 1)
    hop = small / max(1, steps)
    bw = (2 * (world - 1) / world * nbytes) / max(big - steps * hop, 1e-9) / 1e9 if world > 1 else 1.0
    peak = max(r for _, r in curve)
    return {
        "peak_tflops": peak,
        "peak_tflops_fp32": peak,
        "gemm_curve": curve,
        "hbm_gbps": min(r["hbm_gbps"] for r in ranks),
        "mem_curve": [(ranks[0]["mem_curve"][i][0], min(r["mem_curve"][i][1] for r in ranks))
                      for i in range(len(ranks[0]["mem_curve"]))],
        "op_latency_s": max(r["op_latency_s"] for r in ranks),
        "coll_latency_s": hop,
        "intra_node_gbps": bw,
        "inter_node_gbps": bw,
        "comm_eff": 1.0,
        # measured by a training step where the model builder exists; else the loaded stack's RSS
        "fixed_overhead_bytes": int(max(r.get("fixed_overhead_bytes") or r["rss_bytes"] for r in ranks)),
        "activation_slack": max(r.get("activation_slack", 1.0) for r in ranks),
        "heap_retention": max(r.get("heap_retention", 0.0) for r in ranks),
    }
