"""The store contract for the tuner's write path, on SQLite and on a real PostgreSQL server.

These are the calls ``tuner/study.py`` makes, in its order: ``claim_trial`` (a trial to run, or an
instant one with its result), ``add_new_trials`` (buffered pruned rows), ``finish_trial``, and on
resume ``get_study``, ``mark_stale_running``, ``trials`` and ``start_trial(..., restart=True)``
for the trials a killed tuner left behind.
"""

from __future__ import annotations

import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from autoslapo.errors import StorageError
from store import DuplicateTrial, Store, TrialRecord, open_store
from tests.store.conftest import config, result, study_kwargs


def pruned(i: int) -> dict[str, Any]:
    """A pruned trial's result as ``TrialResult.failure("pruned", ...).to_dict()`` gives it."""
    return {"status": "pruned", "reason": f"over memory by {i} GiB", "measured": False}


def statuses(db: Store, study: str) -> dict[int, str]:
    return {t.number: t.status for t in db.trials(study)}


def test_claims_number_trials_one_past_the_highest(db: Store, study: str) -> None:
    first = db.claim_trial(study, config(0))
    assert first is not None and (first.number, first.status, first.host) == (0, "running", "")
    assert first.result.get("claim") and first.ended_at is None and first.samples_per_s is None
    second = db.claim_trial(study, config(1), host="node-2")
    assert second is not None and (second.number, second.host) == (1, "node-2")
    db.add_trial(study, 10, config(10), result(10))  # a gap: numbers continue after the highest
    third = db.claim_trial(study, config(2))
    assert third is not None and third.number == 11
    assert db.add_new_trials(study, [(config(20), pruned(20)), (config(21), result(21))]) == 2
    instant = db.claim_trial(study, config(3), result=result(3))
    assert instant is not None and (instant.number, instant.status) == (14, "complete")
    assert instant.samples_per_s == 103.0 and instant.ended_at is not None and "claim" not in instant.result
    assert statuses(db, study) == {
        0: "running",
        1: "running",
        10: "complete",
        11: "running",
        12: "pruned",
        13: "complete",
        14: "complete",
    }
    assert db.get_trial(study, 13) == db.find_trial(study, config(21))


def test_new_trials_keep_the_times_they_ran_when_given(db: Store, study: str) -> None:
    """A baseline measured before its companion study is written keeps when it ran (its duration)."""
    t0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert db.add_new_trials(study, [(config(30), result(30)), (config(31), result(31))],
                             times=[(t0, t0 + timedelta(seconds=7)), None]) == 2
    kept = db.find_trial(study, config(30))
    assert kept is not None and kept.started_at == t0 and kept.ended_at == t0 + timedelta(seconds=7)
    now = db.find_trial(study, config(31))
    assert now is not None and now.started_at == now.ended_at and now.started_at > t0


def test_a_config_is_stored_once_per_study(db: Store, study: str) -> None:
    running = db.claim_trial(study, config(0))
    assert running is not None
    with pytest.raises(DuplicateTrial, match="trial 0 is already stored as running") as again:
        db.claim_trial(study, config(0))
    assert again.value.existing == running
    with pytest.raises(DuplicateTrial) as instant:
        db.claim_trial(study, config(0), result=result(0))
    assert instant.value.existing.status == "running"  # the tuner leaves it to its owner
    with pytest.raises(DuplicateTrial, match="already trial 0"):
        db.start_trial(study, 7, config(0))
    # Buffered pruned rows skip configs stored already, and repeats within the batch.
    batch = [(config(0), pruned(0)), (config(1), pruned(1)), (config(1), pruned(1)), (config(2), pruned(2))]
    assert db.add_new_trials(study, batch) == 2
    assert db.add_new_trials(study, batch) == 0
    assert db.add_new_trials(study, []) == 0
    # An instant trial claimed twice with the same result (a retried write) is the same row.
    done = db.claim_trial(study, config(3), result=result(3))
    assert db.claim_trial(study, config(3), result=result(3)) == done
    with pytest.raises(DuplicateTrial, match="trial 3 is already stored as complete"):
        db.claim_trial(study, config(3), result=result(3, "oom"))
    assert statuses(db, study) == {0: "running", 1: "pruned", 2: "pruned", 3: "complete"}
    assert len({t.config_hash for t in db.trials(study)}) == 4


def test_a_claimed_trial_is_finished_once(db: Store, study: str) -> None:
    claimed = db.claim_trial(study, config(0), budget=5)
    assert claimed is not None
    done = db.finish_trial(study, claimed.number, result(0, "oom"))
    assert (done.status, done.reason, done.samples_per_s) == ("oom", "oom at step 1", None)
    assert done.ended_at is not None and "claim" not in done.result and done.host == "node-1"
    assert db.finish_trial(study, claimed.number, result(0, "oom")) == done  # a retried finish
    with pytest.raises(DuplicateTrial, match="already stored as oom"):
        db.finish_trial(study, claimed.number, result(0))
    with pytest.raises(StorageError, match="must be started before"):
        db.finish_trial(study, 99, result(99))
    assert db.count_trials(study) == 1


def test_the_budget_counts_every_trial_but_pruned_ones(db: Store, study: str) -> None:
    assert db.add_new_trials(study, [(config(i), pruned(i)) for i in range(3)]) == 3
    a = db.claim_trial(study, config(3), budget=3)
    b = db.claim_trial(study, config(4), budget=3, result=result(4, "failed"))
    c = db.claim_trial(study, config(5), budget=3)
    assert [t.number for t in (a, b, c) if t is not None] == [3, 4, 5]
    assert db.claim_trial(study, config(6), budget=3) is None  # running, failed, running: full
    assert db.claim_trial(study, config(6), budget=3, result=result(6)) is None
    assert db.find_trial(study, config(6)) is None and db.count_trials(study) == 6
    db.finish_trial(study, 3, result(3))
    assert db.claim_trial(study, config(6), budget=3) is None  # finishing frees nothing
    # The tuner still flushes its pruned rows once full; they never count.
    assert db.add_new_trials(study, [(config(7), pruned(7))]) == 1
    assert db.claim_trial(study, config(8), budget=3) is None
    assert db.claim_trial(study, config(8), budget=0) is None
    extra = db.claim_trial(study, config(8), budget=4)
    assert extra is not None and extra.number == 7
    assert db.claim_trial(study, config(9)) is not None  # no budget: no limit
    used = [t for t in db.trials(study) if t.status != "pruned"]
    assert len(used) == 5


def _tuner(
    url: str, study: str, writer: int, order: list[int], budget: int, start: threading.Barrier
) -> list[int]:
    """One tuner's loop: claim each config until the budget is full, run it, store its result.

    Writer 0 runs real trials (claimed ``running``, then finished); writer 1 instant ones (claimed
    with their result), as ``StudyRunner.propose``/``complete`` do for the two kinds of evaluator.
    """
    won: list[int] = []
    with open_store(url) as db:
        start.wait(timeout=60)
        for i in order:
            host = f"writer-{writer}"
            try:
                if writer == 0:
                    rec: TrialRecord | None = db.claim_trial(study, config(i), budget=budget, host=host)
                    if rec is not None:
                        db.finish_trial(study, rec.number, result(i) | {"host": host})
                else:
                    rec = db.claim_trial(study, config(i), budget=budget, result=result(i) | {"host": host})
            except DuplicateTrial as dup:
                assert dup.existing.config_hash != "" and dup.existing.host != host
                continue
            if rec is None:
                break  # the shared budget is used up
            won.append(rec.number)
    return won


@pytest.mark.parametrize("budget", [16, 40])
def test_two_writers_sharing_a_study_never_collide_nor_pass_the_budget(
    db: Store, study: str, store_url: str, budget: int
) -> None:
    configs = 24
    orders = [random.Random(w).sample(range(configs), configs) for w in range(2)]
    start = threading.Barrier(2)
    outcomes: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        try:
            outcomes[writer] = _tuner(store_url, study, writer, orders[writer], budget, start)
        except BaseException as err:
            errors.append(err)
            start.abort()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    trials = db.trials(study)
    stored = min(budget, configs)
    assert [t.number for t in trials] == list(range(stored)), "numbers are dense and never collide"
    assert len({t.config_hash for t in trials}) == stored, "each config is stored once"
    assert all(t.status == "complete" for t in trials)
    assert sorted(outcomes[0] + outcomes[1]) == list(range(stored)), "each trial was won by one writer"
    assert {t.number: t.host for t in trials} == {n: f"writer-{w}" for w in (0, 1) for n in outcomes[w]}
    assert all(t.samples_per_s == result(t.config["micro_batch"])["samples_per_s"] for t in trials)


def _killed_tuner(url: str, study: str) -> None:
    """A tuner killed mid-study: one trial finished, two left running, one pruned row flushed."""
    with open_store(url) as db:
        db.create_study(study, **study_kwargs())
        db.set_study_status(study, "running")
        first = db.claim_trial(study, config(0), budget=4)
        assert first is not None
        db.finish_trial(study, first.number, result(0))
        assert db.claim_trial(study, config(1), budget=4, host="node-a") is not None
        assert db.add_new_trials(study, [(config(2), pruned(2))]) == 1
        assert db.claim_trial(study, config(3), budget=4, host="node-a") is not None
        # killed here: trials 1 and 3 stay running, the study stays "running"


def test_resume_fails_the_interrupted_trials_retries_them_and_ends_at_the_budget(store_url: str) -> None:
    _killed_tuner(store_url, "r")
    with open_store(store_url) as db:  # the resumed tuner, as StudyRunner._open_study/_load do
        rec = db.get_study("r")
        kwargs = study_kwargs()
        assert (rec.model_signature, rec.cluster_fingerprint, rec.status) == (
            kwargs["model_signature"],
            kwargs["cluster_fingerprint"],
            "running",
        )
        stale = db.mark_stale_running("r")
        assert [(t.number, t.status, t.host) for t in stale] == [
            (1, "failed", "node-a"),
            (3, "failed", "node-a"),
        ]
        assert all(t.reason.startswith("interrupted") and t.ended_at is not None for t in stale)
        assert all(t.result == {"status": "failed", "reason": t.reason} for t in stale)
        assert db.mark_stale_running("r") == []
        assert statuses(db, "r") == {0: "complete", 1: "failed", 2: "pruned", 3: "failed"}
        interrupted = [
            t for t in db.trials("r") if t.status == "failed" and t.reason.startswith("interrupted")
        ]
        assert [t.number for t in interrupted] == [1, 3]

        # The budget (4) counts the interrupted rows: one new trial fits, and retries add no rows.
        new = db.claim_trial("r", config(4), budget=4)
        assert new is not None and new.number == 4
        assert db.claim_trial("r", config(5), budget=4) is None
        for t in interrupted:
            again = db.start_trial("r", t.number, t.config, restart=True)
            assert (again.number, again.status, again.reason, again.ended_at) == (
                t.number,
                "running",
                "",
                None,
            )
            assert again.result.get("claim") and again.host == ""
            with pytest.raises(DuplicateTrial, match="already stored as running"):
                db.start_trial("r", t.number, t.config, restart=True)  # a second tuner retrying it too
            done = db.finish_trial("r", t.number, result(t.number))
            assert done.status == "complete" and done.samples_per_s == result(t.number)["samples_per_s"]
        db.finish_trial("r", 4, result(4, "timeout"))
        db.set_study_status("r", "complete")

        assert statuses(db, "r") == {0: "complete", 1: "complete", 2: "pruned", 3: "complete", 4: "timeout"}
        assert len([t for t in db.trials("r") if t.status != "pruned"]) == 4
        assert db.claim_trial("r", config(5), budget=4) is None
        assert db.get_study("r").status == "complete"


def test_a_live_tuners_running_trial_is_never_taken_over(db: Store, study: str) -> None:
    live = db.claim_trial(study, config(0), host="node-b")  # a joined tuner, still running it
    assert live is not None
    assert db.mark_stale_running(study, older_than_s=3600) == []  # started just now
    assert db.mark_stale_running(study, host="node-a") == []  # another machine's
    with pytest.raises(DuplicateTrial) as claimed:
        db.claim_trial(study, config(0), budget=10)
    assert claimed.value.existing.status == "running" and claimed.value.existing.host == "node-b"
    with pytest.raises(DuplicateTrial, match="already stored as running"):
        db.start_trial(study, live.number, config(0), restart=True)
    with pytest.raises(DuplicateTrial, match="number 0 is taken"):
        db.start_trial(study, live.number, config(1), restart=True)
    assert statuses(db, study) == {0: "running"}
    assert db.finish_trial(study, live.number, result(0)).status == "complete"
    with pytest.raises(DuplicateTrial, match="already trial 0"):
        db.start_trial(study, 1, config(0), restart=True)  # a complete trial is never re-run
