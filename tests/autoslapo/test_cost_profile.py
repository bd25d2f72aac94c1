"""The pure half of device profiles: fitting calibration measurements into profile keys."""

from __future__ import annotations

import pytest

from autoslapo.cost.profile import (
    CalibrationRun,
    combine_rank_measurements,
    fit_memory_calibration,
    fit_runtime_overheads,
)
from autoslapo.errors import UsageError


def test_fit_memory_calibration_recovers_planted_terms() -> None:
    # peak = fixed + states + s A + r F, with A = F for the plain runs and A = 100 MiB under checkpointing
    s, r, fixed, states = 1.3, 0.4, 300e6, 50e6
    full = {"b4": 200e6, "b16_ckpt": 800e6, "b16": 800e6}
    pred = {"b4": 200e6, "b16_ckpt": 100e6, "b16": 800e6}
    peaks = {k: int(fixed + states + s * pred[k] + r * full[k]) for k in pred}
    out = fit_memory_calibration(peaks, pred, states)
    assert out["activation_slack"] == pytest.approx(s, rel=1e-6)
    assert out["heap_retention"] == pytest.approx(r, rel=1e-5)
    assert out["fixed_overhead_bytes"] == pytest.approx(fixed, rel=1e-6)
    assert out["calibration_peaks"] == peaks


def _run(accum: int, zero: int, step: float, peak: int) -> CalibrationRun:
    return CalibrationRun(grad_accum=accum, zero_stage=zero, step_s=step, predicted_step_s=0.01,
                          peak_bytes=peak, predicted_bytes=100)


def test_fit_runtime_overheads() -> None:
    # residuals 0.05 (1 micro-batch) and 0.11 (4): 0.02 a micro-batch, 0.03 a step
    runs = [_run(1, 0, 0.06, 1100), _run(4, 0, 0.12, 1100), _run(1, 1, 0.06, 1300)]
    out = fit_runtime_overheads(runs)
    assert out["microbatch_overhead_s"] == pytest.approx(0.02)
    assert out["step_overhead_s"] == pytest.approx(0.03)
    assert (out["fixed_overhead_bytes"], out["zero_overhead_bytes"]) == (1000, 200)
    # a slowed 4-micro-batch trial cannot push the per-micro-batch figure past the 1-micro-batch residual
    slowed = fit_runtime_overheads([runs[0], _run(4, 0, 2.0, 1100), runs[2]])
    assert slowed["microbatch_overhead_s"] == pytest.approx(0.05) and slowed["step_overhead_s"] == 0.0
    with pytest.raises(UsageError, match=r"missing \[\(1, 1\)\]"):
        fit_runtime_overheads(runs[:2])


def test_combine_rank_measurements_takes_the_slowest_rank() -> None:
    def rank(rate: float, lat: float) -> dict[str, object]:
        return {"gemm_curve": [(1e9, rate), (8e9, 2 * rate)], "mem_curve": [(1e6, 10.0)], "hbm_gbps": 10.0 * rate,
                "op_latency_s": lat, "allreduce_small_s": 2 * lat, "allreduce_big_s": 0.1,
                "allreduce_big_bytes": 16 * 2**20, "rss_bytes": 500}

    out = combine_rank_measurements([rank(1.0, 1e-5), rank(0.5, 3e-5)], world=2)
    assert out["gemm_curve"] == [(1e9, 0.5), (8e9, 1.0)] and out["peak_tflops"] == 1.0
    assert out["op_latency_s"] == 3e-5 and out["coll_latency_s"] == pytest.approx(3e-5)
    assert out["hbm_gbps"] == 5.0 and out["fixed_overhead_bytes"] == 500
    assert out["intra_node_gbps"] == pytest.approx(16 * 2**20 / (0.1 - 6e-5) / 1e9)
