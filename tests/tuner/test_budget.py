"""A study's own budget in the store: set by the tune that creates it, raised by a resume (or a tuner
joining it) with more ``--trials``, never lowered by one with fewer."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from store import Store, open_store
from tuner import TuneOptions, tune

TINY = ModelSpec.from_name("bert-tiny")
CPU4 = ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)


def _options(trials: int, **kw: object) -> TuneOptions:
    return TuneOptions(model=TINY, cluster=CPU4, trials=trials, study="b", baselines=False, sweep=False,
                       **kw)  # type: ignore[arg-type]


def _launched(store: Store, study: str) -> int:
    return sum(1 for t in store.trials(study) if t.status != "pruned")


def test_a_resume_raises_the_stored_budget_and_a_smaller_one_never_lowers_it(store: Store) -> None:
    tune(_options(4), store)
    assert store.get_study("b").budget == 4 and _launched(store, "b") == 4
    out = tune(_options(7, resume=True), store)
    assert out.stop_reason == "budget" and _launched(store, "b") == 7
    assert store.get_study("b").budget == 7
    tune(_options(5, resume=True), store)  # fewer than it holds: runs nothing, lowers nothing
    assert store.get_study("b").budget == 7 and _launched(store, "b") == 7


def test_tuners_joining_a_study_leave_the_largest_budget(store: Store) -> None:
    tune(_options(5, join=True), store)
    assert store.get_study("b").budget == 5
    tune(_options(3, join=True), store)
    assert store.get_study("b").budget == 5 and _launched(store, "b") == 5


def test_cli_tune_then_resume_with_more_trials_raises_the_budget(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["tune", "bert-tiny", "--gpus", "4", "--gpu-type", "cpu", "--storage", url, "--no-baselines",
            "--study", "c"]
    assert main([*base, "--trials", "3"]) == 0
    with open_store(url) as db:
        assert db.get_study("c").budget == 3
    assert main([*base, "--trials", "6", "--resume"]) == 0
    assert main([*base, "--trials", "2", "--resume"]) == 0
    capsys.readouterr()
    with open_store(url) as db:
        assert db.get_study("c").budget == 6
