"""The report's figures: each function takes the trials frame and writes one PNG.

The frame has the store's columns (``store.to_dataframe``): ``number``, ``status``,
``samples_per_s``, ``peak_memory_bytes``, ``measured``, and the knobs as ``config.<knob>``.
matplotlib is imported inside the functions, and figures are drawn on an Agg canvas without
pyplot, so nothing here touches a display or pyplot's global figure list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

GiB = 1024**3
KNOB_PREFIX = "config."

# One colour per trial status, the same in every figure.
STATUS_COLORS = {
    "complete": "#1f77b4",
    "oom": "#d62728",
    "failed": "#7f7f7f",
    "timeout": "#ff7f0e",
    "pruned": "#bcbd22",
    "running": "#17becf",
}
BEST_COLOR = "#2ca02c"
DPI = 100


@dataclass(frozen=True)
class Baseline:
    """An out-of-the-box configuration the tuned schedule is compared with.

    ``samples_per_s`` is ``None`` when the baseline did not run (``status`` says why: oom, failed).
    ``speedup_ci95``: the tuned schedule's speed-up over it with its 95% interval from interleaved
    repeats (``tuner.repeats.speedup_interval``), when it was re-measured.
    """

    name: str
    status: str
    samples_per_s: float | None
    peak_memory_bytes: int | None = None
    measured: bool = False
    reason: str = ""
    config: dict[str, Any] | None = None
    speedup_ci95: dict[str, Any] | None = None


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | Path) -> Path:
    target = Path(path)
    fig.savefig(target, format="png", dpi=DPI)
    return target


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of complete trials with a positive throughput."""
    if frame.empty or "samples_per_s" not in frame:
        return frame.iloc[0:0]
    ok = (frame["status"] == "complete") & (frame["samples_per_s"].fillna(0) > 0)
    return frame[ok]


def knob_columns(frame: pd.DataFrame) -> list[str]:
    """The ``config.<knob>`` columns that take more than one value among complete trials."""
    done = complete(frame)
    cols = []
    for name in frame.columns:
        if not str(name).startswith(KNOB_PREFIX):
            continue
        values = {_label(v) for v in done[name]} if not done.empty else set()
        if len(values) > 1:
            cols.append(str(name))
    return cols


def _label(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def _sort_key(label: str) -> tuple[int, float, str]:
    # Numbers in numeric order, then words; "off" before "on".
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def pareto_front(frame: pd.DataFrame) -> pd.DataFrame:
    """Complete trials that no other trial beats on both throughput and per-device memory.

    Returns them in increasing memory order (throughput rises along the front).
    """
    from autoslapo.result import pareto_front as front

    done = complete(frame)
    done = done[done["peak_memory_bytes"].fillna(0) > 0] if "peak_memory_bytes" in done else done.iloc[0:0]
    if done.empty:
        return done
    points = list(zip(done["peak_memory_bytes"].astype(float), done["samples_per_s"].astype(float), strict=True))
    return done.iloc[front(points)]


def knob_importance(frame: pd.DataFrame) -> list[tuple[str, float]]:
    """Share of the variance of log throughput that each knob explains on its own (eta squared).

    Over complete trials: for a knob, the between-value sum of squares over the total sum of
    squares of ``log(samples_per_s)``. 0 = the knob's value tells nothing, 1 = it alone decides.
    Knobs with many values get a head start (each value fits its own mean), so read it as a
    ranking hint, not a causal effect. Returns (knob, share) pairs, largest first.
    """
    done = complete(frame)
    if len(done) < 3:
        return []
    y = done["samples_per_s"].astype(float).map(math.log)
    total = float(((y - y.mean()) ** 2).sum())
    if total <= 0:
        return []
    out = []
    for col in knob_columns(frame):
        labels = done[col].map(_label)
        between = 0.0
        for _, group in y.groupby(labels):
            between += len(group) * (float(group.mean()) - float(y.mean())) ** 2
        out.append((col[len(KNOB_PREFIX):], between / total))
    return sorted(out, key=lambda kv: -kv[1])


def plot_throughput_over_trials(frame: pd.DataFrame, path: str | Path, *, title: str = "") -> Path:
    """Throughput of each trial in order, with the best so far as a step line; failures along the floor.

    Returns the PNG path.
    """
    fig = _figure(8.0, 4.5)
    ax = fig.add_subplot()
    frame = frame.sort_values("number") if not frame.empty else frame
    done = complete(frame)
    if not done.empty:
        for measured, marker, label in ((True, "o", "measured"), (False, "^", "estimated")):
            part = done[done["measured"].fillna(False).astype(bool) == measured]
            if not part.empty:
                ax.scatter(part["number"], part["samples_per_s"], s=22, marker=marker,
                           color=STATUS_COLORS["complete"], alpha=0.75, label=f"complete ({label})")
        best = done["samples_per_s"].cummax()
        # Extend the step line to the last trial so the plateau after the last improvement shows.
        xs = [*done["number"].tolist(), int(frame["number"].max())]
        ys = [*best.tolist(), float(best.iloc[-1])]
        ax.step(xs, ys, where="post", color=BEST_COLOR, lw=2, label="best so far")
        top = done.loc[done["samples_per_s"].idxmax()]
        # Anchor the label on the side away from the nearest edge so it stays inside the axes.
        lo, hi = float(frame["number"].min()), float(frame["number"].max())
        where = (float(top["number"]) - lo) / (hi - lo) if hi > lo else 0.5
        ha = "left" if where < 0.25 else "right" if where > 0.75 else "center"
        ax.annotate(f"best {top['samples_per_s']:.4g} samples/s (trial {int(top['number'])})",
                    (top["number"], top["samples_per_s"]), xytext=(0, 8), textcoords="offset points",
                    ha=ha, fontsize=9, color=BEST_COLOR)
    failed = frame[frame["status"] != "complete"] if not frame.empty else frame
    for status, group in failed.groupby("status") if not failed.empty else []:
        ax.scatter(group["number"], [0] * len(group), marker="x", s=28,
                   color=STATUS_COLORS.get(str(status), "black"), label=f"{status} ({len(group)})")
    ax.set_xlabel("trial number")
    ax.set_ylabel("throughput (samples/s, whole job)")
    # Head room above the best point for its label.
    ax.set_ylim(0, float(done["samples_per_s"].max()) * 1.15 if not done.empty else 1.0)
    ax.set_title(title or "Throughput over trials")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize=8, framealpha=0.9)
    if done.empty:
        _empty(ax, "no complete trial yet")
    return _save(fig, path)


def plot_throughput_vs_memory(frame: pd.DataFrame, path: str | Path, *, device_memory_bytes: int | None = None,
                              title: str = "") -> Path:
    """Throughput against peak memory per device, the Pareto front joined, the device limit drawn.

    Returns the PNG path.
    """
    fig = _figure(8.0, 4.5)
    ax = fig.add_subplot()
    done = complete(frame)
    done = done[done["peak_memory_bytes"].fillna(0) > 0] if not done.empty else done
    if not done.empty:
        ax.scatter(done["peak_memory_bytes"] / GiB, done["samples_per_s"], s=22, alpha=0.6,
                   color=STATUS_COLORS["complete"], label=f"complete trials ({len(done)})")
        front = pareto_front(done)
        ax.plot(front["peak_memory_bytes"] / GiB, front["samples_per_s"], "-D", color=BEST_COLOR,
                ms=6, lw=1.5, label=f"Pareto front ({len(front)})")
        top = done.loc[done["samples_per_s"].idxmax()]
        ax.scatter([top["peak_memory_bytes"] / GiB], [top["samples_per_s"]], s=160, marker="*",
                   color="gold", edgecolor="black", zorder=5, label="best throughput")
    if device_memory_bytes:
        ax.axvline(device_memory_bytes / GiB, color=STATUS_COLORS["oom"], ls="--", lw=1.2,
                   label=f"device memory ({device_memory_bytes / GiB:.0f} GiB)")
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("throughput (samples/s, whole job)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(title or "Throughput vs memory per device")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    if done.empty:
        _empty(ax, "no complete trial with a memory figure")
    return _save(fig, path)


def has_predictions(frame: pd.DataFrame) -> bool:
    """True when some trial carries the prior's prediction (real trials store it)."""
    return "predicted_samples_per_s" in frame.columns and bool(frame["predicted_samples_per_s"].notna().any())


def plot_predicted_vs_measured(frame: pd.DataFrame, path: str | Path, *, title: str = "") -> Path:
    """The prior's prediction against the measurement: throughput (left) and peak memory (right).

    Each complete real trial is a point (its trial number's order by colour: later trials were
    proposed by a prior refitted to the earlier ones); the diagonal is a perfect prediction.
    ``oom`` trials sit on the right panel's top edge at their predicted memory. Returns the PNG path.
    """
    fig = _figure(10.0, 4.5)
    left, right = fig.subplots(1, 2)
    has = frame[frame["predicted_samples_per_s"].notna()] if has_predictions(frame) else frame.iloc[0:0]
    done = complete(has)
    panels = ((left, "samples_per_s", "predicted_samples_per_s", 1.0, "throughput (samples/s)"),
              (right, "peak_memory_bytes", "predicted_memory_bytes", GiB, "peak memory per device (GiB)"))
    for ax, measured, predicted, scale, label in panels:
        pts = done[(done[measured].fillna(0) > 0) & (done[predicted].fillna(0) > 0)] if not done.empty else done
        if not pts.empty:
            x, y = pts[predicted] / scale, pts[measured] / scale
            sc = ax.scatter(x, y, c=pts["number"], cmap="viridis", s=26, alpha=0.8, label=f"complete ({len(pts)})")
            lo, hi = float(min(x.min(), y.min())) * 0.9, float(max(x.max(), y.max())) * 1.1
            ax.plot([lo, hi], [lo, hi], "--", color="grey", lw=1, label="prediction = measurement")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            if ax is right:
                fig.colorbar(sc, ax=ax, label="trial number")
        if ax is right and not has.empty:
            oom = has[(has["status"] == "oom") & (has[predicted].fillna(0) > 0)]
            if not oom.empty:
                top = ax.get_ylim()[1]
                ax.scatter(oom[predicted] / scale, [top] * len(oom), marker="v", s=40,
                           color=STATUS_COLORS["oom"], label=f"oom ({len(oom)})", clip_on=False)
        ax.set_xlabel(f"predicted {label}")
        ax.set_ylabel(f"measured {label}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
        if pts.empty:
            _empty(ax, "no real trial with a prediction")
    fig.suptitle(title or "Predicted vs measured")
    return _save(fig, path)


def plot_knob_effects(frame: pd.DataFrame, path: str | Path, *, max_knobs: int = 6, title: str = "") -> Path:
    """The knobs' effect: importance bars, then throughput by value for the most important knobs.

    Returns the PNG path.
    """
    importance = knob_importance(frame)
    shown = [k for k, _ in importance[:max_knobs]]
    cols = 3
    rows = 1 + math.ceil(len(shown) / cols) if shown else 1
    fig = _figure(10.0, 2.4 + 2.6 * (rows - 1))
    grid = fig.add_gridspec(rows, cols)
    ax = fig.add_subplot(grid[0, :])
    if importance:
        names = [k for k, _ in importance][::-1]
        shares = [v for _, v in importance][::-1]
        ax.barh(names, shares, color=STATUS_COLORS["complete"])
        for y, v in enumerate(shares):
            ax.text(v + 0.01, y, f"{v:.2f}", va="center", fontsize=8)
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("share of log-throughput variance explained by the knob alone (η²)")
        ax.tick_params(axis="y", labelsize=8)
    else:
        _empty(ax, "fewer than 3 complete trials, or no knob varied")
    ax.set_title(title or "Knob importance and effect")
    done = complete(frame)
    for i, knob in enumerate(shown):
        sub = fig.add_subplot(grid[1 + i // cols, i % cols])
        _strip(sub, done, KNOB_PREFIX + knob)
        sub.set_title(knob, fontsize=9)
        sub.set_ylabel("samples/s", fontsize=8)
        sub.tick_params(labelsize=8)
        sub.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _strip(ax: Axes, done: pd.DataFrame, col: str) -> None:
    labels = done[col].map(_label)
    values = sorted(set(labels), key=_sort_key)
    for x, value in enumerate(values):
        ys = done["samples_per_s"][labels == value].to_numpy(dtype=float)
        # Deterministic jitter so repeated reports draw the same picture.
        offsets = [((j * 0.618) % 1.0 - 0.5) * 0.5 for j in range(len(ys))]
        ax.scatter([x + o for o in offsets], ys, s=10, alpha=0.5, color=STATUS_COLORS["complete"])
        ax.scatter([x], [ys.max()], marker="_", s=300, color=BEST_COLOR, lw=2)
    ax.set_xticks(range(len(values)), values)
    ax.set_ylim(bottom=0)


def plot_tuned_vs_baselines(best_samples_per_s: float | None, baselines: Sequence[Baseline], path: str | Path,
                            *, tuned_label: str = "tuned", title: str = "") -> Path:
    """Bars: the tuned schedule's throughput against each baseline's, with the speed-up written on.

    Baselines that did not run (OOM, failed) get an empty bar labelled with their status.
    Returns the PNG path.
    """
    fig = _figure(8.0, 1.4 + 0.55 * (len(baselines) + 1))
    ax = fig.add_subplot()
    names = [tuned_label, *[b.name for b in baselines]]
    values = [best_samples_per_s or 0.0, *[b.samples_per_s or 0.0 for b in baselines]]
    colors = [BEST_COLOR, *["#9aa9b8" for _ in baselines]]
    ys = list(range(len(names)))[::-1]
    ax.barh(ys, values, color=colors)
    ax.set_yticks(ys, names, fontsize=9)
    top = max(values) if values and max(values) > 0 else 1.0
    for y, value, base in zip(ys[1:], values[1:], baselines, strict=True):
        if value > 0 and best_samples_per_s:
            text = f"{value:.4g}  (tuned is {best_samples_per_s / value:.2f}x)"
        elif value > 0:
            text = f"{value:.4g}"
        else:
            text = base.status.upper() if base.status != "complete" else "no result"
        ax.text(value + top * 0.01, y, text, va="center", fontsize=8,
                color="black" if value > 0 else STATUS_COLORS.get(base.status, "black"))
    if best_samples_per_s:
        ax.text(best_samples_per_s + top * 0.01, ys[0], f"{best_samples_per_s:.4g}", va="center",
                fontsize=8, fontweight="bold")
    else:
        _empty(ax, "no complete tuned trial")
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel("throughput (samples/s, whole job)")
    ax.set_title(title or "Tuned schedule vs out-of-the-box baselines")
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#555555")
