"""A study's report: PNG figures and one self-contained HTML page.

``write_report(store, study, out_dir)`` reads the study from the store; ``render_report`` does the
same from a study record and a trials DataFrame (the store's ``to_dataframe`` columns), so a
report can be drawn from an exported file too. matplotlib and pandas load only when called.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoslapo.cluster import ClusterSpec
from autoslapo.errors import UsageError
from autoslapo.report.plots import KNOB_PREFIX, Baseline, GiB
from autoslapo.storage import baseline_rows, study_label

if TYPE_CHECKING:
    import pandas as pd

    from store import Store, StudyRecord

__all__ = ["Baseline", "Report", "render_report", "write_report"]

TOP_TRIALS = 10


@dataclass(frozen=True)
class Report:
    """The files a report wrote: ``html`` and the PNGs by figure name."""

    html: Path
    images: dict[str, Path] = field(default_factory=dict)

    @property
    def files(self) -> list[Path]:
        return [self.html, *self.images.values()]


def _out_dir(path: str | Path) -> Path:
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output must be a directory: {str(out)!r} is a file; pass a directory path")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # a directory that exists may still refuse files (read-only, a kernel's /sys or /proc): try one
        tempfile.TemporaryFile(dir=out).close()
    except OSError as err:
        raise UsageError(f"the report directory must be writable: cannot write into {str(out)!r} "
                         f"({err.strerror or err}); pass a directory you can write") from None
    return out


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _summary(study: StudyRecord, frame: pd.DataFrame) -> dict[str, Any]:
    counts = frame["status"].value_counts().to_dict() if not frame.empty else {}
    ran = frame["measured"].fillna(False).astype(bool) if not frame.empty else None
    measured = int(ran.sum()) if ran is not None else 0
    # what the cost model answered: its estimates and its prunings (not a trial in flight, nor one that failed)
    estimated = int((~ran & frame["status"].isin(["complete", "pruned", "oom"])).sum()) if ran is not None else 0
    params = None
    try:
        from autoslapo.models.spec import ModelSpec

        params = ModelSpec.from_dict(study.model).num_params()
    except Exception:
        params = None
    memory = f"{study.gpu_memory_bytes / GiB:.0f} GiB" if study.gpu_memory_bytes else "unknown"
    return {
        "model": study_label(study) + (f" ({params:,} parameters)" if params else ""),
        "family": study.model_family,
        "cluster": f"{ClusterSpec.from_dict(study.cluster).described_as()}, {memory} each",
        "backend": study.backend,
        "objective": study.objective,
        "search space": f"{study.space_name} v{study.space_version}",
        "status": study.status,
        "trials": len(frame),
        "by status": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none",
        "measured / estimated": f"{measured} / {estimated}",
        "created": study.created_at.strftime("%Y-%m-%d %H:%M UTC"),
        "updated": study.updated_at.strftime("%Y-%m-%d %H:%M UTC"),
    }


def _trial_row(row: Any, knobs: Sequence[str]) -> dict[str, Any]:
    memory = _num(row.get("peak_memory_bytes"))
    out: dict[str, Any] = {
        "trial": int(row["number"]),
        "samples/s": _num(row.get("samples_per_s")),
        "tokens/s": _num(row.get("tokens_per_s")),
        "TFLOP/s per device": _num(row.get("tflops_per_device")),
        "peak memory (GiB)": None if memory is None else memory / GiB,
        "measured": bool(row.get("measured")),
    }
    for knob in knobs:
        out[knob[len(KNOB_PREFIX):]] = row.get(knob)
    return out


def render_report(study: StudyRecord, frame: pd.DataFrame, out_dir: str | Path, *,
                  baselines: Sequence[Baseline] = ()) -> Report:
    """Draw the figures for ``study`` from its trials ``frame`` and write ``index.html`` in ``out_dir``.

    Returns the written files. Raises UsageError when ``out_dir`` is a file or cannot be created.
    """
    from autoslapo.report import html as page_html
    from autoslapo.report import plots

    out = _out_dir(out_dir)
    label = f"{study_label(study)} on {ClusterSpec.from_dict(study.cluster).described_as()}"
    done = plots.complete(frame)
    best_row = done.loc[done["samples_per_s"].idxmax()] if not done.empty else None
    best_value = None if best_row is None else float(best_row["samples_per_s"])

    figures: list[page_html.Figure] = []
    images: dict[str, Path] = {}

    def add(name: str, title: str, caption: str, path: Path) -> None:
        images[name] = path
        figures.append(page_html.Figure(title, path, caption))

    add("throughput_over_trials", "Throughput over trials",
        "Each complete trial's throughput in the order the tuner ran them (circles measured, triangles "
        "estimated by the cost model); the green step is the best so far. Trials that did not complete "
        "sit on the floor, coloured by status.",
        plots.plot_throughput_over_trials(frame, out / "throughput_over_trials.png",
                                          title=f"Throughput over trials: {label}"))
    add("throughput_vs_memory", "Throughput vs memory per device",
        "Complete trials by peak memory per device; the green line joins the Pareto front (no other "
        "trial is both faster and lighter). The dashed line is the device's memory.",
        plots.plot_throughput_vs_memory(frame, out / "throughput_vs_memory.png",
                                        device_memory_bytes=study.gpu_memory_bytes,
                                        title=f"Throughput vs memory per device: {label}"))
    add("knob_effects", "Knob importance and effect",
        "Top: the share of the variance of log throughput that each knob's value explains on its own "
        "(η², a ranking hint: knobs with many values score higher by chance). Below: throughput by "
        "value of the most important knobs; the green tick is the best trial with that value.",
        plots.plot_knob_effects(frame, out / "knob_effects.png", title=f"Knob importance and effect: {label}"))
    if plots.has_predictions(frame):
        add("predicted_vs_measured", "Predicted vs measured",
            "The cost model's prediction for each real trial (made when it was proposed, by the prior "
            "refitted to the trials before it) against what the trial measured; the dashed diagonal is "
            "a perfect prediction. Triangles on the top edge: trials that ran out of memory.",
            plots.plot_predicted_vs_measured(frame, out / "predicted_vs_measured.png",
                                             title=f"Predicted vs measured: {label}"))
    if baselines:
        add("tuned_vs_baselines", "Tuned vs out-of-the-box baselines",
            "The best tuned schedule against each baseline configuration on the same model and cluster.",
            plots.plot_tuned_vs_baselines(best_value, baselines, out / "tuned_vs_baselines.png",
                                          tuned_label=f"tuned (best of {len(done)} trials)",
                                          title=f"Tuned vs baselines: {label}"))

    knobs = [c for c in frame.columns if str(c).startswith(KNOB_PREFIX)]
    varying = plots.knob_columns(frame)
    top = done.sort_values("samples_per_s", ascending=False).head(TOP_TRIALS) if not done.empty else done
    best_config = None
    best_metrics = None
    if best_row is not None:
        best_config = {k[len(KNOB_PREFIX):]: best_row[k] for k in knobs}
        best_metrics = {k: v for k, v in _trial_row(best_row, []).items()}
        best_metrics["step time (s)"] = _num(best_row.get("step_time_s"))
    page = page_html.PageData(
        title=f"autoslapo study {study.name}",
        summary=_summary(study, frame),
        best_config=best_config,
        best_metrics=best_metrics,
        top_trials=[_trial_row(r, varying) for _, r in top.iterrows()],
        baselines=baselines,
        best_samples_per_s=best_value,
        notes=["Throughput is for the whole job (all devices); memory is the largest per-device peak."],
    )
    html_path = out / "index.html"
    html_path.write_text(page_html.render_page(page, figures), encoding="utf-8")
    return Report(html=html_path, images=images)


def write_report(store: Store, study: str, out_dir: str | Path, *,
                 baselines: Sequence[Baseline] | None = None) -> Report:
    """Read ``study`` (and its baselines) from ``store`` and write its report into ``out_dir``.

    Raises StorageError for an unknown study, UsageError for a bad ``out_dir``.
    """
    record = store.get_study(study)
    frame = store.to_dataframe(study)
    if baselines is None:
        baselines = load_baselines(store, study)
    return render_report(record, frame, out_dir, baselines=baselines)


# How the tuner names its baselines (tuner/baselines.py) -> how the report labels them.
BASELINE_LABELS = {
    "deepspeed": "DeepSpeed out of the box (ZeRO, pure DP)",
    # the smallest model-parallel layout that fits, recomputing only where it must (Narayanan et al. 2021)
    "megatron": "Megatron-LM style (TP {tp}, PP {pp}, {recompute})",
}


def baseline_label(kind: str, config: dict[str, Any] | None) -> str:
    """How the report names a baseline, with the layout it ran (Megatron-style: TP, PP, recomputation)."""
    label = BASELINE_LABELS.get(kind, kind)
    if "{tp}" in label and not (config or {}).get("tp"):  # none of its configurations fitted
        return label.split(" (")[0] + " (none fits)"
    if "{tp}" not in label or not config:
        return label
    recompute = "full recompute" if float(config.get("ckpt_ratio") or 0) >= 1 else "no recompute"
    return label.format(tp=config["tp"], pp=config.get("pp", 1), recompute=recompute)


def load_baselines(store: Store, study: str) -> list[Baseline]:
    """The out-of-the-box baselines the tuner scored for ``study``; empty when none were run.

    They live in the companion study ``<study>.baselines``, one trial each, named by the
    ``baseline`` key of the stored result's ``extra``.
    """
    out = []
    for name, trial in baseline_rows(store, study):
        extra = trial.result.get("extra") or {}
        out.append(Baseline(
            name=baseline_label(name, None if "baseline" in trial.config else dict(trial.config)),
            status=trial.status,
            samples_per_s=trial.samples_per_s if trial.status == "complete" else None,
            peak_memory_bytes=trial.peak_memory_bytes,
            measured=trial.measured,
            reason=trial.reason,
            config=None if "baseline" in trial.config else dict(trial.config),
            speedup_ci95=(extra.get("speedup_ci95") or {}).get(name),
        ))
    return out
