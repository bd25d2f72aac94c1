"""The service's tables through the store facade: job claims under a lease, tokens as hashes."""

from __future__ import annotations

import threading
import time

import pytest

from autoslapo.errors import StorageError
from store import JobLimitError, open_store
from tests.store.conftest import study_kwargs


def test_claim_lease_heartbeat_and_takeover(store_url: str) -> None:
    with open_store(store_url) as db:
        a = db.jobs.submit("a", {"model": "bert", "gpus": 8}, owner="me")
        db.jobs.submit("b", {"model": "bert", "gpus": 8})
        assert a.status == "queued" and a.owner == "me"
        first = db.jobs.claim("w1", 0.2)
        second = db.jobs.claim("w2", 30)
        assert first is not None and second is not None
        assert (first.study, second.study) == ("a", "b")
        assert db.jobs.claim("w3", 30) is None  # both held
        assert db.jobs.heartbeat(first.id, "w1", 0.2) == (True, False)
        time.sleep(0.5)  # w1 stops beating: its lease lapses
        taken = db.jobs.claim("w3", 30)
        assert taken is not None and taken.study == "a" and taken.attempts == 2
        assert db.jobs.heartbeat(first.id, "w1", 30) == (False, False)
        assert db.jobs.finish(first.id, "w1", "complete") is False  # no longer w1's
        assert db.jobs.cancel("a").cancel_requested is True
        assert db.jobs.heartbeat(first.id, "w3", 30) == (True, True)
        assert db.jobs.finish(first.id, "w3", "cancelled") is True
        assert db.jobs.get("a").status == "cancelled"
        assert db.jobs.claim("w4", 30) is None


def test_a_released_job_is_queued_again_and_skipped_by_its_releaser(store_url: str) -> None:
    with open_store(store_url) as db:
        a = db.jobs.submit("a", {"model": "bert", "gpus": 8})
        db.jobs.submit("b", {"model": "bert", "gpus": 8})
        taken = db.jobs.claim("w1", 30)
        assert taken is not None and taken.id == a.id
        assert db.jobs.release(a.id, "w2", "not mine") is False  # only its holder gives it back
        assert db.jobs.release(a.id, "w1", "needs a flag") is True
        back = db.jobs.get("a")
        assert (back.status, back.worker, back.attempts, back.error, back.lease_until) == ("queued", "", 0,
                                                                                         "needs a flag", None)
        assert db.jobs.release(a.id, "w1", "again") is False  # no longer held
        other = db.jobs.claim("w1", 30, skip={a.id})
        assert other is not None and other.study == "b"
        assert db.jobs.claim("w1", 30, skip={a.id}) is None
        again = db.jobs.claim("w2", 30)
        assert again is not None and again.study == "a" and again.attempts == 1
        assert db.jobs.finish(again.id, "w2", "complete") is True and db.jobs.get("a").error == ""


def test_submit_refuses_a_taken_name(store_url: str) -> None:
    with open_store(store_url) as db:
        db.create_study("taken", **study_kwargs())
        with pytest.raises(StorageError, match="unique"):
            db.jobs.submit("taken", {})
        db.jobs.submit("queued", {})
        with pytest.raises(StorageError, match="unique"):
            db.jobs.submit("queued", {})
        assert [j.study for j in db.jobs.list()] == ["queued"]
        assert db.jobs.cancel("queued").status == "cancelled"
        with pytest.raises(StorageError, match="no job"):
            db.jobs.cancel("never")


def test_tokens_keep_hashes_and_revoke(store_url: str) -> None:
    with open_store(store_url) as db:
        db.tokens.add("ci", "k1", "submit", "$argon2id$hash")
        with pytest.raises(StorageError, match="unique"):
            db.tokens.add("ci", "k2", "read", "h")
        with pytest.raises(StorageError, match="role"):
            db.tokens.add("x", "k3", "root", "h")
        assert db.tokens.by_key("k1").role == "submit"
        assert db.tokens.revoke("ci").active is False
        assert db.tokens.by_key("k1").active is False
        assert [t.name for t in db.tokens.list()] == ["ci"]


def test_claim_respects_a_running_limit(store_url: str) -> None:
    with open_store(store_url) as db:
        for name in ("a", "b", "c"):
            db.jobs.submit(name, {"model": "bert", "gpus": 8})
        first = db.jobs.claim("w1", 0.3, max_running=2)
        second = db.jobs.claim("w2", 30, max_running=2)
        assert first is not None and second is not None
        assert db.jobs.claim("w3", 30, max_running=2) is None  # two run: c stays queued
        assert db.jobs.get("c").status == "queued"
        time.sleep(0.6)  # w1's lease lapses: its job no longer counts, and is the one resumed
        taken = db.jobs.claim("w3", 30, max_running=2)
        assert taken is not None and taken.study == "a"
        assert db.jobs.claim("w4", 30, max_running=2) is None
        assert db.jobs.finish(second.id, "w2", "complete") is True
        third = db.jobs.claim("w4", 30, max_running=2)
        assert third is not None and third.study == "c"
        with pytest.raises(StorageError, match="max_running"):
            db.jobs.claim("w5", 30, max_running=0)


def test_submit_respects_an_unfinished_limit_per_owner(store_url: str) -> None:
    with open_store(store_url) as db:
        db.jobs.submit("a", {}, owner="me", max_unfinished=2)
        db.jobs.submit("b", {}, owner="me", max_unfinished=2)
        with pytest.raises(JobLimitError, match="'me' has 2 queued or running studies, the limit is 2"):
            db.jobs.submit("c", {}, owner="me", max_unfinished=2)
        db.jobs.submit("c", {}, owner="you", max_unfinished=2)
        db.jobs.cancel("a")
        db.jobs.submit("d", {}, owner="me", max_unfinished=2)
        assert [j.study for j in db.jobs.list()] == ["a", "b", "c", "d"]


def test_workers_racing_to_claim_take_each_job_once(store_url: str) -> None:
    """Four workers, each with its own connections, drain the queue at once (``FOR UPDATE SKIP
    LOCKED`` on PostgreSQL, a locked transaction on SQLite): every job is claimed exactly once."""
    with open_store(store_url) as db:
        ids = [db.jobs.submit(f"j{i}", {"model": "bert", "gpus": 8}).id for i in range(24)]
    taken: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def drain(worker: str) -> None:
        try:
            with open_store(store_url) as own:
                start.wait(timeout=30)
                while (job := own.jobs.claim(worker, 60)) is not None:
                    taken.append((job.id, worker))
        except BaseException as err:  # reported below: a thread's failure must fail the test
            errors.append(err)

    threads = [threading.Thread(target=drain, args=(f"w{k}",)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(job for job, _ in taken) == ids  # none twice, none left
    with open_store(store_url) as db:
        jobs = db.jobs.list()
    assert all(j.status == "running" and j.attempts == 1 for j in jobs)
    assert {j.id: j.worker for j in jobs} == dict(taken)


def test_requeue_resumes_a_finished_job_and_keeps_its_space(store_url: str) -> None:
    with open_store(store_url) as db:
        space = {"name": "mine", "knobs": {"tp": [1, 2]}}
        job = db.jobs.submit("a", {"model": "bert", "gpus": 8, "trials": 5, "space": space}, owner="me")
        with pytest.raises(StorageError, match="'a' is queued already"):
            db.jobs.requeue("a", {"model": "bert", "gpus": 8, "trials": 9})
        claimed = db.jobs.claim("w1", 30)
        assert claimed is not None and claimed.id == job.id
        with pytest.raises(StorageError, match="'a' is running already"):
            db.jobs.requeue("a", {"model": "bert", "gpus": 8, "trials": 9})
        assert db.jobs.finish(job.id, "w1", "complete", "")
        again = db.jobs.requeue("a", {"model": "bert", "gpus": 8, "trials": 9, "space": None}, owner="you")
        assert (again.id, again.status, again.owner, again.worker) == (job.id, "queued", "you", "")
        assert again.request["trials"] == 9 and again.request["space"] == space  # the space it began with
        other = {"name": "other", "knobs": {"tp": [4]}}
        second = db.jobs.claim("w2", 30)
        assert second is not None and db.jobs.finish(second.id, "w2", "cancelled", "")
        assert db.jobs.requeue("a", {"trials": 10, "space": other}).request["space"] == other
        with pytest.raises(StorageError, match="no study 'nope' to resume"):
            db.jobs.requeue("nope", {})
        db.create_study("cli", **study_kwargs())  # tuned outside the service: its first job
        first = db.jobs.requeue("cli", {"trials": 3}, owner="me", max_unfinished=5)
        assert first.status == "queued" and db.jobs.get("cli") == first
        taken = db.jobs.claim("w3", 30)
        assert taken is not None and taken.study == "a"
        db.jobs.finish(taken.id, "w3", "complete", "")
        with pytest.raises(JobLimitError):  # "me" has "cli" queued
            db.jobs.requeue("a", {}, owner="me", max_unfinished=1)
        assert db.jobs.get("a").status == "complete"


def test_a_raised_budget_keeps_the_job_running_past_the_trials_it_ran_to(store_url: str) -> None:
    with open_store(store_url) as db:
        a = db.jobs.submit("a", {"model": "bert", "gpus": 8, "trials": 3})
        assert db.jobs.raise_budget("a", 4) is not None  # queued: the claiming worker reads 4
        assert db.jobs.raise_budget("a", 2) is not None and db.jobs.get("a").request["trials"] == 4  # never lowered
        taken = db.jobs.claim("w1", 30)
        assert taken is not None and taken.request["trials"] == 4
        assert db.jobs.raise_budget("a", 6).request["trials"] == 6  # running
        assert db.jobs.finish(a.id, "w1", "complete", budget=4) is False  # went to 4: 6 asked, goes on
        assert db.jobs.get("a").status == "running"
        assert db.jobs.finish(a.id, "w2", "complete", budget=6) is False  # not w2's
        assert db.jobs.finish(a.id, "w1", "complete", budget=6) is True
        assert db.jobs.get("a").status == "complete"
        assert db.jobs.raise_budget("a", 9) is None  # ended: queue it again instead
        assert db.jobs.raise_budget("never", 9) is None
        assert db.jobs.get("a").request == {"model": "bert", "gpus": 8, "trials": 6}
