"""GPU check: out-of-the-box training vs a few schedules, for BERT-large and GPT-2-XL on one GPU.

Out of the box = what a transformers user gets: the family's defaults (sdpa attention, dropout on,
no checkpointing), bf16 autocast, DeepSpeed ZeRO-0, the largest micro-batch that fits (doubling
until a trial comes back oom). Schedules = the same model with one or more knobs turned: attention
kernel, micro-batch, activation-checkpoint ratio. Each row prints samples/s and MFU (model TFLOP/s
per device over the device's bf16 peak). Fits in about 8 minutes on one H100/H200; a time budget
skips what is left when it runs out.

    python experiments/gpu_check.py                 # on a GPU machine; writes experiments/results/gpu_check.txt
    python experiments/gpu_check.py --dry-run-cpu   # the same logic on tiny models and CPU ranks
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoslapo.cluster import DEVICES
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from autoslapo.runtime import run_trial

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Row:
    model: str
    label: str
    config: ScheduleConfig
    result: TrialResult


def _peak_tflops(dry: bool) -> tuple[str, float]:
    if dry:
        return "cpu", DEVICES["cpu"].peak_tflops_fp32
    import torch

    name = torch.cuda.get_device_name(0).lower()
    for key, dev in (("h200", "h200-141gb"), ("h100", "h100-80gb"), ("a100", "a100-80gb"), ("v100", "v100-32gb")):
        if key in name:
            return name, DEVICES[dev].peak_tflops
    return name, DEVICES["h100-80gb"].peak_tflops


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _trial(spec: ModelSpec, config: ScheduleConfig, args: argparse.Namespace, budget: Budget,
           dropout: float | None) -> TrialResult | None:
    if budget.left() < args.min_trial_s:
        return None
    return run_trial(spec, config, steps=args.steps, warmup=args.warmup,
                     timeout_s=min(args.trial_timeout, budget.left()), device=args.device, dropout=dropout)


def check_model(name: str, args: argparse.Namespace, budget: Budget, out: list[Row]) -> None:
    spec = ModelSpec.from_name(name)
    prec = "fp32" if args.dry_run_cpu else "bf16"
    base = ScheduleConfig(precision=prec, attn_kernel="sdpa")
    # Out of the box: the largest micro-batch that fits, doubling from the first candidate.
    best: Row | None = None
    mb = args.start_batch
    while mb <= args.max_batch:
        r = _trial(spec, base.with_(micro_batch=mb), args, budget, dropout=None)
        if r is None:
            break
        print(f"  {name} out-of-the-box micro_batch={mb}: {r.status} {r.samples_per_s:.2f} samples/s", flush=True)
        if not r.ok:
            break
        best = Row(name, f"out-of-the-box (mb={mb})", base.with_(micro_batch=mb), r)
        mb *= 2
    if best is None:
        print(f"  {name}: no out-of-the-box batch fits or the budget ran out", flush=True)
        return
    out.append(best)
    b = best.config.micro_batch
    kernels = ["sdpa"]
    if not args.dry_run_cpu and importlib.util.find_spec("flash_attn") is not None:
        kernels.append("flash")
    schedules: list[tuple[str, ScheduleConfig]] = [
        ("no dropout, same batch", best.config),
        ("ckpt 0.5, 2x batch", best.config.with_(micro_batch=2 * b, ckpt_ratio=0.5)),
        ("ckpt 1.0, 4x batch", best.config.with_(micro_batch=4 * b, ckpt_ratio=1.0)),
        ("eager attention", best.config.with_(attn_kernel="eager")),
    ]
    if "flash" in kernels:
        schedules.append(("flash, ckpt 0.5, 2x batch", best.config.with_(micro_batch=2 * b, ckpt_ratio=0.5,
                                                                          attn_kernel="flash")))
    for label, cfg in schedules:
        r = _trial(spec, cfg, args, budget, dropout=0.0)
        if r is None:
            print(f"  {name} {label}: skipped (time budget)", flush=True)
            continue
        print(f"  {name} {label}: {r.status} {r.samples_per_s:.2f} samples/s {r.reason}", flush=True)
        out.append(Row(name, label, cfg, r))


def render(rows: list[Row], device: str, peak: float, args: argparse.Namespace, wall: float) -> str:
    lines = [
        f"# gpu_check on {device} ({platform.node()}), peak {peak:g} TFLOP/s, "
        f"{args.steps} steps ({args.warmup} warm-up), wall {wall:.0f} s",
        f"{'model':<12} {'schedule':<28} {'status':<9} {'mb':>4} {'ckpt':>5} {'attn':<6} "
        f"{'samples/s':>10} {'MFU %':>7} {'peak GiB':>9}",
    ]
    for r in rows:
        res = r.result
        mfu = 100 * res.tflops_per_device / peak if peak else 0.0
        lines.append(
            f"{r.model:<12} {r.label:<28} {res.status:<9} {r.config.micro_batch:>4} {r.config.ckpt_ratio:>5.2f} "
            f"{r.config.attn_kernel:<6} {res.samples_per_s:>10.2f} {mfu:>7.2f} {res.peak_memory_bytes / 2**30:>9.2f}"
        )
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model and r.result.ok]
        if len(mine) > 1:
            base = mine[0].result.samples_per_s
            top = max(mine[1:], key=lambda r: r.result.samples_per_s)
            lines.append(f"{model}: best schedule '{top.label}' is {top.result.samples_per_s / base:.2f}x out of the box")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU ranks (logic check only)")
    p.add_argument("--budget-s", type=float, default=470.0, help="stop starting trials after this")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--trial-timeout", type=float, default=120.0)
    p.add_argument("--out", default=None, help="where to write the table (default: results/gpu_check*.txt)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.dry_run_cpu:
        models = ["bert-tiny", "gpt2-tiny"]
        args.device, args.start_batch, args.max_batch, args.min_trial_s = "cpu", 1, 2, 5.0
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    else:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run with --dry-run-cpu to check the logic", file=sys.stderr)
            return 2
        models = ["bert-large", "gpt2-xl"]
        args.device, args.start_batch, args.max_batch, args.min_trial_s = "cuda", 4, 64, 25.0
    device, peak = _peak_tflops(args.dry_run_cpu)
    budget = Budget(args.budget_s)
    t0 = time.monotonic()
    rows: list[Row] = []
    for m in models:
        print(f"{m}:", flush=True)
        check_model(m, args, budget, rows)
    text = render(rows, device, peak, args, time.monotonic() - t0)
    print(text)
    default = "gpu_check_dry_run_cpu.txt" if args.dry_run_cpu else "gpu_check.txt"
    path = Path(args.out) if args.out else RESULTS / default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
