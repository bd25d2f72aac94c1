"""Measure a landscape: run every configuration of a reduced space once, for real, on CPU ranks.

Writes one CSV row per configuration (config JSON, result JSON, model and cluster JSON) to
``experiments/data/landscape_<model>_<ranks>cpu.csv``; rerunning skips the rows already there,
so an interrupted measurement continues. ``bench_tuner.py --measured CSV`` replays it.

Usage: python experiments/measure_landscape.py [--model bert-tiny] [--ranks 4] [--steps 4] [--limit N]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from search_spaces import space_from_dict
from tuner.evaluators import LocalEvaluator, cost_prior

# What a 2-core machine can measure in a few hours: every layout of 4 ranks, a few micro-batches,
# none/half/full checkpointing, ZeRO 0-2 and both CPU attention kernels. Knobs added since the
# landscape was measured stay at the values it ran with (a space searches every knob it does not pin).
SPACE = {
    "name": "landscape",
    "knobs": {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch": [1, 2, 4], "ckpt_ratio": [0.0, 0.5, 1.0],
              "zero_stage": [0, 1, 2], "attn_kernel": ["eager", "sdpa"], "ckpt_granularity": ["full"],
              "loss_kernel": ["eager"]},
    "rules": {"batch_per_gpu": 4},
}
FIELDS = ["hash", "config", "status", "samples_per_s", "result", "model", "cluster", "seconds"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-tiny")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--limit", type=int, default=None, help="measure at most N new configurations")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = ModelSpec.from_name(args.model)
    cluster = ClusterSpec(gpus=args.ranks, gpu_type="cpu", gpus_per_node=args.ranks)
    bound = space_from_dict(SPACE).bind(model, cluster)
    prior = cost_prior(model, cluster, runtime_device="cpu")
    configs = [c for c in bound.configs() if prior(c).fits]
    out = args.out or Path(f"experiments/data/landscape_{model.preset}_{args.ranks}cpu.csv")
    out.parent.mkdir(parents=True, exist_ok=True)
    done: set[str] = set()
    if out.exists():
        with out.open() as f:
            done = {ScheduleConfig.from_dict(json.loads(row["config"])).config_hash() for row in csv.DictReader(f)}
    todo = [c for c in configs if c.config_hash() not in done][: args.limit]
    print(f"{len(configs)} runnable configurations, {len(done)} measured, {len(todo)} to go", flush=True)
    ev = LocalEvaluator(model, cluster, steps=args.steps, timeout_s=args.timeout)
    new = not out.exists()
    with out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        for i, c in enumerate(todo, 1):
            t0 = time.monotonic()
            r = ev.evaluate(c)
            dt = time.monotonic() - t0
            w.writerow({"hash": c.config_hash(), "config": json.dumps(c.to_dict()), "status": r.status,
                        "samples_per_s": r.samples_per_s, "result": json.dumps(r.to_dict()),
                        "model": json.dumps(model.to_dict()), "cluster": json.dumps(cluster.to_dict()),
                        "seconds": f"{dt:.1f}"})
            f.flush()
            print(f"[{i}/{len(todo)}] {r.status} {r.samples_per_s:.1f} samples/s {dt:.0f}s "
                  f"tp={c.tp} pp={c.pp} mb={c.micro_batch} ckpt={c.ckpt_ratio} zero={c.zero_stage} "
                  f"attn={c.attn_kernel} {r.reason[:80]}", flush=True)
    return 0


def _check_space() -> list[ScheduleConfig]:
    """The configurations the default landscape holds (for a quick look without running)."""
    model = ModelSpec.from_name("bert-tiny")
    cluster = ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)
    return space_from_dict(SPACE).bind(model, cluster).configs()


if __name__ == "__main__":
    raise SystemExit(main())
