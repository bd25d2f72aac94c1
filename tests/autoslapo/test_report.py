"""The report: figure files, the self-contained page, and the numbers the figures are drawn from."""

from __future__ import annotations

import base64
import html.parser
import sys
from pathlib import Path

import pytest

from autoslapo.errors import UsageError
from autoslapo.report import Baseline, baseline_label, plots, render_report, write_report
from tests.autoslapo.test_cli_results import STUDY, make_study

PNG = b"\x89PNG\r\n\x1a\n"


class _Page(html.parser.HTMLParser):
    """Collects what a browser would fetch: img sources, links, scripts, style sheets."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src") or "")
        for key in ("href", "src"):
            value = a.get(key) or ""
            if value and not value.startswith("data:"):
                self.external.append(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def test_report_writes_pngs_and_a_self_contained_page(tmp_path: Path) -> None:
    from store import open_store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    written = make_study(url, n=15, measured_every=3)
    baselines = [Baseline("ZeRO-3 out of the box", "complete", 500.0, 40 * 1024**3, measured=False),
                 Baseline("Megatron tp=8", "oom", None, reason="needs 95 GiB")]
    with open_store(url) as db:
        report = write_report(db, STUDY, tmp_path / "out", baselines=baselines)
    assert set(report.images) == {"throughput_over_trials", "throughput_vs_memory", "knob_effects",
                                  "tuned_vs_baselines"}
    for path in report.images.values():
        data = path.read_bytes()
        assert data[:8] == PNG and len(data) > 5000
    page = _parse(report.html)
    assert "html" in page.tags and "table" in page.tags
    assert page.external == []  # nothing to fetch: no links, scripts or remote images
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in page.images]
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert sorted(embedded) == sorted(p.read_bytes() for p in report.images.values())
    text = " ".join(page.text)
    best = max(w["samples_per_s"] for w in written if w["status"] == "complete")
    assert f"{best:.4g}" in text and "bert-large" in text and "64 x a100-80gb" in text
    assert f"{best / 500.0:.2f}x" in text and "needs 95 GiB" in text


def test_report_of_a_study_without_trials(tmp_path: Path) -> None:
    from store import open_store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    make_study(url, n=0)
    with open_store(url) as db:
        report = write_report(db, STUDY, tmp_path / "out")
    assert "tuned_vs_baselines" not in report.images
    assert all(p.read_bytes()[:8] == PNG for p in report.images.values())
    assert "no best schedule yet" in report.html.read_text()


def test_report_output_must_be_a_directory(tmp_path: Path) -> None:
    import pandas as pd

    target = tmp_path / "f"
    target.write_text("x")
    with pytest.raises(UsageError, match="must be a directory"):
        render_report(None, pd.DataFrame(), target)  # type: ignore[arg-type]


def test_pareto_front_keeps_only_undominated_trials() -> None:
    import pandas as pd

    frame = pd.DataFrame({
        "number": [0, 1, 2, 3, 4, 5],
        "status": ["complete", "complete", "complete", "complete", "oom", "complete"],
        "samples_per_s": [100.0, 80.0, 150.0, 140.0, None, 150.0],
        "peak_memory_bytes": [10, 12, 20, 25, None, 30],
    })
    front = plots.pareto_front(frame)
    # 1 is heavier and slower than 0; 3 is heavier and slower than 2; 5 ties 2 but is heavier.
    assert front["number"].tolist() == [0, 2]


def test_knob_importance_ranks_the_deciding_knob_first() -> None:
    import pandas as pd

    rows = []
    for i in range(24):
        tp = (1, 2, 4)[i % 3]
        kernel = ("sdpa", "flash")[(i // 3) % 2]
        rows.append({"number": i, "status": "complete", "samples_per_s": 1000.0 / tp * (1 + 0.01 * (i % 2)),
                     "config.tp": tp, "config.attn_kernel": kernel, "config.zero_stage": 1})
    ranked = plots.knob_importance(pd.DataFrame(rows))
    names = [k for k, _ in ranked]
    assert names[0] == "tp" and ranked[0][1] > 0.99
    assert "zero_stage" not in names  # constant knobs explain nothing and are left out
    assert dict(ranked)["attn_kernel"] < 0.01


def test_plots_do_not_import_pyplot(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys, pandas as pd\n"
        "from autoslapo.report import plots\n"
        "f = pd.DataFrame({'number':[0,1],'status':['complete','failed'],'samples_per_s':[1.0,None],"
        "'peak_memory_bytes':[1,None],'measured':[True,False]})\n"
        f"plots.plot_throughput_over_trials(f, {str(tmp_path / 'a.png')!r})\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "False"
    assert (tmp_path / "a.png").read_bytes()[:8] == PNG


def test_a_baseline_with_repeats_shows_its_speedup_interval() -> None:
    from autoslapo.report.html import _baseline_rows

    ci = {"speedup": 1.19, "low": 1.07, "high": 1.31, "significant": True, "repeats": 3}
    rows = _baseline_rows([Baseline("DeepSpeed", "complete", 100.0, speedup_ci95=ci),
                           Baseline("Megatron", "complete", 100.0,
                                    speedup_ci95={**ci, "low": 0.9, "significant": False}),
                           Baseline("plain", "complete", 100.0)], 119.0)
    assert rows[0]["tuned speed-up"] == "1.19x (95% CI 1.07-1.31, 3 interleaved repeats)"
    assert rows[1]["tuned speed-up"].startswith("no significant speed-up, 1.19x (95% CI 0.90-1.31")
    assert rows[2]["tuned speed-up"] == "1.19x"


def test_a_baseline_is_named_with_the_layout_it_ran() -> None:
    assert baseline_label("megatron", {"tp": 2, "pp": 1, "ckpt_ratio": 1.0}) == (
        "Megatron-LM style (TP 2, PP 1, full recompute)")
    assert baseline_label("megatron", {"tp": 1, "pp": 1, "ckpt_ratio": 0.0}) == (
        "Megatron-LM style (TP 1, PP 1, no recompute)")  # it said "full recompute" whatever it ran
    assert baseline_label("megatron", None) == "Megatron-LM style (none fits)"  # it said TP 8 on 2 ranks
    assert baseline_label("deepspeed", {"tp": 1}) == "DeepSpeed out of the box (ZeRO, pure DP)"
    assert baseline_label("other", None) == "other"


def test_the_summary_counts_as_estimated_only_what_the_cost_model_answered(tmp_path: Path) -> None:
    """A trial in flight (or one that failed) is neither measured nor estimated (it was "estimated")."""
    from autoslapo.report import _summary
    from store import open_store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    written = make_study(url, n=15, measured_every=3)
    with open_store(url) as db:
        db.start_trial(STUDY, 15, {"tp": 8, "pp": 1, "dp": 8, "micro_batch": 1})
        db.add_trial(STUDY, 16, {"tp": 8, "pp": 2, "dp": 4, "micro_batch": 1},
                     {"status": "failed", "reason": "rank 0: boom", "measured": False})
        summary = _summary(db.get_study(STUDY), db.to_dataframe(STUDY))
    measured = sum(bool(w["measured"]) for w in written)
    assert summary["measured / estimated"] == f"{measured} / {len(written) - measured}"
    assert "running 1" in summary["by status"] and "failed 1" in summary["by status"]
