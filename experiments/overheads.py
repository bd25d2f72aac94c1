"""What autoslapo itself costs, beside the training it schedules: one table of overheads.

    python experiments/overheads.py [--quick]

- CLI start-up: ``autoslapo --help`` (no torch import) and ``autoslapo estimate`` (pure cost model);
- the schedule: create + apply the knob-driven TP-8 schedule on BERT-large (meta device);
- the tuner per trial, inline (sim backend), from ``autoslapo tune ... --trials N`` wall time;
- the store: ``best()`` on the store that tune just wrote;
- a real trial: launch + set-up time against its timed steps (tiny model, 2 CPU ranks).

Each figure is the median of a few repeats; the machine's load average is printed with them,
since these 2-core machines are shared. Writes experiments/results/overheads.txt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
CLI = [sys.executable, "-m", "autoslapo"]


def _timed(cmd: list[str], repeats: int, cwd: str) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=cwd)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Measure and print the overhead table; returns the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and trials")
    args = ap.parse_args(argv)
    repeats = 2 if args.quick else 5
    trials = 30 if args.quick else 100
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="autoslapo-overheads-") as tmp:
        db = f"sqlite:///{tmp}/o.db"
        rows.append(("`autoslapo --help`", f"{_timed([*CLI, '--help'], repeats, tmp) * 1000:.0f} ms"))
        est = [*CLI, "estimate", "bert", "--gpus", "64", "--gpu-type", "a100-80gb", "--json"]
        rows.append(("`autoslapo estimate bert --gpus 64` (best config, cost model)",
                     f"{_timed(est, repeats, tmp):.2f} s"))

        from autoslapo import create_schedule
        from autoslapo.config import ScheduleConfig
        from autoslapo.dist import init_fake_world
        from autoslapo.models.build import build_model
        from autoslapo.models.spec import ModelSpec
        from autoslapo.plan import apply_schedule

        spec = ModelSpec.from_name("bert-large")
        init_fake_world(8, rank=3)
        import torch
        import torch.distributed as dist

        applies = []
        for _ in range(repeats):
            with torch.device("meta"):
                model = build_model(spec)
            t = time.perf_counter()
            apply_schedule(create_schedule(model, group=dist.group.WORLD), spec, ScheduleConfig(tp=8))
            applies.append(time.perf_counter() - t)
        dist.destroy_process_group()
        rows.append(("create + apply the TP-8 schedule to BERT-large (meta)",
                     f"{statistics.median(applies) * 1000:.0f} ms"))

        # sampled (--sampler), so the figure is a cost per trial; without it sim scores the whole space
        tune = [*CLI, "tune", "bert", "--gpus", "64", "--trials", str(trials), "--storage", db,
                "--study", "o", "--no-baselines", "--no-warm-start", "--sampler", "tpe"]
        t = time.perf_counter()
        subprocess.run(tune, check=True, capture_output=True, cwd=tmp)
        total = time.perf_counter() - t
        rows.append((f"`autoslapo tune bert --gpus 64 --trials {trials}` (sim, inline)",
                     f"{total:.1f} s in all, {total / trials * 1000:.0f} ms a trial incl. start-up"))

        from store import open_store

        with open_store(db) as st:
            qs = []
            for _ in range(repeats * 4):
                t = time.perf_counter()
                st.best_trials(spec.signature(), 64, "a100-80gb")
                qs.append(time.perf_counter() - t)
        rows.append((f"store `best()` over that study ({trials} trials, SQLite)",
                     f"{statistics.median(qs) * 1000:.1f} ms"))

        from autoslapo.runtime import run_trial

        tiny = ModelSpec.from_name("bert-tiny")
        r = run_trial(tiny, ScheduleConfig(dp=2, micro_batch=4, precision="fp32"), steps=4, warmup=1,
                      timeout_s=300)
        steps = r.step_time_s * r.steps if r.ok else 0.0
        wall = float(r.extra.get("wall_s", 0.0))
        rows.append(("a real trial, bert-tiny on 2 CPU ranks (launch + set-up vs timed steps)",
                     f"{r.status}: {wall:.1f} s wall, set-up {float(r.extra.get('setup_s', 0.0)):.1f} s, "
                     f"{r.steps} timed steps {steps:.2f} s"))
    load = os.getloadavg()[0]
    lines = ["# overheads (python experiments/overheads.py)", "",
             "| what | measured |", "|---|---|", *[f"| {a} | {b} |" for a, b in rows], "",
             f"load average (1 min) at the end: {load:.1f} on {os.cpu_count()} cores"]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "overheads.txt").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
