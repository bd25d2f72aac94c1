"""Memory-lean kernels on CPU ranks: measured peak resident memory saving vs the cost model's prediction.

For every model family's tiny preset, at a shape where the saving is visible (a longer sequence, a
larger vocabulary, micro-batch 8; still a few seconds a step on CPU), train each configuration for
real with the runtime (``run_trial``: gloo ranks, fp32, dropout 0) and compare its peak RSS a rank
with a baseline:

- ``loss_kernel``: chunked vs eager cross-entropy (no checkpointing);
- ``ckpt_granularity``: every layer checkpointed, full and selective, vs no checkpointing (eager
  attention, whose scores are what selective recomputation drops).

The prediction is ``estimate(...).memory_per_device_bytes`` on this machine's CPU device profile
(``experiments/results/cost_model_profile_cpu.json``, as ``validate_cost_model.py --local`` uses).
A saving is baseline minus variant; the ratio is measured saving over predicted saving.

- ``norm_kernel``: the fused RMSNorm vs transformers' eager chain (no checkpointing, eager attention;
  the RMSNorm families only).

Run: ``.venv/bin/python experiments/measure_lean_kernels.py [--predict-only] [--families bert,gpt2] [--add]``;
writes ``experiments/results/lean_kernels_cpu.txt`` and the records to ``lean_kernels_cpu.json`` (``--out``).
With ``MALLOC_MMAP_THRESHOLD_=131072`` in the environment glibc returns every freed block over 128 KiB to
the system, so a rank's peak resident memory follows its live tensors rather than the pages its heap
kept (``lean_kernels_cpu_mmap.txt``); the ranks run at about half their speed then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOBS, ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.cost.profile import load_profile
from autoslapo.layout import inapplicable_knobs
from autoslapo.models.families import list_families
from autoslapo.models.spec import PRESETS, ModelSpec

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "lean_kernels_cpu.txt"
RECORDS = RESULTS / "lean_kernels_cpu.json"
PROFILE = RESULTS / "cost_model_profile_cpu.json"

# The shape: the tiny preset's width and depth, a sequence and vocabulary long enough that the
# logits (tokens x vocabulary fp32) and the eager attention scores dominate the activations.
SHAPE = {"seq_len": 512, "vocab": 8192, "layers": 4}
RANKS = 2  # dp = 2: both ranks hold the whole model; the peak is the larger rank's
MICRO_BATCH = 8

# (name, knobs over the baseline's, baseline name): what is compared with what.
VARIANTS: list[tuple[str, dict[str, Any], str]] = [
    ("eager loss", {}, ""),
    ("chunked loss", {"loss_kernel": "chunked"}, "eager loss"),
    ("no ckpt (eager attn)", {"attn_kernel": "eager"}, ""),
    ("full ckpt", {"attn_kernel": "eager", "ckpt_ratio": 1.0}, "no ckpt (eager attn)"),
    ("selective ckpt", {"attn_kernel": "eager", "ckpt_ratio": 1.0, "ckpt_granularity": "selective"},
     "no ckpt (eager attn)"),
    ("fused RMSNorm", {"attn_kernel": "eager", "norm_kernel": "fused"}, "no ckpt (eager attn)"),
]


def variants_for(model: ModelSpec) -> list[tuple[str, dict[str, Any], str]]:
    """The variants ``model``'s family can run (the RMSNorm kernel: LLaMA's and T5's norms only)."""
    skip = set(inapplicable_knobs(model, KNOBS))
    return [v for v in VARIANTS if not skip & set(v[1])]


def family_model(family: str) -> ModelSpec | None:
    """The family's tiny preset at the measurement shape (None when the family has no tiny preset)."""
    tiny = [p for p in PRESETS.values() if p.family == family and p.preset.endswith("-tiny")]
    if not tiny:
        return None
    return tiny[0].with_overrides(**SHAPE)


def config_for(knobs: dict[str, Any]) -> ScheduleConfig:
    return ScheduleConfig(dp=RANKS, micro_batch=MICRO_BATCH, precision="fp32", **knobs)


def predict(model: ModelSpec, cfg: ScheduleConfig, prof: dict[str, Any]) -> int:
    """Peak bytes a rank the cost model predicts on this machine's CPU profile (dropout off)."""
    cluster = ClusterSpec(gpus=cfg.world_size, gpu_type="cpu", gpus_per_node=cfg.world_size).with_profile(prof)
    return estimate(model, cfg, cluster, profile=prof, dropout=False).memory_per_device_bytes


def measure(model: ModelSpec, cfg: ScheduleConfig, steps: int) -> dict[str, Any]:
    """Train ``cfg`` for real on CPU ranks; status and peak RSS a rank."""
    from autoslapo.runtime import run_trial  # starts processes: only when measuring

    res = run_trial(model, cfg, steps=steps, warmup=1, timeout_s=600, device="cpu", dropout=0.0)
    return {"status": res.status, "reason": res.reason, "peak_memory_bytes": res.peak_memory_bytes,
            "samples_per_s": res.samples_per_s, "load_avg": os.getloadavg()[0],
            "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_")}


def table(records: list[dict[str, Any]]) -> list[str]:
    """Side-by-side measured and predicted peaks and savings, with measured/predicted ratios."""
    mib = 2**20
    lines = [f"{'model':14} {'variant':22} {'meas MiB':>9} {'pred MiB':>9} {'meas saving':>11} "
             f"{'pred saving':>11} {'ratio':>6}"]
    by_key = {(r["model"]["preset"], r["variant"]): r for r in records}
    ratios: dict[str, list[float]] = {}
    for r in records:
        m, p = r.get("peak_memory_bytes"), r["predicted_bytes"]
        head = f"{r['model']['preset']:14} {r['variant']:22} "
        if r.get("status", "complete") != "complete" or not m:
            lines.append(head + f"{'-':>9} {p / mib:>9.0f}  {r.get('status', 'not run')}: {(r.get('reason') or '')[:60]}")
            continue
        line = head + f"{m / mib:>9.0f} {p / mib:>9.0f}"
        base = by_key.get((r["model"]["preset"], r["baseline"])) if r["baseline"] else None
        if base and base.get("peak_memory_bytes") and base.get("status", "complete") == "complete":
            ms, ps = base["peak_memory_bytes"] - m, base["predicted_bytes"] - p
            if abs(ps) < mib:  # no saving predicted (the peak lies elsewhere): a ratio would be noise over ~0
                line += f" {ms / mib:>11.0f} {ps / mib:>11.0f} {'-':>6}"
            else:
                ratios.setdefault(r["variant"], []).append(ms / ps)
                line += f" {ms / mib:>11.0f} {ps / mib:>11.0f} {ms / ps:>6.2f}"
        lines.append(line)
    lines.append("")
    for variant, rs in ratios.items():
        lines.append(f"{variant}: measured/predicted saving over {len(rs)} families: "
                     f"min {min(rs):.2f}, max {max(rs):.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--predict-only", action="store_true", help="print the predictions, run nothing")
    p.add_argument("--families", default=",".join(list_families()), help="comma-separated families")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps a trial (one is warm-up)")
    p.add_argument("--reuse", action="store_true",
                   help=f"re-tabulate the measurements saved beside --out ({RECORDS.name}) against the model now")
    p.add_argument("--add", action="store_true",
                   help=f"keep the measurements saved beside --out ({RECORDS.name}); measure only the variants they lack")
    p.add_argument("--out", type=Path, default=OUT,
                   help=f"the table (default {OUT.name}); the records go beside it as .json")
    args = p.parse_args(argv)
    records_path = args.out.with_suffix(".json")
    prof = load_profile(PROFILE)
    saved: dict[tuple[str, str], dict[str, Any]] = {}
    if args.reuse or args.add:
        for rec in json.loads(records_path.read_text()):  # the saved measurements, predicted by the model as it is now
            rec["predicted_bytes"] = predict(ModelSpec.from_dict(rec["model"]), ScheduleConfig.from_dict(rec["config"]),
                                             prof)
            saved[(rec["model"]["preset"], rec["variant"])] = rec
    if args.reuse:
        records = list(saved.values())
    else:
        records = []
        for family in args.families.split(","):
            model = family_model(family)
            if model is None:
                print(f"{family}: no tiny preset, skipped", flush=True)
                continue
            for name, knobs, baseline in variants_for(model):
                if (model.preset, name) in saved:  # --add: measured before
                    records.append(saved[(model.preset, name)])
                    continue
                cfg = config_for(knobs)
                rec: dict[str, Any] = {"model": model.to_dict(), "config": cfg.to_dict(), "variant": name,
                                       "baseline": baseline, "predicted_bytes": predict(model, cfg, prof)}
                if not args.predict_only:
                    rec |= measure(model, cfg, args.steps)
                    print(f"{model.preset} {name}: {rec['status']} {(rec['peak_memory_bytes'] or 0) / 2**20:.0f} MiB "
                          f"(predicted {rec['predicted_bytes'] / 2**20:.0f}) load {rec['load_avg']:.1f}", flush=True)
                records.append(rec)
        if not args.predict_only:
            records_path.write_text(json.dumps(records, indent=1))
    m0 = ModelSpec.from_dict(records[0]["model"])
    lines = ["# Memory-lean kernels on CPU ranks: peak RSS a rank, measured vs predicted", "",
             f"shape: each family's tiny preset (h={m0.hidden}, L={m0.layers}) at seq_len={SHAPE['seq_len']}, "
             f"vocab={SHAPE['vocab']}; dp={RANKS} CPU ranks (gloo), micro-batch {MICRO_BATCH}, fp32, dropout 0",
             "prediction: estimate() on this machine's CPU profile (cost_model_profile_cpu.json); "
             "saving = baseline - variant; ratio = measured saving / predicted saving"]
    thresholds = {r.get("malloc_mmap_threshold") for r in records}
    if len(thresholds) == 1 and None not in thresholds:
        lines.append(f"ranks ran with MALLOC_MMAP_THRESHOLD_={thresholds.pop()}: glibc returns each freed block "
                     "over it, so the peak follows live tensors, not the pages the heap kept")
    lines.append("")
    lines += table(records)
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if not args.predict_only:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
