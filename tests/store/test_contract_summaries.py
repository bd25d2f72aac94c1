"""``Store.study_summaries``: what the service lists, in a few queries, on SQLite and PostgreSQL."""

from __future__ import annotations

from store import Store, StudySummary
from tests.store.conftest import config, result, study_kwargs


def test_summaries_count_by_status_and_pick_each_studys_best(db: Store) -> None:
    assert db.study_summaries() == []
    for name in ("b", "a", "empty"):
        db.create_study(name, **study_kwargs())
    db.add_trial("b", 0, config(0), result(5))
    db.add_trial("b", 1, config(1), result(9, "oom"))
    db.add_trial("b", 2, config(2), result(7))
    db.add_trial("b", 3, config(3), result(7))  # as fast as trial 2: the lower number wins
    db.add_trial("b", 4, config(4), result(4))
    db.add_trial("a", 0, config(0), result(1, "failed"))
    db.start_trial("a", 1, config(1))
    summaries = db.study_summaries()
    assert [s.study.name for s in summaries] == ["b", "a", "empty"]  # oldest first, as list_studies
    assert all(isinstance(s, StudySummary) for s in summaries)
    b, a, empty = summaries
    assert b.counts == {"complete": 4, "oom": 1}
    assert b.best is not None and (b.best.study, b.best.number, b.best.samples_per_s) == ("b", 2, 107.0)
    assert b.best == db.trials("b")[2]
    assert a.counts == {"failed": 1, "running": 1} and a.best is None
    assert empty.counts == {} and empty.best is None
    assert b.study == db.get_study("b")


def test_summaries_follow_a_new_better_trial(db: Store, study: str) -> None:
    db.add_trial(study, 0, config(0), result(3))
    assert db.study_summaries()[0].best.number == 0  # type: ignore[union-attr]
    db.add_trial(study, 1, config(1), result(8))
    (summary,) = db.study_summaries()
    assert summary.best is not None and summary.best.number == 1 and summary.counts == {"complete": 2}
