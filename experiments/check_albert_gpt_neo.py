"""ALBERT and GPT-Neo: the cost model against real trials of their tiny presets on 2 CPU ranks.

Each configuration is trained for real by the runtime (``run_trial``: gloo, fp32, dropout 0, median
of the timed steps, peak resident memory a rank) and estimated with this machine's committed
profile (``experiments/results/cost_model_profile_cpu.json``, from ``autoslapo profile``). ALBERT's
rows check a shared layer (weights stored once, compute and activations paid per call, its calls
checkpointed); GPT-Neo's its local attention layers under TP and PP. Targets, as the local part of
``validate_cost_model.py``: peak memory within 15 % a row; throughput ranked with Spearman >= 0.9
within each model.

Run: ``.venv/bin/python experiments/check_albert_gpt_neo.py``; writes
``experiments/results/check_albert_gpt_neo.txt``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

from scipy.stats import spearmanr

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.models.spec import ModelSpec
from autoslapo.runtime import run_trial

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "check_albert_gpt_neo.txt"
PROFILE = RESULTS / "cost_model_profile_cpu.json"

F = "fp32"
ALBERT = ModelSpec.from_name("albert-tiny")
NEO = ModelSpec.from_name("gpt-neo-tiny")
CONFIGS: list[tuple[ModelSpec, ScheduleConfig]] = [
    (ALBERT, ScheduleConfig(dp=2, micro_batch=2, precision=F)),
    (ALBERT, ScheduleConfig(dp=2, micro_batch=8, precision=F)),
    (ALBERT, ScheduleConfig(dp=2, micro_batch=16, ckpt_ratio=0.5, precision=F)),
    (ALBERT, ScheduleConfig(dp=2, micro_batch=16, ckpt_ratio=1.0, zero_stage=1, precision=F)),
    (ALBERT, ScheduleConfig(tp=2, micro_batch=8, precision=F)),
    (NEO, ScheduleConfig(dp=2, micro_batch=2, precision=F)),
    (NEO, ScheduleConfig(dp=2, micro_batch=8, precision=F)),
    (NEO, ScheduleConfig(dp=2, micro_batch=16, ckpt_ratio=0.5, attn_kernel="eager", precision=F)),
    (NEO, ScheduleConfig(tp=2, micro_batch=8, precision=F)),
    (NEO, ScheduleConfig(pp=2, micro_batch=4, grad_accum=2, precision=F)),
]


def main() -> int:
    prof = json.loads(PROFILE.read_text())
    lines = ["# ALBERT and GPT-Neo tiny presets: real trials on 2 CPU ranks vs the cost model (committed CPU profile)",
             f"{'model':13} {'tp':>2} {'pp':>2} {'dp':>2} {'mb':>3} {'ga':>3} {'ckpt':>4} {'zero':>4} {'attn':>5} "
             f"{'pred/s':>8} {'meas/s':>8} {'pred MiB':>9} {'meas MiB':>9} {'mem err':>8} {'load':>5}"]
    per_model: dict[str, tuple[list[float], list[float]]] = {}
    mem_err: list[float] = []
    for model, cfg in CONFIGS:
        load0 = os.getloadavg()[0]
        res = run_trial(model, cfg, steps=6, warmup=2, timeout_s=600, device="cpu", dropout=0.0)
        cluster = ClusterSpec(gpus=cfg.world_size, gpu_type="cpu", gpus_per_node=cfg.world_size).with_profile(prof)
        est = estimate(model, cfg, cluster, profile=prof, dropout=False)
        head = (f"{model.preset:13} {cfg.tp:>2} {cfg.pp:>2} {cfg.dp:>2} {cfg.micro_batch:>3} {cfg.grad_accum:>3} "
                f"{cfg.ckpt_ratio:>4} {cfg.zero_stage:>4} {cfg.attn_kernel:>5} ")
        if res.status != "complete":
            lines.append(head + f"{est.samples_per_s:>8.1f}  {res.status}: {res.reason[:80]}")
            print(lines[-1], flush=True)
            continue
        pm, mm = est.memory_per_device_bytes, res.peak_memory_bytes or 0
        err = pm / mm - 1 if mm else float("nan")
        mem_err.append(abs(err))
        preds, meas = per_model.setdefault(model.preset, ([], []))
        preds.append(est.samples_per_s)
        meas.append(res.samples_per_s or 0.0)
        load = statistics.fmean([load0, os.getloadavg()[0]])
        lines.append(head + f"{est.samples_per_s:>8.1f} {res.samples_per_s:>8.1f} {pm / 2**20:>9.0f} "
                     f"{mm / 2**20:>9.0f} {err:>+8.1%} {load:>5.1f}")
        print(lines[-1], flush=True)
    ok = bool(mem_err) and max(mem_err) <= 0.15
    lines.append(f"peak memory error mean {statistics.fmean(mem_err):.1%}, max {max(mem_err):.1%} (target <= 15%): "
                 f"{'PASS' if ok else 'FAIL'}")
    for name, (preds, meas) in per_model.items():
        rho = float(spearmanr(preds, meas).statistic) if len(preds) >= 3 else float("nan")
        ok = ok and rho >= 0.9
        lines.append(f"{name}: throughput Spearman {rho:.3f} over {len(preds)} configurations (target >= 0.9): "
                     f"{'PASS' if rho >= 0.9 else 'FAIL'}")
    lines.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, shared")
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
