"""``autoslapo run MODEL --gpus N --tp T --pp P ...``: one real trial on this machine.

CPU ranks (gloo) when no GPU is visible, one GPU per rank otherwise. Prints the TrialResult (a short
table, or JSON with ``--json``). ``--repeats N`` runs it N times: samples/s is then the median over
the runs, with their IQR and every run's value (``extra["repeats_samples_per_s"]``). Exit code 0 when the trial completed, 1 when it came back oom,
failed or timed out, 2 for a configuration that cannot run (checked before any process starts).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import replace

import autoslapo.layout as layout
from autoslapo.cli._knobs import add_knob_arguments, check_refinements, knob_values
from autoslapo.cli._shape import add_shape_arguments, shape_overrides
from autoslapo.cluster import DEVICES
from autoslapo.config import ScheduleConfig, describe
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.spec import is_convolutional

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
         "g": 2**30, "gb": 2**30, "gib": 2**30}
#: The smallest ``--mem-cap`` a rank can keep to: on CPU ranks the cost model's fixed per-process overhead
#: (``autoslapo.cost.device.PERF["cpu"].fixed_overhead_bytes``, 400 MiB: Python, torch, transformers and
#: gloo resident before the model's first byte; bert-tiny's ranks peak at ~450 MiB), so a smaller cap is
#: an out-of-memory verdict known before the trial runs. On a GPU the cap reads the caching allocator's
#: peak, which leaves the CUDA context out: 64 MiB, below which a cap is a unit slip, not a budget.
MIN_CUDA_MEM_CAP = 64 * 2**20
#: CPU ranks per core beyond which ``run`` refuses: each rank runs one thread, and with more than four
#: waiting on a core every collective waits on the scheduler, so the step time measures the machine's
#: oversubscription, not the schedule (and each rank holds ~400 MiB). Four keeps ``--gpus 8`` (tp 2 x pp 2
#: x dp 2) runnable on a 2-core CI machine, and the README's ``--gpus 4`` examples with a warning.
CPU_RANKS_PER_CORE = 4


def parse_bytes(text: str) -> int:
    """``"1.5GiB"`` / ``"800M"`` / ``"123456"`` -> bytes. Raises UsageError for anything else."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise UsageError(f"--mem-cap must be a size like 2GiB, 800MiB or 123456: got {text!r}")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``autoslapo run``."""
    p.add_argument("model", metavar="MODEL", help="model preset, e.g. bert-tiny, gpt2-xl, llama-tiny, a Hugging Face config.json or a model file (.py)")
    p.add_argument("--gpus", type=int, required=True, help="ranks to run (GPUs, or CPU processes)")
    # grad_accum: the pipeline's micro-batches (pp, at least 1) unless given; precision: the device's default.
    add_knob_arguments(p, "run", defaults={"grad_accum": None, "precision": None})
    p.add_argument("--steps", type=int, default=6, help="optimizer steps in all (default 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default: a third, at least 1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before the trial is killed")
    p.add_argument("--mem-cap", default=None, help="per-rank memory cap, e.g. 2GiB (CPU: peak RSS)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="run the trial N times in all; report the median samples/s over the runs and their IQR "
                        "(default 1)")
    p.add_argument("--json", action="store_true", help="print the TrialResult as JSON, the configuration run in its extra.config")
    add_shape_arguments(p)


def _config(args: argparse.Namespace, device: str) -> ScheduleConfig:
    from autoslapo.runtime.check import RUNTIME_PRECISIONS

    knobs = knob_values(args, "run")
    check_refinements(knobs)
    if args.gpus < 1:
        raise UsageError(f"--gpus must be a positive integer: got {args.gpus}")
    try:
        knobs["dp"] = layout.data_parallel(args.gpus, knobs["tp"], knobs["pp"])
    except ConfigError as err:
        raise UsageError(str(err)) from None
    knobs.setdefault("grad_accum", max(1, knobs["pp"]))
    if "precision" not in knobs:
        knobs["precision"] = layout.default_precision(_has_bf16(device), RUNTIME_PRECISIONS)
    return ScheduleConfig(**knobs)


def _mem_cap(text: str | None, device: str) -> int | None:
    """``--mem-cap`` in bytes (None: no cap); UsageError below what a rank needs (the floors: ``MIN_CUDA_MEM_CAP``'s comment)."""
    if not text:
        return None
    cap = parse_bytes(text)
    if device == "cuda":
        floor, why = MIN_CUDA_MEM_CAP, "a GPU rank's smallest sane budget"
    else:
        from autoslapo.cost.device import PERF

        floor, why = PERF["cpu"].fixed_overhead_bytes, "what Python, torch and gloo hold in a CPU rank before the model"
    if cap < floor:
        raise UsageError(f"--mem-cap must be at least {floor // 2**20} MiB ({why}): got {text!r} "
                         f"({cap:,} bytes); pass a larger cap such as 2GiB, or leave it out for none")
    return cap


def _check_cpu_ranks(ranks: int, device: str) -> None:
    """UsageError for more CPU ranks than ``CPU_RANKS_PER_CORE`` a core; a one-line warning on stderr for more than one a core."""
    cores = os.cpu_count() or 1
    if device != "cpu" or ranks <= cores:
        return
    if ranks > CPU_RANKS_PER_CORE * cores:
        raise UsageError(f"CPU trials run at most {CPU_RANKS_PER_CORE} ranks a core: got --gpus {ranks} on "
                         f"{cores} core{'s' if cores != 1 else ''} (at most {CPU_RANKS_PER_CORE * cores}); pass "
                         f"fewer --gpus, or score the layout with `autoslapo estimate` or `tune --backend sim`")
    sys.stderr.write(f"autoslapo run: warning: {ranks} CPU ranks share {cores} core{'s' if cores != 1 else ''}: "
                     "samples/s reads lower than with a core each\n")


def _has_bf16(device: str) -> bool:
    if device == "cpu":
        return DEVICES["cpu"].bf16
    import torch

    return bool(torch.cuda.is_bf16_supported())


def _table(result: object, model: str, config: ScheduleConfig, family: str) -> str:
    r = result.to_dict()  # type: ignore[attr-defined]
    c = config.to_dict()
    lines = [f"{model}: {describe(c, family)}", f"status           {r['status']}" + (f" ({r['reason']})" if r["reason"] else "")]
    if r["status"] == "complete":
        mib = r["peak_memory_bytes"] / 2**20
        lines += [
            f"samples/s        {r['samples_per_s']:.3f}",
            *([] if is_convolutional(family) else [f"tokens/s         {r['tokens_per_s']:.1f}"]),  # images, not tokens
            f"TFLOP/s/device   {r['tflops_per_device']:.4f} (hardware {r['hw_tflops_per_device']:.4f})",
            f"step time        {r['step_time_s']:.4f} s (IQR {r['step_time_spread_s']:.4f} s, "
            f"{len(r['extra'].get('step_times_s', []))} timed steps)",
            f"peak memory      {mib:.0f} MiB per device ({r['extra'].get('memory_kind', '')})",
            f"final loss       {r['final_loss']:.4f}",
        ]
        samples = r["extra"].get("repeats_samples_per_s")
        if samples:
            lines.insert(3, f"over repeats     median of {len(samples)} runs, IQR {r['extra']['samples_per_s_spread']:.3f} "
                            f"samples/s ({', '.join(f'{x:.3f}' for x in samples)})")
        for failure in r["extra"].get("repeat_failures", []):
            lines.append(f"repeat failed    {failure}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Validate, run the trial (``--repeats`` times), print it. Returns 0 if every run completed, else 1."""
    from autoslapo.models.resolve import resolve_model
    from autoslapo.runtime import check_runnable, resolve_device, run_trial
    from autoslapo.runtime.check import check_seed

    spec = resolve_model(args.model, **shape_overrides(args))
    check_seed(args.seed, "the weights' and batches' random state")
    device = resolve_device(args.device, args.gpus)
    config = _config(args, device)
    check_runnable(spec, config, device=device)
    cap = _mem_cap(args.mem_cap, device)
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 3)
    if args.steps <= warmup:
        raise UsageError(f"--steps must exceed the warm-up steps: got --steps {args.steps}, warm-up {warmup}")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be a positive number of runs: got {args.repeats}")
    _check_cpu_ranks(config.world_size, device)
    from autoslapo.runtime.check import check_fits_here

    check_fits_here(spec, config, device=device, fix="lower --seq-len or --micro-batch, checkpoint more layers "
                    "(--ckpt-ratio), or run fewer ranks (--gpus)")
    runs = [run_trial(spec, config, steps=args.steps, warmup=warmup, timeout_s=args.timeout,
                      mem_cap_bytes=cap, device=device, seed=args.seed) for _ in range(args.repeats)]
    result = runs[0]
    if args.repeats > 1:
        from autoslapo.stats import with_repeats

        # The first complete run carries the others (a failed first run with complete repeats
        # still reports the measurement; the failures are listed in extra["repeat_failures"]).
        done = [r for r in runs if r.ok]
        if done:
            result = with_repeats(done[0], [r for r in runs if r is not done[0]])
            result = replace(result, extra={**result.extra, "repeats": args.repeats})
    if args.json:  # the configuration run rides in extra, as the table prints it
        print(json.dumps(replace(result, extra={**result.extra, "config": config.to_dict()}).to_dict(),
                         indent=2, sort_keys=True))
    else:
        print(_table(result, spec.preset, config, spec.family))
    return 0 if result.ok and not result.extra.get("repeat_failures") else 1
