"""The cost model on the T5 family against real trials of ``t5-tiny`` on 2 CPU ranks.

A few layouts T5 runs (dp 2, tp 2, tp 2 with every block of both stacks recomputed, ZeRO-1 with eager
attention) are trained for real by the runtime (``run_trial``, median of the timed steps, fp32,
dropout 0) and estimated with this machine's committed profile
(``experiments/results/cost_model_profile_cpu.json``, from ``validate_cost_model.py``). Printed and
written to ``experiments/results/t5_cost_validation.txt``: predicted and measured samples/s and peak
memory a rank. The shared machine's load moves the measured throughputs (recorded per trial).

Run: ``.venv/bin/python experiments/validate_t5_cost.py [--steps N] [--warmup N]``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.models.spec import ModelSpec
from autoslapo.runtime import run_trial

RESULTS = Path(__file__).parent / "results"
PROFILE = RESULTS / "cost_model_profile_cpu.json"
OUT = RESULTS / "t5_cost_validation.txt"

CONFIGS = [
    ScheduleConfig(dp=2, micro_batch=4, precision="fp32"),
    ScheduleConfig(tp=2, micro_batch=4, precision="fp32"),
    ScheduleConfig(tp=2, micro_batch=4, precision="fp32", ckpt_ratio=1.0),
    ScheduleConfig(dp=2, micro_batch=8, precision="fp32", zero_stage=1, attn_kernel="eager"),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args(argv)
    model = ModelSpec.from_name("t5-tiny")
    prof = json.loads(PROFILE.read_text())
    lines = [f"t5-tiny ({model.layers}+{model.decoder_layers} blocks, h={model.hidden}, heads={model.heads}x"
             f"{model.head_dim}, source {model.seq_len}, target {model.decoder_seq_len} tokens) on 2 CPU ranks, "
             f"profile {PROFILE.name}",
             f"{'tp':>2} {'dp':>2} {'mb':>3} {'ckpt':>4} {'zero':>4} {'attn':>5} {'pred/s':>8} {'meas/s':>8} "
             f"{'err':>7} {'pred MiB':>9} {'meas MiB':>9} {'err':>7} {'load':>5}"]
    for cfg in CONFIGS:
        cluster = ClusterSpec(gpus=2, gpu_type="cpu", gpus_per_node=2).with_profile(prof)
        est = estimate(model, cfg, cluster, profile=prof, dropout=False)
        load = os.getloadavg()[0]
        res = run_trial(model, cfg, steps=args.steps, warmup=args.warmup, timeout_s=900, device="cpu", dropout=0.0)
        head = f"{cfg.tp:>2} {cfg.dp:>2} {cfg.micro_batch:>3} {cfg.ckpt_ratio:>4} {cfg.zero_stage:>4} {cfg.attn_kernel:>5} "
        if res.status != "complete" or not res.samples_per_s or not res.peak_memory_bytes:
            lines.append(head + f"{est.samples_per_s:>8.1f}  {res.status}: {res.reason[:80]}")
        else:
            pm, mm = est.memory_per_device_bytes, res.peak_memory_bytes
            lines.append(head + f"{est.samples_per_s:>8.1f} {res.samples_per_s:>8.1f} "
                         f"{est.samples_per_s / res.samples_per_s - 1:>+7.1%} {pm / 2**20:>9.0f} {mm / 2**20:>9.0f} "
                         f"{pm / mm - 1:>+7.1%} {load:>5.1f}")
        print(lines[-1], flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
