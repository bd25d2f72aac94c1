"""A study's own budget (revision 0005): set, raised and never lowered, atomically; old rows read None."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import inspect, text

from autoslapo.errors import StorageError
from store import Store, open_store
from store._engine import build_engine
from store._migrate import head_revision, upgrade
from store._url import parse_url
from tests.store.conftest import config, result, study_kwargs


def _previous_head_db(url: str) -> None:
    """A database as revision 0004 (the service's tables) left it: one study, one trial, one job."""
    engine = build_engine(parse_url(url))
    try:
        assert upgrade(engine, "0004") == "0004"
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO autoslapo_studies (name, model_name, model_family, model, model_signature, "
                "cluster, cluster_fingerprint, gpus, gpu_type, gpu_memory_bytes, space_name, space_version, "
                "objective, backend, status, software, created_at, updated_at) VALUES ('old', "
                "'bert-large', 'bert', '{\"preset\": \"bert-large\"}', 'sig', '{\"gpus\": 8}', 'fp', 8, "
                "'a100-80gb', 85899345920, 'transformer', '1', 'samples_per_s', 'sim', 'complete', '{}', "
                "'2025-01-01 00:00:00', '2025-01-01 00:00:00')"))
            conn.execute(text(
                "INSERT INTO autoslapo_trials (study_id, number, config, config_hash, status, samples_per_s, "
                "measured, reason, host, result) SELECT id, 0, '{\"tp\": 1}', 'h0', 'complete', 100.0, true, "
                "'', 'old-host', '{}' FROM autoslapo_studies WHERE name = 'old'"))
            conn.execute(text(
                "INSERT INTO autoslapo_jobs (study, owner, request, status, cancel_requested, worker, attempts, "
                "error, created_at, updated_at) VALUES ('old', 'alice', '{\"trials\": 12}', 'complete', false, "
                "'', 1, '', '2025-01-01 00:00:00', '2025-01-01 00:00:00')"))
        columns = {c["name"] for c in inspect(engine).get_columns("autoslapo_studies")}
        assert "budget" not in columns
    finally:
        engine.dispose()


def test_upgrade_from_the_previous_head_reads_old_budgets_as_unknown(store_url: str) -> None:
    _previous_head_db(store_url)
    with open_store(store_url) as db:
        assert db.revision() == head_revision() == "0005"
        old = db.get_study("old")
        assert old.budget is None and old.status == "complete"
        assert [s.study.budget for s in db.study_summaries()] == [None]
        assert [t.samples_per_s for t in db.trials("old")] == [100.0]
        assert db.jobs.get("old").request == {"trials": 12}  # type: ignore[union-attr]
        assert db.raise_budget("old", 20).budget == 20  # an old study gets one once it is resumed
        db.create_study("new", **study_kwargs("bert-base"))
        assert db.get_study("new").budget is None  # none until the tuner sets it
    with open_store(store_url) as again:  # reopening at the head changes nothing
        assert again.get_study("old").budget == 20


def test_a_budget_is_raised_and_never_lowered(db: Store, study: str) -> None:
    assert db.get_study(study).budget is None
    before = db.get_study(study).updated_at
    assert db.raise_budget(study, 10).budget == 10
    assert db.raise_budget(study, 4).budget == 10  # a smaller resume leaves it
    assert db.raise_budget(study, 10).budget == 10
    assert db.raise_budget(study, 25).budget == 25
    assert db.get_study(study).budget == 25
    assert [r.budget for r in db.list_studies()] == [25]
    assert db.get_study(study).updated_at == before  # the tuner's heartbeat is not touched


def test_raise_budget_refuses_an_unknown_study_and_a_bad_number(db: Store, study: str) -> None:
    with pytest.raises(StorageError, match=r"no study named 'nope'"):
        db.raise_budget("nope", 5)
    for bad in (0, -3, True, 2.5, "7"):
        with pytest.raises(StorageError, match=r"budget must be a positive number of trials"):
            db.raise_budget(study, bad)  # type: ignore[arg-type]
    assert db.get_study(study).budget is None


def test_concurrent_raises_leave_the_largest(store_url: str, backend: str) -> None:
    if backend == "sqlite" and "memory" in store_url:
        pytest.skip("an in-memory database is one connection")
    with open_store(store_url) as setup:
        setup.create_study("shared", **study_kwargs())
    values = list(range(1, 41))
    random.Random(7).shuffle(values)
    stores = [open_store(store_url) for _ in range(4)]
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda iv: stores[iv[0] % 4].raise_budget("shared", iv[1]), enumerate(values)))
        assert stores[0].get_study("shared").budget == 40
    finally:
        for s in stores:
            s.close()


def test_a_join_raising_a_jobs_budget_raises_its_studys_too(db: Store) -> None:
    db.jobs.submit("q", {"trials": 5}, owner="alice")
    assert db.jobs.raise_budget("q", 9) is not None  # queued, no study yet: the job alone
    assert not db.has_study("q")
    db.jobs.submit("r", {"trials": 5}, owner="alice")
    job = db.jobs.claim("w1", 60)
    assert job is not None and job.study == "q"
    job = db.jobs.claim("w1", 60)
    assert job is not None and job.study == "r"
    db.create_study("r", **study_kwargs())
    db.raise_budget("r", 5)  # what the worker's tuner does when it opens the study
    db.add_trial("r", 0, config(0), result(0))
    raised = db.jobs.raise_budget("r", 8)
    assert raised is not None and raised.request["trials"] == 8
    assert db.get_study("r").budget == 8
    assert db.jobs.raise_budget("r", 6) is not None
    assert db.get_study("r").budget == 8 and db.jobs.get("r").request["trials"] == 8  # type: ignore[union-attr]
    assert db.jobs.finish(job.id, "w1", "complete", budget=8)
    assert db.jobs.raise_budget("r", 20) is None  # ended: nothing raised (the join queues it again)
    assert db.get_study("r").budget == 8
