"""The report's HTML page: one self-contained file, the PNGs embedded as ``data:`` URIs.

No scripts, no external style sheets or fonts: the page opens the same from a laptop's disk,
an email attachment or a CI artifact. Every value written into it is escaped.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoslapo.report.plots import Baseline, GiB
from autoslapo.stats import interval_samples

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; margin-top: 1.6em;
     border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
.meta { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.5em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f3f5f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { background: #eaf6ea; font-weight: 600; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.kv td:first-child { color: #555; }
.knobs { display: flex; flex-wrap: wrap; gap: 6px; padding: 0; }
.knobs span { border: 1px solid #ddd; border-radius: 3px; padding: 2px 8px; font-size: 0.88em; }
.knobs b { color: #555; font-weight: normal; margin-right: 4px; }
.row { display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }
"""


@dataclass(frozen=True)
class Figure:
    """One figure of the page: the PNG on disk, a heading and a caption."""

    title: str
    path: Path
    caption: str = ""


@dataclass(frozen=True)
class PageData:
    """What the page shows besides the figures (all plain values, escaped when written)."""

    title: str
    summary: dict[str, Any]
    best_config: dict[str, Any] | None
    best_metrics: dict[str, Any] | None
    top_trials: list[dict[str, Any]]
    baselines: Sequence[Baseline] = ()
    best_samples_per_s: float | None = None
    notes: list[str] = field(default_factory=list)


def data_uri(path: Path) -> str:
    """The PNG at ``path`` as a ``data:image/png;base64,...`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _cell(value: Any) -> tuple[str, bool]:
    """Text for a table cell and whether it is numeric (right-aligned)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", False
    if isinstance(value, bool):
        return ("yes" if value else "no"), False
    if isinstance(value, int):
        return f"{value:,}", True
    if isinstance(value, float):
        return f"{value:.4g}", True
    return str(value), False


def _table(rows: Sequence[dict[str, Any]], *, highlight: int | None = None) -> str:
    if not rows:
        return "<p>none</p>"
    columns: list[str] = []
    for row in rows:
        columns.extend(c for c in row if c not in columns)
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>"]
    for i, row in enumerate(rows):
        cls = ' class="best"' if i == highlight else ""
        cells = []
        for c in columns:
            text, num = _cell(row.get(c))
            cells.append(f'<td{" class=num" if num else ""}>{html.escape(text)}</td>')
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _kv(values: dict[str, Any]) -> str:
    rows = []
    for key, value in values.items():
        text, _ = _cell(value)
        rows.append(f"<tr><td>{html.escape(str(key))}</td><td>{html.escape(text)}</td></tr>")
    return '<table class="kv">' + "".join(rows) + "</table>"


def _baseline_rows(baselines: Sequence[Baseline], best: float | None) -> list[dict[str, Any]]:
    rows = []
    for b in baselines:
        speedup = best / b.samples_per_s if best and b.samples_per_s else None
        text = None if speedup is None else f"{speedup:.2f}x"
        ci = b.speedup_ci95
        if ci:
            value = f"{ci['speedup']:.2f}x" if ci["significant"] else f"no significant speed-up, {ci['speedup']:.2f}x"
            text = f"{value} (95% CI {ci['low']:.2f}-{ci['high']:.2f}, {interval_samples(ci)})"
        rows.append({
            "baseline": b.name,
            "status": b.status,
            "samples/s": b.samples_per_s,
            "peak memory (GiB)": None if not b.peak_memory_bytes else b.peak_memory_bytes / GiB,
            "tuned speed-up": text,
            "measured": b.measured,
            "reason": b.reason,
        })
    return rows


def render_page(page: PageData, figures: Sequence[Figure]) -> str:
    """The whole HTML document as a string, with every figure embedded."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(page.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(page.title)}</h1>",
        '<div class="row"><div><h2>Study</h2>',
        _kv(page.summary),
        "</div><div><h2>Best schedule</h2>",
    ]
    if page.best_config:
        parts.append(_kv(page.best_metrics or {}))
    else:
        parts.append("<p>No trial completed, so there is no best schedule yet.</p>")
    parts.append("</div></div>")
    if page.best_config:
        chips = "".join(
            f"<span><b>{html.escape(str(k))}</b>{html.escape(_cell(v)[0])}</span>" for k, v in page.best_config.items()
        )
        parts.append(f'<p>Knobs of the best schedule:</p><div class="knobs">{chips}</div>')
    if page.baselines:
        parts.append("<h2>Tuned vs out-of-the-box baselines</h2>")
        parts.append(_table(_baseline_rows(page.baselines, page.best_samples_per_s)))
    for fig in figures:
        parts.append(f"<h2>{html.escape(fig.title)}</h2><figure>")
        parts.append(f'<img src="{data_uri(fig.path)}" alt="{html.escape(fig.title)}">')
        if fig.caption:
            parts.append(f"<figcaption>{html.escape(fig.caption)}</figcaption>")
        parts.append("</figure>")
    parts.append(f"<h2>Top {len(page.top_trials)} trials</h2>")
    parts.append(_table(page.top_trials, highlight=0 if page.best_config else None))
    for note in page.notes:
        parts.append(f'<p class="meta">{html.escape(note)}</p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
