"""Interleaved repeats: the order of re-measurements, medians stored in place, speed-up intervals."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from store import Store, open_store
from tuner import TuneOptions, tune
from tuner.evaluators import SimEvaluator
from tuner.repeats import FINALISTS, interleaved

MODEL = ModelSpec.from_name("bert-tiny")
CLUSTER = ClusterSpec(gpus=2, gpu_type="cpu", gpus_per_node=2)


class WobblingEvaluator:
    """A real trial's stand-in that is not instant: the cost model's estimate times a wobble of up to
    +-4% that depends only on the call's position, and a record of the order of the calls."""

    name = "local"
    instant = False

    def __init__(self) -> None:
        self.sim = SimEvaluator(MODEL, CLUSTER)
        self.calls: list[ScheduleConfig] = []

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        self.calls.append(config)
        r = self.sim.evaluate(config)
        if r.status != "complete":
            return r
        wobble = 1.0 + 0.04 * math.sin(len(self.calls))
        return replace(r, samples_per_s=r.samples_per_s * wobble, measured=True, extra={})


def test_repeats_go_round_by_round() -> None:
    ev = WobblingEvaluator()
    a, b, c = (ScheduleConfig(dp=2, micro_batch=m, grad_accum=1) for m in (1, 2, 4))
    runs = interleaved(ev.evaluate, [a, b, c, a], 3)
    assert ev.calls == [a, b, c] * 3
    assert list(runs) == [a, b, c] and all(len(v) == 3 for v in runs.values())
    assert interleaved(ev.evaluate, [a], 0) == {a: []}


def test_a_real_study_remeasures_its_finalists_and_baselines_interleaved(store: Store) -> None:
    ev = WobblingEvaluator()
    out = tune(TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=4, study="s", repeats=2,
                           warm_start=False, mirror=False), store, evaluator=ev)
    # The last calls are 2 rounds over the same configurations, finalists first, then baselines.
    done = sorted(store.trials("s", status="complete"), key=lambda t: -(t.samples_per_s or 0.0))
    finalists = [ScheduleConfig.from_dict(t.config) for t in done if "repeats_samples_per_s" in t.result["extra"]]
    assert 1 <= len(finalists) <= FINALISTS
    bases = [ScheduleConfig.from_dict(b["config"]) for b in out.baselines.values() if b["status"] == "complete"]
    order = list(dict.fromkeys(finalists + bases))
    k = len(order)
    rounds = ev.calls[-2 * k:]
    assert rounds[:k] == rounds[k:] and len(set(rounds[:k])) == k  # A B C A B C, each once a round
    assert set(rounds[:len(finalists)]) == set(finalists) and set(rounds[:k]) == set(order)
    for t in done:
        extra = t.result["extra"]
        if "repeats_samples_per_s" in extra:
            samples = extra["repeats_samples_per_s"]
            assert len(samples) == 3 and t.samples_per_s == sorted(samples)[1]
            assert extra["samples_per_s_spread"] > 0
    assert out.best_result is not None and out.best_result.samples_per_s == done[0].samples_per_s
    intervals = out.best_result.extra["speedup_ci95"]
    for kind, b in out.baselines.items():
        ci = b["speedup_ci95"]
        assert ci is not None and ci["low"] <= ci["speedup"] <= ci["high"] and ci["repeats"] == 2
        assert ci["speedup"] == pytest.approx(b["speedup"]) and intervals[kind] == ci
    # one row a configuration: both baselines may pick the same (here data parallelism at ZeRO 0), and its
    # row then names both, with both intervals
    stored = [t.result["extra"] for t in store.trials("s.baselines")]
    kinds = [e.get("baselines") or [e["baseline"]] for e in stored]
    assert sorted(k for ks in kinds for k in ks) == sorted(out.baselines)
    assert all(len(e["repeats_samples_per_s"]) == 3 and e["speedup_ci95"] == {k: out.baselines[k]["speedup_ci95"] for k in ks}
               for e, ks in zip(stored, kinds, strict=True))


def test_best_show_and_export_carry_the_repeats_and_the_interval(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_store(url) as store:
        tune(TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=3, study="s", repeats=3,
                         warm_start=False, mirror=False), store, evaluator=WobblingEvaluator())
    assert main(["best", "bert-tiny", "--gpus", "2", "--storage", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["repeats_samples_per_s"]) == 4 and doc["samples_per_s_spread"] >= 0
    assert set(doc["speedup_ci95"]) == {"deepspeed", "megatron"}
    assert all(c["low"] <= c["speedup"] <= c["high"] for c in doc["speedup_ci95"].values())
    assert main(["show", "s", "--storage", url, "--json"]) == 0
    trials = json.loads(capsys.readouterr().out)["trials"]
    assert any(len(t.get("repeats_samples_per_s", [])) == 4 for t in trials)
    assert main(["export", "s", "--output", str(tmp_path / "s.csv"), "--storage", url]) == 0
    capsys.readouterr()
    import pandas as pd

    frame = pd.read_csv(tmp_path / "s.csv")
    assert frame["samples_per_s_spread"].notna().any() and "speedup_ci95.deepspeed.low" in frame.columns
    text = pd.read_csv(tmp_path / "s.csv", dtype=str)["speedup_ci95.deepspeed.n_tuned"].dropna()
    assert len(text) == 1 and text.str.fullmatch(r"\d+").all()  # an integer, not 4.0
    # Parquet keeps the types the trials held, gaps and all (they were JSON text and floats)
    assert main(["export", "s", "--output", str(tmp_path / "s.parquet"), "--storage", url]) == 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(tmp_path / "s.parquet")
    assert schema.field("speedup_ci95.deepspeed.significant").type == pa.bool_()
    assert schema.field("speedup_ci95.deepspeed.n_tuned").type == pa.int64()
    assert schema.field("repeats_samples_per_s").type == pa.list_(pa.float64())
    best = pd.read_parquet(tmp_path / "s.parquet").dropna(subset=["speedup_ci95.deepspeed.speedup"])
    assert len(best) == 1 and best["repeats_samples_per_s"].iloc[0].tolist() == doc["repeats_samples_per_s"]


def test_sim_studies_have_no_repeats(store: Store) -> None:
    out = tune(TuneOptions(model=MODEL, cluster=CLUSTER, backend="sim", trials=3, study="s", repeats=3,
                           warm_start=False, mirror=False), store)
    assert all(b["speedup_ci95"] is None for b in out.baselines.values())
    assert all("repeats_samples_per_s" not in t.result.get("extra", {}) for t in store.trials("s"))


class LuckyFirstEvaluator(WobblingEvaluator):
    """Every configuration's first measurement 30 % high, its repeats as estimated: the winner's
    curse of picking finalists by one measurement, in its plainest form."""

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        first = config not in self.calls
        self.calls.append(config)
        r = self.sim.evaluate(config)
        if r.status != "complete":
            return r
        return replace(r, samples_per_s=r.samples_per_s * (1.3 if first else 1.0), measured=True, extra={})


def test_a_trial_measured_once_above_the_best_median_is_measured_again(store: Store) -> None:
    ev = LuckyFirstEvaluator()
    out = tune(TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=6, study="lucky", repeats=2,
                           warm_start=False, mirror=False, baselines=False), store, evaluator=ev)
    done = sorted(store.trials("lucky", status="complete"), key=lambda t: -(t.samples_per_s or 0.0))
    assert len(done) > FINALISTS
    # the best stored is a median of repeats, and it is the study's best
    assert "repeats_samples_per_s" in done[0].result["extra"]
    assert out.best_result is not None and out.best_result.samples_per_s == done[0].samples_per_s
    once = [t for t in done if "repeats_samples_per_s" not in t.result["extra"]]
    assert all((t.samples_per_s or 0.0) <= done[0].samples_per_s for t in once)
    truth = {ScheduleConfig.from_dict(t.config): ev.sim.evaluate(ScheduleConfig.from_dict(t.config)).samples_per_s
             for t in done}
    assert done[0].samples_per_s == pytest.approx(max(truth.values()))  # the truly fastest of those measured


class StoppedEvaluator(WobblingEvaluator):
    """Its user presses Ctrl-C at call ``stop_at`` (1-based)."""

    def __init__(self, stop_at: int) -> None:
        super().__init__()
        self.stop_at = stop_at

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        if len(self.calls) + 1 == self.stop_at:
            raise KeyboardInterrupt
        return super().evaluate(config)


def test_a_study_stopped_between_rounds_keeps_the_rounds_it_ran(tmp_path: Path) -> None:
    """Each round's medians are stored as it ends (a Ctrl-C in the second round lost the first's)."""
    def options(study: str) -> TuneOptions:
        return TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=4, study=study, repeats=2,
                           warm_start=False, mirror=False, baselines=False)

    with open_store(f"sqlite:///{tmp_path / 'a.db'}") as whole:
        ev = WobblingEvaluator()
        tune(options("s"), whole, evaluator=ev)
        finalists = sum("repeats_samples_per_s" in t.result["extra"] for t in whole.trials("s"))
    assert finalists >= 1 and len(ev.calls) == 4 + 2 * finalists
    with open_store(f"sqlite:///{tmp_path / 'b.db'}") as store:
        with pytest.raises(KeyboardInterrupt):
            tune(options("s"), store, evaluator=StoppedEvaluator(stop_at=4 + finalists + 1))  # round 2's first
        kept = [t.result["extra"]["repeats_samples_per_s"] for t in store.trials("s")
                if "repeats_samples_per_s" in t.result["extra"]]
        assert len(kept) == finalists and all(len(samples) == 2 for samples in kept)  # the search's + round 1
        assert store.get_study("s").status == "stopped"
        # at its budget but stopped before its repeats were done: a resume measures them (it measured nothing)
        tune(replace(options("s"), resume=True), store, evaluator=WobblingEvaluator())
        again = [t.result["extra"]["repeats_samples_per_s"] for t in store.trials("s")
                 if "repeats_samples_per_s" in t.result["extra"]]
        assert again and max(len(samples) for samples in again) == 4 and store.get_study("s").status == "complete"


def test_a_study_stopped_while_its_baselines_are_re_measured_keeps_their_picks(tmp_path: Path) -> None:
    """The baselines' picks were stored only when the phase after the search ended: a Ctrl-C in its
    repeats lost them, and --resume scored the candidates again (a real trial each)."""
    from tuner.baselines import stored_picks

    options = TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=4, study="s", repeats=2,
                          warm_start=False, mirror=False, baselines=True)
    with open_store(f"sqlite:///{tmp_path / 'a.db'}") as whole:
        ev = WobblingEvaluator()
        tune(options, whole, evaluator=ev)
        picks = {k: v[0] for k, v in stored_picks(whole, "s").items()}
    assert set(picks) == {"deepspeed", "megatron"}
    with open_store(f"sqlite:///{tmp_path / 'b.db'}") as store:
        with pytest.raises(KeyboardInterrupt):
            tune(options, store, evaluator=StoppedEvaluator(stop_at=len(ev.calls)))  # the last repeat
        assert store.get_study("s").status == "stopped"
        assert {k: v[0] for k, v in stored_picks(store, "s").items()} == picks  # kept, as picked
        again = WobblingEvaluator()
        tune(replace(options, resume=True), store, evaluator=again)
        assert {k: v[0] for k, v in stored_picks(store, "s").items()} == picks
        assert store.get_study("s").status == "complete"
        extra = {k: v[2] for k, v in stored_picks(store, "s").items()}
        assert all(e.get("speedup") for e in extra.values())  # the final rows carry the speed-ups


def test_the_note_on_repeats_counts_the_samples_stored_after_a_resume(store: Store) -> None:
    """A resumed study re-measures its finalists again, adding to the samples they hold; the note
    under `tune`'s table said "the search's and 2 interleaved repeats" whatever they held."""
    from autoslapo.cli.tune import repeats_note

    def options(trials: int, resume: bool) -> TuneOptions:
        return TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=trials, study="s", repeats=2,
                           warm_start=False, mirror=False, baselines=False, resume=resume)

    tune(options(3, False), store, evaluator=WobblingEvaluator())
    tune(options(5, True), store, evaluator=WobblingEvaluator())
    rows = sorted(store.trials("s", status="complete"), key=lambda t: -(t.samples_per_s or 0.0))
    counts = sorted({len(t.result["extra"]["repeats_samples_per_s"]) for t in rows
                     if "repeats_samples_per_s" in t.result["extra"]})
    assert counts[-1] == 5  # a finalist of both runs: the search's, then two rounds in each run
    note = repeats_note(rows)
    span = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    assert note is not None and f"median of {span} measurements" in note
    assert repeats_note([t for t in rows if "repeats_samples_per_s" not in t.result["extra"]]) is None


def test_a_study_stopped_during_a_trial_leaves_no_trial_running_and_resume_runs_it(store: Store) -> None:
    """Ctrl-C mid-trial left the trial ``running`` for good (shown, exported and reported as in flight)."""
    from tuner.study import INTERRUPTED_PREFIX

    options = TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=3, study="s", repeats=0,
                          warm_start=False, mirror=False, baselines=False)
    with pytest.raises(KeyboardInterrupt):
        tune(options, store, evaluator=StoppedEvaluator(stop_at=2))
    rows = store.trials("s")
    assert [t.status for t in rows] == ["complete", "failed"] and rows[1].reason.startswith(INTERRUPTED_PREFIX)
    assert store.get_study("s").status == "stopped"
    out = tune(replace(options, resume=True), store, evaluator=WobblingEvaluator())
    assert out.launched == 3 and [t.status for t in store.trials("s")] == ["complete"] * 3


class SlowEvaluator(WobblingEvaluator):
    """A measurement that takes time (20 ms), as a real one does."""

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        import time

        time.sleep(0.02)
        return super().evaluate(config)


def test_a_baselines_row_has_its_duration_and_prediction_and_keeps_them_on_resume(tmp_path: Path) -> None:
    """The companion study's rows were written with no duration (started = ended, when stored) and
    without the prior's prediction each real trial carries beside its measurement."""
    options = TuneOptions(model=MODEL, cluster=CLUSTER, backend="local", trials=3, study="s", repeats=0,
                          warm_start=False, mirror=False, baselines=True)
    with open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        tune(options, store, evaluator=SlowEvaluator())
        rows = [t for t in store.trials("s.baselines") if t.status == "complete"]
        assert rows
        for t in rows:
            assert t.started_at and t.ended_at and (t.ended_at - t.started_at).total_seconds() >= 0.015, t
            assert t.result["extra"]["predicted_samples_per_s"] > 0 and t.result["extra"]["predicted_memory_bytes"] > 0
        spans = {t.number: (t.started_at, t.ended_at) for t in rows}
        tune(replace(options, trials=4, resume=True), store, evaluator=SlowEvaluator())
        assert {t.number: (t.started_at, t.ended_at) for t in store.trials("s.baselines")
                if t.status == "complete"} == spans  # the companion was rewritten, its times kept
