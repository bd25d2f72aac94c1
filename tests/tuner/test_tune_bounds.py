"""--timeout counts from the start of the search (walking and ranking the space included) and holds
in a sim sweep too; --patience is refused where a sweep would ignore it; --resume without --study
takes the newest interrupted study of the default name; a baseline no rule allows says which rule."""

from __future__ import annotations

import time

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import BoundSpace
from store import Store
from tuner import Prediction, TuneOptions, tune
from tuner.resume import resume_target
from tuner.sweep import sweep_space
from tuner.walk import TICK

BASE = ModelSpec.from_name("bert-base")
V100_16 = ClusterSpec(gpus=16, gpu_type="v100-32gb")
TINY = ModelSpec.from_name("bert-tiny")
CPU4 = ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)


def _count_derives(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    derive = BoundSpace.derive

    def counted(self: BoundSpace, params: dict) -> object:
        calls[0] += 1
        return derive(self, params)

    monkeypatch.setattr(BoundSpace, "derive", counted)
    return calls


@pytest.mark.parametrize("sweep", [False, None], ids=["sampled", "sweep"])
def test_timeout_counts_from_the_start_walking_the_space_included(store: Store, monkeypatch: pytest.MonkeyPatch,
                                                                  sweep: bool | None) -> None:
    # The clock used to start after ranking the space (sampled) or not at all (sweep): every point
    # of the space was walked before the timeout was looked at.
    calls = _count_derives(monkeypatch)
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=50, timeout_s=1e-6, baselines=False, study="t",
                           warm_start=False, sweep=sweep), store)
    space_points = _bound().size
    assert out.stop_reason == "timeout" and out.launched == 0
    assert calls[0] < space_points / 2, (calls[0], space_points)
    assert store.get_study("t").status == "stopped"  # --resume goes on with it


def _bound() -> BoundSpace:
    from search_spaces import space_for

    return space_for(BASE.family).bind(BASE, V100_16, None, None)


def test_a_sweep_stopped_by_its_deadline_keeps_the_best_of_what_it_scored() -> None:
    config = ScheduleConfig(tp=1, pp=1, dp=4, micro_batch=1, grad_accum=1)
    configs = [config] * (3 * TICK)
    seen: list[tuple[int, int, str]] = []
    sweep = sweep_space(configs, lambda c: Prediction(True, 1.0), lambda c: TrialResult(status="complete",
                        samples_per_s=1.0), keep=1, exact=True, deadline=time.monotonic() - 1,
                        tick=lambda *a: seen.append(a))
    assert sweep.timed_out and sweep.scored == TICK and sweep.total == 3 * TICK
    assert sweep.summary(1)["of"] == 3 * TICK and len(sweep.best) == 1
    full = sweep_space(configs, lambda c: Prediction(True, 1.0), lambda c: TrialResult(status="complete",
                       samples_per_s=1.0), keep=1, exact=True, tick=lambda *a: seen.append(a))
    assert not full.timed_out and "of" not in full.summary(1)
    assert seen == [(TICK, 3 * TICK, "configurations"), (2 * TICK, 3 * TICK, "configurations"),
                    (3 * TICK, 3 * TICK, "configurations")]  # progress while scoring


def test_ranking_the_space_shows_progress(store: Store) -> None:
    lines: list[str] = []
    tune(TuneOptions(model=BASE, cluster=V100_16, trials=3, baselines=False, study="r", warm_start=False,
                     sweep=False), store, progress=lambda p: lines.append(p.last))
    walked = [s for s in lines if s.startswith("ranking the space by the cost model: ") and s.endswith(" points")]
    ranked = [s for s in lines if s.startswith("ranking the space by the cost model: ")
              and s.endswith(" configurations")]
    assert walked and ranked, lines[:5]


def test_patience_is_refused_by_a_sweep_and_nothing_is_stored(store: Store) -> None:
    with pytest.raises(UsageError, match=r"--patience stops a sampled search .* got --patience 5 .*pass --sampler"):
        tune(TuneOptions(model=TINY, cluster=CPU4, trials=3, patience=5, baselines=False), store)
    assert store.list_studies() == []
    out = tune(TuneOptions(model=TINY, cluster=CPU4, trials=3, patience=5, baselines=False, sweep=False), store)
    assert out.launched >= 1  # a sampled study takes it


def test_resume_without_a_name_takes_the_newest_interrupted_study(store: Store) -> None:
    opts = TuneOptions(model=TINY, cluster=CPU4, trials=3, baselines=False, sweep=False)
    first = tune(opts, store)
    second = tune(opts, store)
    assert (first.study, second.study) == ("bert-tiny-4xcpu-sim", "bert-tiny-4xcpu-sim-2")
    store.set_study_status(second.study, "stopped")  # as a Ctrl-C leaves it
    opened: list[str] = []
    again = tune(TuneOptions(model=TINY, cluster=CPU4, trials=3, baselines=False, sweep=False, resume=True), store,
                 opened=opened.append)
    assert again.study == opened[0] == "bert-tiny-4xcpu-sim-2"
    assert store.get_study("bert-tiny-4xcpu-sim-2").status == "complete"
    # every one complete: the newest
    assert tune(TuneOptions(model=TINY, cluster=CPU4, trials=3, baselines=False, sweep=False, resume=True),
                store).study == "bert-tiny-4xcpu-sim-2"


def test_a_baseline_no_layout_rule_allows_is_not_reported_out_of_memory(store: Store) -> None:
    # 4 replicas cannot split a global batch of 3: pure data parallelism is invalid, not out of memory
    out = tune(TuneOptions(model=TINY, cluster=CPU4, trials=3, global_batch=3), store)
    ds = out.baselines["deepspeed"]
    assert ds["status"] == "failed" and ds["speedup"] is None, ds
    assert ds["reason"].startswith("no deepspeed-style configuration is valid here: micro_batch*dp must divide "
                                   "the global batch: got 1*4 for 3"), ds["reason"]
    stored = [t for t in store.trials(f"{out.study}.baselines") if t.result["extra"].get("baseline") == "deepspeed"]
    assert stored and stored[0].status == "failed" and stored[0].reason == ds["reason"]


def test_resume_without_a_name_leaves_a_study_another_tuner_is_running(store: Store) -> None:
    """A running study whose tuner is alive (its heartbeat fresh) is never taken over by a --resume that
    names no study: the newest interrupted one is resumed instead."""
    opts = TuneOptions(model=TINY, cluster=CPU4, trials=3, baselines=False, sweep=False)
    first, second = tune(opts, store), tune(opts, store)
    store.set_study_status(first.study, "stopped")
    store.set_study_status(second.study, "running")  # a live tuner's: marked alive just now
    assert resume_target(store, first.study, TINY.signature(), CPU4.fingerprint()) == first.study


@pytest.mark.slow
def test_resuming_a_sweep_its_timeout_cut_short_stores_the_spaces_optimum(store: Store,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut-short sweep stored the best of what it had scored (its budget's worth); the resume scores
    the rest and stores what beats them, so the study holds the optimum a sweep run to its end finds
    (before: nothing was stored, the study full, and best answered the cut-short result)."""
    import tuner.sweep

    whole = tuner.sweep.sweep_space

    def late_optimum(configs: list[ScheduleConfig], *args: object, **kw: object) -> tuner.sweep.Sweep:
        kw["deadline"] = time.monotonic() - 1  # stops after the first TICK configurations
        return whole(list(configs)[::-1], *args, **kw)  # type: ignore[arg-type]

    opts = TuneOptions(model=BASE, cluster=V100_16, trials=5, baselines=False, study="cut", warm_start=False)
    monkeypatch.setattr(tuner.sweep, "sweep_space", late_optimum)
    first = tune(opts, store)
    assert first.stop_reason == "timeout" and store.get_study("cut").status == "stopped"
    monkeypatch.undo()
    again = tune(TuneOptions(model=BASE, cluster=V100_16, trials=5, baselines=False, study="cut",
                             warm_start=False, resume=True), store)
    full = tune(TuneOptions(model=BASE, cluster=V100_16, trials=5, baselines=False, study="full",
                            warm_start=False), store)

    def stored_best(study: str) -> float:
        return max(t.samples_per_s or 0.0 for t in store.trials(study) if t.status == "complete")

    assert store.get_study("cut").status == "complete"
    assert again.best_result is not None and full.best_result is not None
    assert stored_best("cut") == stored_best("full") == again.best_result.samples_per_s > 0
