"""GPU check: the lean kernels, the memory model, and out-of-the-box training vs a few schedules,
for BERT-large and GPT-2-XL on one GPU.

Lean kernels (first, so a short budget still checks them): at one micro-batch in fp32 (no TF32,
so the comparison is tight) with eager attention, the unscheduled model, selective recomputation
(``--ckpt-ratio 1 --ckpt-granularity selective``), per-op recomputation (``--ckpt-granularity op``) and
the chunked loss (``--loss-kernel chunked``), and on four of LLaMA 7B's layers the fused RMSNorm
(``--norm-kernel fused``: on CUDA torch's one-kernel RMSNorm, forward and backward), each train a
few steps on the same weights and data; each kernel's losses must equal the unscheduled model's
(relative ``LOSS_RTOL`` at every step: the script exits 1 otherwise), and its memory saving
(``torch.cuda.max_memory_allocated``) is printed beside the cost model's prediction.
fp16 with dynamic loss scaling trains the same steps; its losses must stay within ``FP16_RTOL`` of
the fp32 run's (its loss scale and skipped steps are printed).
Feature-map layouts: ResNet-50 in bf16 with NCHW and with channels-last feature maps
(``--channels-last``): their losses must agree, and the measured speed-up is printed beside the cost
model's.
Fused attention: torch's flash kernel (``scaled_dot_product_attention``, causal, bf16) timed forward +
backward at 64- and 128-wide heads, its TFLOP/s beside the cost model's fused-kernel time
(``autoslapo.cost.time.fused_attention_s``: each product at its own inner dimension, the online
softmax on the FP32 and special-function units); reported, not a pass/fail check.
Memory model: every trial that ran, its measured peak beside ``estimate(...).memory_per_device_bytes``
on a one-device cluster of the detected device (the error per row and the mean absolute error).
Time model: the same trials' samples/s beside ``estimate(...).samples_per_s`` (autoslapo's runtime,
uncalibrated), the mean absolute error and, per model, the Spearman rank of its schedules.

Out of the box = what a transformers user gets: the family's defaults (sdpa attention, dropout on,
no checkpointing), bf16 autocast, DeepSpeed ZeRO-0, the largest micro-batch that fits (doubling
until a trial comes back oom). Schedules = the same model with one or more knobs turned: attention
kernel, micro-batch, activation-checkpoint ratio. Each row prints samples/s and MFU (model TFLOP/s
per device over the device's bf16 peak). Fits in 8 minutes on one H100/H200 (``--budget-s``, 430 s,
stops starting trials; each ends by it); what the budget does not reach is skipped.

    python experiments/gpu_check.py                 # on a GPU machine; writes experiments/results/gpu_check.txt
    python experiments/gpu_check.py --dry-run-cpu   # the same logic on tiny models and CPU ranks
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scipy.stats import spearmanr

from autoslapo.cluster import DEVICES, ClusterSpec, preset_for_device_name
from autoslapo.config import RMS_NORM_FAMILIES, ScheduleConfig
from autoslapo.cost import Estimate, estimate
from autoslapo.cost.device import device_perf, for_autoslapo_runtime
from autoslapo.cost.time import _Rates, fused_attention_s
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from autoslapo.runtime import run_trial

RESULTS = Path(__file__).resolve().parent / "results"
#: The micro-batch of the lean-kernel check per model: logits large enough to matter, quick in fp32.
KERNEL_BATCH = {"bert-large": 8, "gpt2-xl": 2, "bert-tiny": 2, "gpt2-tiny": 2, "llama-7b": 1, "llama-tiny": 2}
#: The RMSNorm kernel's check (``--norm-kernel fused``): LLaMA 7B's layers, four of them on a GPU.
NORM_MODEL = {"gpu": ("llama-7b", {"layers": 4}), "cpu": ("llama-tiny", {})}
#: Largest relative difference, at any step, between a lean kernel's loss and the unscheduled model's.
LOSS_RTOL = 1e-4
#: fp16 with dynamic loss scaling against the fp32 run, relative at every step (fp16's rounding; a
#: step applied with overflowed gradients makes the loss non-finite, and the trial fails).
FP16_RTOL = 5e-3
#: The feature-map layout check: a convolutional net's micro-batch, and how close channels-last's
#: losses must stay to NCHW's (16-bit convolutions summed in another order by other kernels).
LAYOUT_BATCH = {"resnet-50": 128, "wideresnet-tiny": 2}
LAYOUT_RTOL = 5e-3
#: The fused-attention timing: (batch, heads, tokens, head width), the same tokens x hidden at both widths.
ATTENTION_SHAPES = {"gpu": [(4, 32, 4096, 64), (4, 16, 4096, 128), (1, 32, 16384, 64), (1, 16, 16384, 128)],
                    "cpu": [(1, 4, 256, 16), (1, 2, 256, 32)]}


@dataclass
class Row:
    model: str
    label: str
    config: ScheduleConfig
    result: TrialResult
    dropout: bool | None = None  # as trained: None = the family's default (on), False = off
    shape: dict[str, int] | None = None  # the preset's fields the trial's model overrode (its layers)


def _device(dry: bool) -> tuple[str, str]:
    """(the device's name, the preset the cost model uses for it)."""
    if dry:
        return "cpu", "cpu"
    import torch

    name = torch.cuda.get_device_name(0).lower()
    return name, preset_for_device_name(name) or "h100-80gb"


def _peak_tflops(preset: str) -> float:
    return DEVICES[preset].peak_tflops_fp32 if preset == "cpu" else DEVICES[preset].peak_tflops


def _estimate(row: Row, preset: str) -> Estimate:
    """The cost model's estimate of ``row`` on one device of ``preset``, for the stack the trial ran:
    autoslapo's runtime (fp32 weights under autocast), not the published runs' a GPU preset describes."""
    cluster = ClusterSpec(gpus=1, gpu_type=preset, gpus_per_node=1)
    spec = ModelSpec.from_name(row.model, **(row.shape or {}))
    perf = for_autoslapo_runtime(device_perf(cluster))
    return estimate(spec, row.config, cluster, perf=perf, validate=False, dropout=row.dropout)


def _predicted_bytes(row: Row, preset: str) -> int:
    """The cost model's memory per device for ``row`` (see ``_estimate``)."""
    return _estimate(row, preset).memory_per_device_bytes


def render_time(rows: list[Row], preset: str) -> list[str]:
    """The time model's check: predicted vs measured samples/s of every trial that ran, and per model
    the rank correlation of the schedules (the cost model's own runtime, uncalibrated)."""
    done = [r for r in rows if r.result.ok]
    if not done:
        return ["time model: no trial ran"]
    note = ("; on CPU a dry run's tiny models take milliseconds a step and share the cores with whatever "
            "else runs, so the CPU rows check the logic only" if preset == "cpu" else "")
    lines = [f"time model vs measured (autoslapo's runtime on this device, no calibration{note}):",
             f"{'model':<15} {'schedule':<28} {'predicted/s':>11} {'measured/s':>10} {'error %':>8}"]
    errors = []
    for r in done:
        pred, got = _estimate(r, preset).samples_per_s, r.result.samples_per_s
        errors.append(abs(pred / got - 1))
        lines.append(f"{r.model:<15} {r.label:<28} {pred:>11.2f} {got:>10.2f} {100 * (pred / got - 1):>+8.1f}")
    lines.append(f"time model: mean absolute error {100 * sum(errors) / len(errors):.1f}% over {len(errors)} trials "
                 "(positive: the model predicts faster than measured)")
    for model in dict.fromkeys(r.model for r in done):
        mine = [r for r in done if r.model == model]
        if len(mine) >= 3:
            rho = spearmanr([_estimate(r, preset).samples_per_s for r in mine],
                            [r.result.samples_per_s for r in mine]).statistic
            lines.append(f"time model: {model} schedules ranked with Spearman {rho:.2f} over {len(mine)} trials")
    return lines


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
        best = Row(name, f"out-of-the-box (mb={mb})", base.with_(micro_batch=mb), r, dropout=None)
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
        out.append(Row(name, label, cfg, r, dropout=False))


def check_kernels(name: str, args: argparse.Namespace, budget: Budget, out: list[Row], preset: str,
                  shape: dict[str, int] | None = None) -> list[str]:
    """Selective and per-op recomputation and the chunked loss against the unscheduled model (for an
    RMSNorm family, ``shape`` overriding its preset's fields: the fused RMSNorm): one verdict line each.

    A verdict starts with ``PASS`` (losses equal at every step), ``FAIL`` (they differ, or the
    kernel failed where the unscheduled model ran) or ``SKIP`` (budget, or no unscheduled run).
    """
    spec = ModelSpec.from_name(name, **(shape or {}))
    # Eager attention keeps the attention scores, which selective recomputation drops (with sdpa
    # there is little to drop, and so little to check).
    base = ScheduleConfig(precision="fp32", attn_kernel="eager", micro_batch=KERNEL_BATCH[name])
    runs = [("unscheduled, fp32", base),
            ("selective recompute, fp32", base.with_(ckpt_ratio=1.0, ckpt_granularity="selective")),
            ("per-op recompute, fp32", base.with_(ckpt_ratio=1.0, ckpt_granularity="op")),
            ("chunked loss, fp32", base.with_(loss_kernel="chunked")),
            ("fp16, loss-scaled", base.with_(precision="fp16"))]
    if spec.family in RMS_NORM_FAMILIES:  # the RMSNorm kernel alone (on CUDA, torch's one-kernel RMSNorm)
        runs = [runs[0], ("fused RMSNorm, fp32", base.with_(norm_kernel="fused"))]
    rows: list[Row] = []
    for label, cfg in runs:
        r = _trial(spec, cfg, args, budget, dropout=0.0)
        if r is None:
            print(f"  {name} {label}: skipped (time budget)", flush=True)
            continue
        print(f"  {name} {label}: {r.status} {r.samples_per_s:.2f} samples/s {r.reason}", flush=True)
        rows.append(Row(name, label, cfg, r, dropout=False, shape=shape))
    out.extend(rows)
    ref = rows[0] if rows and rows[0].config == base else None
    verdicts = []
    for label, cfg in runs[1:]:
        lean = next((r for r in rows if r.config == cfg), None)
        if ref is None or not ref.result.ok or lean is None:
            verdicts.append(f"SKIP {name} {label}: no complete unscheduled run, or the budget ran out")
            continue
        if not lean.result.ok:
            verdicts.append(f"FAIL {name} {label}: {lean.result.status} ({lean.result.reason}) where the "
                            f"unscheduled model ran")
            continue
        want, got = ref.result.extra.get("losses", []), lean.result.extra.get("losses", [])
        worst = max((abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want, strict=True)), default=0.0)
        if cfg.precision == "fp16":  # against the fp32 run: close, not equal; and the scaler's state
            equal = len(got) == len(want) > 0 and worst <= FP16_RTOL
            verdicts.append(
                f"{'PASS' if equal else 'FAIL'} {name} {label}: losses within {FP16_RTOL:g} of fp32's "
                f"(max relative difference {worst:.1e} over {len(got)} steps); loss scale "
                f"{lean.result.extra.get('loss_scale')}, {lean.result.extra.get('skipped_steps')} steps skipped "
                "for overflow")
            continue
        equal = len(got) == len(want) > 0 and worst <= LOSS_RTOL
        saved = (ref.result.peak_memory_bytes - lean.result.peak_memory_bytes) / 2**20
        predicted = (_predicted_bytes(ref, preset) - _predicted_bytes(lean, preset)) / 2**20
        verdicts.append(
            f"{'PASS' if equal else 'FAIL'} {name} {label}: losses {'equal' if equal else 'differ'} "
            f"(max relative difference {worst:.1e} over {len(got)} steps, tolerance {LOSS_RTOL:g}); "
            f"memory saved {saved:+,.0f} MiB measured, {predicted:+,.0f} MiB predicted")
    return verdicts


def check_layouts(name: str, args: argparse.Namespace, budget: Budget, out: list[Row], preset: str) -> list[str]:
    """NCHW against channels-last feature maps (``--channels-last``) for a convolutional net: the same
    schedule twice. One verdict: PASS when both ran and their losses agree within ``LAYOUT_RTOL`` at
    every step, with the measured speed-up beside the cost model's (which prices the transposes cuDNN
    makes of NCHW feature maps around its tensor-core convolutions)."""
    spec = ModelSpec.from_name(name)
    mb = LAYOUT_BATCH[name]
    base = ScheduleConfig(precision="fp32" if args.dry_run_cpu else "bf16", micro_batch=mb)
    rows: list[Row] = []
    for label, cfg in (("NCHW", base), ("channels-last", base.with_(channels_last=True))):
        r = _trial(spec, cfg, args, budget, dropout=None)
        if r is None:
            return [f"SKIP {name} channels-last against NCHW: the budget ran out"]
        print(f"  {name} {label}: {r.status} {r.samples_per_s:.2f} samples/s {r.reason}", flush=True)
        rows.append(Row(name, f"{label} (mb={mb})", cfg, r))
    out.extend(rows)
    nchw, nhwc = rows
    if not nchw.result.ok:
        return [f"SKIP {name} channels-last against NCHW: the NCHW run did not complete ({nchw.result.reason})"]
    if not nhwc.result.ok:
        return [f"FAIL {name} channels-last: {nhwc.result.status} ({nhwc.result.reason}) where NCHW ran"]
    want, got = nchw.result.extra.get("losses", []), nhwc.result.extra.get("losses", [])
    worst = max((abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want, strict=True)), default=0.0)
    equal = len(got) == len(want) > 0 and worst <= LAYOUT_RTOL
    measured = nhwc.result.samples_per_s / nchw.result.samples_per_s
    predicted = _estimate(nhwc, preset).samples_per_s / _estimate(nchw, preset).samples_per_s
    return [f"{'PASS' if equal else 'FAIL'} {name} channels-last against NCHW ({base.precision}, micro-batch {mb}): "
            f"losses within {LAYOUT_RTOL:g} (max relative difference {worst:.1e} over {len(got)} steps); "
            f"speed-up {measured:.2f}x measured, {predicted:.2f}x predicted"]


def check_attention(dry: bool, preset: str, repeats: int = 10) -> list[str]:
    """Measured TFLOP/s of torch's fused causal attention, forward + backward, beside the cost model's
    (``fused_attention_s`` for sdpa on ``preset``; a dry run times the math kernel on CPU in fp32 against
    an A100's figures: a logic check only)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    backend = SDPBackend.MATH if dry else SDPBackend.FLASH_ATTENTION
    target = "a100-80gb" if dry else preset
    cluster = ClusterSpec(gpus=1, gpu_type=target, gpus_per_node=1)
    rates = _Rates(device_perf(cluster), cluster, ScheduleConfig(attn_kernel="sdpa", precision="bf16"))
    lines = [f"fused attention vs the cost model (causal, forward + backward; predicted for {target}"
             f"{': on CPU the math kernel, a logic check only' if dry else ''}):",
             f"{'batch x heads x tokens x width':<32} {'predicted TFLOP/s':>17} {'measured TFLOP/s':>16} {'error %':>8}"]
    for b, h, s, d in ATTENTION_SHAPES["cpu" if dry else "gpu"]:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, s, d, device=device, dtype=dtype)
        with sdpa_kernel(backend):
            step = functools.partial(_attention_step, F.scaled_dot_product_attention, q, k, v, grad)
            took = min(_time_s(step, dry) for _ in range(repeats + 1))  # the first warms up; the minimum wins
        flops = 3.5 * 4 * b * h * s * s * d * 0.5  # forward's two products, backward 2.5x; causal half
        fwd, bwd = fused_attention_s(rates, s, d, b * h, True, "sdpa")
        got, pred = flops / took / 1e12, flops / (fwd + bwd) / 1e12
        err = "-" if dry else f"{100 * (pred / got - 1):+.1f}"
        lines.append(f"{f'{b} x {h} x {s} x {d}':<32} {pred:>17.1f} {got:>16.3g} {err:>8}")
    return lines


def _attention_step(sdpa: Callable[..., Any], q: Any, k: Any, v: Any, grad: Any) -> None:
    sdpa(q, k, v, is_causal=True).backward(grad)


def _time_s(step: Callable[[], object], dry: bool) -> float:
    """Seconds ``step`` takes (on a GPU, until its kernels finish)."""
    import torch

    if not dry:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    if not dry:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def render_memory(rows: list[Row], preset: str) -> list[str]:
    """The memory model's check: predicted vs measured peak per device for every trial that ran."""
    done = [r for r in rows if r.result.ok and r.result.peak_memory_bytes > 0]
    if not done:
        return ["memory model: no trial ran"]
    kind = done[0].result.extra.get("memory_kind", "")
    lines = [f"memory model vs measured ({kind}; on CPU the peak resident set includes the Python + torch "
             f"runtime, so the CPU rows check the logic only):",
             f"{'model':<15} {'schedule':<28} {'predicted GiB':>13} {'measured GiB':>12} {'error %':>8}"]
    errors = []
    for r in done:
        pred, got = _predicted_bytes(r, preset), r.result.peak_memory_bytes
        err = 100 * (pred - got) / got
        errors.append(abs(err))
        lines.append(f"{r.model:<15} {r.label:<28} {pred / 2**30:>13.2f} {got / 2**30:>12.2f} {err:>+8.1f}")
    lines.append(f"memory model: mean absolute error {sum(errors) / len(errors):.1f}% over {len(errors)} trials "
                 f"(positive: the model predicts more than was allocated)")
    return lines


def render(rows: list[Row], device: str, peak: float, args: argparse.Namespace, wall: float,
           preset: str = "cpu", verdicts: list[str] | None = None, attention: list[str] | None = None) -> str:
    lines = [
        f"# gpu_check on {device} ({platform.node()}), peak {peak:g} TFLOP/s, "
        f"{args.steps} steps ({args.warmup} warm-up), wall {wall:.0f} s",
        f"{'model':<15} {'schedule':<28} {'status':<9} {'mb':>4} {'ckpt':>5} {'attn':<6} "
        f"{'samples/s':>10} {'MFU %':>7} {'peak GiB':>9}",
    ]
    for r in rows:
        if "fp32" in r.label:  # the lean-kernel rows: MFU against a bf16 peak means nothing
            res = r.result
            lines.append(
                f"{r.model:<15} {r.label:<28} {res.status:<9} {r.config.micro_batch:>4} {r.config.ckpt_ratio:>5.2f} "
                f"{r.config.attn_kernel:<6} {res.samples_per_s:>10.2f} {'-':>7} {res.peak_memory_bytes / 2**30:>9.2f}")
            continue
        res = r.result
        mfu = 100 * res.tflops_per_device / peak if peak else 0.0
        lines.append(
            f"{r.model:<15} {r.label:<28} {res.status:<9} {r.config.micro_batch:>4} {r.config.ckpt_ratio:>5.2f} "
            f"{r.config.attn_kernel:<6} {res.samples_per_s:>10.2f} {mfu:>7.2f} {res.peak_memory_bytes / 2**30:>9.2f}"
        )
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model and r.result.ok and "fp32" not in r.label]
        if len(mine) > 1:
            base = mine[0].result.samples_per_s
            top = max(mine[1:], key=lambda r: r.result.samples_per_s)
            lines.append(f"{model}: best schedule '{top.label}' is {top.result.samples_per_s / base:.2f}x out of the box")
    lines += ["lean kernels vs the unscheduled model, channels-last vs NCHW:", *(verdicts or ["(not run)"])]
    lines += render_memory(rows, preset)
    lines += render_time(rows, preset)
    lines += attention or []
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run-cpu", action="store_true", help="tiny models on CPU ranks (logic check only)")
    p.add_argument("--budget-s", type=float, default=430.0,
                   help="stop starting trials after this; each trial ends by it (default 430: 8 minutes in all)")
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
    device, preset = _device(args.dry_run_cpu)
    peak = _peak_tflops(preset)
    budget = Budget(args.budget_s)
    t0 = time.monotonic()
    rows: list[Row] = []
    verdicts: list[str] = []
    for m in models:  # the kernels first: they are the check a short budget must still reach
        print(f"{m} lean kernels:", flush=True)
        verdicts += check_kernels(m, args, budget, rows, preset)
    norm_model, shape = NORM_MODEL["cpu" if args.dry_run_cpu else "gpu"]
    print(f"{norm_model} RMSNorm kernel:", flush=True)
    verdicts += check_kernels(norm_model, args, budget, rows, preset, shape)
    print("fused attention:", flush=True)
    attention = check_attention(args.dry_run_cpu, preset)
    print("\n".join(attention), flush=True)
    conv = "wideresnet-tiny" if args.dry_run_cpu else "resnet-50"
    print(f"{conv} feature-map layouts:", flush=True)
    verdicts += check_layouts(conv, args, budget, rows, preset)
    for m in models:
        print(f"{m}:", flush=True)
        check_model(m, args, budget, rows)
    text = render(rows, device, peak, args, time.monotonic() - t0, preset, verdicts, attention)
    print(text)
    default = "gpu_check_dry_run_cpu.txt" if args.dry_run_cpu else "gpu_check.txt"
    path = Path(args.out) if args.out else RESULTS / default
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 1 if any(v.startswith("FAIL") for v in verdicts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
