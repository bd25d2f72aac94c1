"""Headline figure: the tuned schedule against out-of-the-box baselines, per model and cluster.

For each (model, cluster) setup a study runs with the ``sim`` backend (the cost model estimates
each trial; no devices needed), and the tuner scores its two baselines on the same model and
cluster: DeepSpeed out of the box (pure DP, ZeRO, largest micro-batch that fits) and a
Megatron-LM-style layout (the smallest TP x PP that fits, TP first up to a node, recomputation only
where nothing fits without it: Narayanan et al. 2021, section 3). The speed-up is the tuned
best over each baseline. All figures are estimates; `experiments/gpu_check.py` measures on a GPU.

    python experiments/tuned_vs_baselines.py [--trials 100] [--quick] [--storage URL] [--out DIR]

Writes ``tuned_vs_baselines.csv``, ``.md`` and ``.png`` into ``--out`` (experiments/results).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Slapo's settings (8 V100s; 64 GPUs) plus current devices.
SETUPS: list[tuple[str, int, str]] = [
    ("bert-large", 8, "v100-16gb"),
    ("roberta-large", 8, "v100-16gb"),
    ("gpt2-xl", 8, "v100-32gb"),
    ("opt-2.7b", 8, "a100-40gb"),
    ("bert-large", 64, "a100-80gb"),
    ("llama-7b", 64, "a100-80gb"),
    ("opt-13b", 64, "h100-80gb"),
]
QUICK = SETUPS[:1] + SETUPS[4:5]


def run_setup(store: Any, model: str, gpus: int, gpu_type: str, trials: int, seed: int) -> dict[str, Any]:
    """Tune one setup with the sim backend and return its row (tuned best and both baselines)."""
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec
    from tuner.study import StudyRunner, TuneOptions

    spec = ModelSpec.from_name(model)
    cluster = ClusterSpec(gpus, gpu_type=gpu_type)
    options = TuneOptions(model=spec, cluster=cluster, backend="sim", trials=trials, seed=seed,
                          study=f"tvb-{model}-{gpus}x{gpu_type}-s{seed}")
    start = time.perf_counter()
    outcome = StudyRunner(options, store).run()
    elapsed = time.perf_counter() - start
    best = outcome.best_result
    row: dict[str, Any] = {
        "model": model,
        "params_m": round(spec.num_params() / 1e6),
        "gpus": gpus,
        "gpu_type": gpu_type,
        "trials": sum(outcome.counts.values()),
        "tune_s": round(elapsed, 1),
        "tuned_samples_per_s": None if best is None else best.samples_per_s,
        "tuned_config": "" if outcome.best_config is None else _knobs(outcome.best_config.to_dict()),
    }
    for name in ("deepspeed", "megatron"):
        b = outcome.baselines.get(name, {})
        ok = b.get("status") == "complete"
        row[f"{name}_status"] = b.get("status", "not run")
        row[f"{name}_samples_per_s"] = b.get("samples_per_s") if ok else None
        row[f"{name}_speedup"] = b.get("speedup") if ok else None
        row[f"{name}_config"] = _knobs(b["config"]) if b.get("config") else ""
    return row


def _knobs(config: dict[str, Any]) -> str:
    keys = ("tp", "pp", "dp", "micro_batch", "grad_accum", "ckpt_ratio", "zero_stage", "attn_kernel")
    return " ".join(f"{k}={config[k]}" for k in keys if k in config)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def write_outputs(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """CSV, Markdown table and bar chart of the speed-ups; returns the written paths."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "tuned_vs_baselines.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    md = [
        "| model | cluster | trials | tuned samples/s | vs DeepSpeed | vs Megatron-style | tuned knobs |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ds = _fmt(r["deepspeed_speedup"], ".2f") + "x" if r["deepspeed_speedup"] else r["deepspeed_status"]
        mg = _fmt(r["megatron_speedup"], ".2f") + "x" if r["megatron_speedup"] else r["megatron_status"]
        md.append(f"| {r['model']} | {r['gpus']} x {r['gpu_type']} | {r['trials']} | "
                  f"{_fmt(r['tuned_samples_per_s'], '.4g')} | {ds} | {mg} | {r['tuned_config']} |")
    md.append("")
    md.append("Estimated by the cost model (sim backend); speed-up = tuned best / baseline throughput.")
    md_path = out / "tuned_vs_baselines.md"
    md_path.write_text("\n".join(md) + "\n")
    return [csv_path, md_path, plot(rows, out / "tuned_vs_baselines.png")]


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Grouped bars: speed-up of the tuned schedule over each baseline, per setup (log scale)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [f"{r['model']}\n{r['gpus']} x {r['gpu_type']}" for r in rows]
    width = 0.38
    for k, (name, color, title) in enumerate((("deepspeed", "#1f77b4", "vs DeepSpeed out of the box"),
                                              ("megatron", "#ff7f0e", "vs Megatron-LM style"))):
        xs = [i + (k - 0.5) * width for i in range(len(rows))]
        vals = [r[f"{name}_speedup"] or 0.0 for r in rows]
        # Bars grow from 1x (parity) so a slower tuned schedule would point down, not look like a win.
        ax.bar(xs, [v - 1.0 if v > 0 else float("nan") for v in vals], width, bottom=1.0, color=color,
               label=title)
        for x, v, r in zip(xs, vals, rows, strict=True):
            text = f"{v:.2f}x" if v > 0 else str(r[f"{name}_status"]).upper()
            ax.text(x, v * 1.05 if v > 0 else 1.0, text, ha="center", va="bottom", fontsize=8, rotation=90)
    ax.axhline(1.0, color="black", lw=0.8, label="parity (1x)")
    ax.set_yscale("log")
    ax.set_ylim(0.5, max([(r[f"{n}_speedup"] or 1.0) for r in rows for n in ("deepspeed", "megatron")]) * 4)
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("speed-up of the tuned schedule (x, log scale)")
    ax.set_title("Tuned schedule vs out-of-the-box baselines (cost-model estimates)")
    ax.legend(loc="upper left", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.savefig(path, format="png", dpi=100)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100, help="trials per study (default 100)")
    parser.add_argument("--quick", action="store_true", help="two setups and 30 trials (a smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage", default=None, help="store URL (default: a temporary SQLite file)")
    parser.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    args = parser.parse_args(argv)
    setups = QUICK if args.quick else SETUPS
    trials = min(args.trials, 30) if args.quick else args.trials

    from store import open_store

    with tempfile.TemporaryDirectory(prefix="autoslapo-tvb-") as tmp:
        url = args.storage or f"sqlite:///{Path(tmp) / 'tvb.db'}"
        rows = []
        with open_store(url) as store:
            for model, gpus, gpu_type in setups:
                row = run_setup(store, model, gpus, gpu_type, trials, args.seed)
                rows.append(row)
                print(f"{model:>14} {gpus:>3} x {gpu_type:<10} tuned {_fmt(row['tuned_samples_per_s'], '.4g'):>8} "
                      f"samples/s  vs DeepSpeed {_fmt(row['deepspeed_speedup'], '.2f')}x  "
                      f"vs Megatron {_fmt(row['megatron_speedup'], '.2f')}x  ({row['tune_s']} s)", flush=True)
    for path in write_outputs(rows, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
