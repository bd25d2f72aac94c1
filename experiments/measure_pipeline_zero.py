"""ZeRO over pipeline stages on CPU ranks: measured peak resident memory a rank vs the cost model's.

A GPT-2-style model whose gradients are a visible share of a rank's memory (hidden 768, 8 layers,
vocabulary 8,192, short sequences) trained for real by the runtime (``run_trial``: pp 2 x dp 2 =
4 gloo ranks, fp32, dropout 0) under ZeRO 0, 1 and 2. ZeRO-1 shards the optimizer state (torch's
``ZeroRedundancyOptimizer``); ZeRO-2 also reduces each micro-batch's gradients to their owners
(``autoslapo.runtime.engine.GradientOwners``), so a rank keeps its own parameters' gradients only,
and no flat copy of them for the data-parallel average. The prediction is
``estimate(...).memory_per_device_bytes`` on this machine's CPU profile
(``experiments/results/cost_model_profile_cpu.json``), as ``measure_lean_kernels.py`` uses.

Run: ``.venv/bin/python experiments/measure_pipeline_zero.py [--predict-only]``; writes
``experiments/results/pipeline_zero_cpu.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.cost.profile import load_profile
from autoslapo.models.spec import ModelSpec

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "pipeline_zero_cpu.txt"
PROFILE = RESULTS / "cost_model_profile_cpu.json"
MODEL = ModelSpec.from_name("gpt2-tiny").with_overrides(hidden=768, layers=8, heads=12, ffn=3072, vocab=8192,
                                                       seq_len=64)
BASE = {"pp": 2, "dp": 2, "micro_batch": 2, "grad_accum": 2, "precision": "fp32"}
STAGES = (0, 1, 2)


def predict(cfg: ScheduleConfig, prof: dict[str, Any]) -> int:
    cluster = ClusterSpec(gpus=cfg.world_size, gpu_type="cpu", gpus_per_node=cfg.world_size).with_profile(prof)
    return estimate(MODEL, cfg, cluster, profile=prof, dropout=False).memory_per_device_bytes


def measure(cfg: ScheduleConfig, steps: int) -> dict[str, Any]:
    from autoslapo.runtime import run_trial  # starts processes: only when measuring

    res = run_trial(MODEL, cfg, steps=steps, warmup=1, timeout_s=600, device="cpu", dropout=0.0)
    return {"status": res.status, "reason": res.reason, "peak": res.peak_memory_bytes,
            "samples_per_s": res.samples_per_s, "load": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--predict-only", action="store_true", help="print the predictions, run nothing")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps a trial (one is warm-up)")
    args = p.parse_args(argv)
    prof = load_profile(PROFILE)
    mib = 2**20
    rows = []
    for z in STAGES:
        cfg = ScheduleConfig(zero_stage=z, **BASE)
        row: dict[str, Any] = {"zero": z, "pred": predict(cfg, prof)}
        if not args.predict_only:
            row |= measure(cfg, args.steps)
        rows.append(row)
    lines = ["# ZeRO over pipeline stages on CPU ranks: peak RSS a rank, measured vs predicted", "",
             f"model: gpt2 h={MODEL.hidden} L={MODEL.layers} vocab={MODEL.vocab} seq={MODEL.seq_len} "
             f"({MODEL.num_params() / 1e6:.1f}M parameters); pp 2 x dp 2 CPU ranks (gloo), micro-batch 2, "
             "2 micro-batches a step, fp32, dropout 0",
             "prediction: estimate() on this machine's CPU profile (cost_model_profile_cpu.json); "
             "saving = ZeRO-0's peak - this one's; ratio = measured saving / predicted saving", "",
             f"{'zero':>4} {'meas MiB':>9} {'pred MiB':>9} {'error':>7} {'meas saving':>11} {'pred saving':>11} "
             f"{'ratio':>6} {'samples/s':>9} {'load':>5}"]
    base = rows[0]
    for r in rows:
        if args.predict_only or r.get("status") != "complete":
            lines.append(f"{r['zero']:>4} {'-':>9} {r['pred'] / mib:>9.0f}  {r.get('status', 'not run')}")
            continue
        ms, ps = base["peak"] - r["peak"], base["pred"] - r["pred"]
        ratio = f"{ms / ps:>6.2f}" if ps else f"{'-':>6}"
        lines.append(f"{r['zero']:>4} {r['peak'] / mib:>9.0f} {r['pred'] / mib:>9.0f} "
                     f"{(r['pred'] - r['peak']) / r['peak']:>+7.1%} {ms / mib:>11.0f} {ps / mib:>11.0f} {ratio} "
                     f"{r['samples_per_s']:>9.1f} {r['load']:>5.1f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if not args.predict_only:
        OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
