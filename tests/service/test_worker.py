"""Workers: two at once share a queue without running a job twice; a server-wide running limit."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from autoslapo.errors import UsageError
from autoslapo.service import Worker
from store import Store, open_store
from tests.service.conftest import ON_BOTH

REQUEST = {"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "sampler": "tpe", "baselines": False}


def test_a_worker_waits_while_the_limit_runs(service_store: Store) -> None:
    service_store.jobs.submit("held", {**REQUEST, "name": "held"})
    service_store.jobs.submit("next", {**REQUEST, "name": "next"})
    held = service_store.jobs.claim("elsewhere", 60)
    assert held is not None and held.study == "held"
    limited = Worker(service_store, lease_s=5, poll_s=0.1, max_running=1)
    assert limited.run(once=True) == 0
    assert service_store.jobs.get("next").status == "queued"
    assert service_store.jobs.finish(held.id, "elsewhere", "complete")
    assert limited.run(once=True) == 1
    assert service_store.jobs.get("next").status == "complete"
    assert len([t for t in service_store.trials("next") if t.status != "pruned"]) == 3


def test_a_limit_below_one_is_refused(service_store: Store) -> None:
    with pytest.raises(UsageError, match="--max-running must be at least 1: got 0"):
        Worker(service_store, max_running=0)


@ON_BOTH
def test_two_workers_share_the_queue_and_run_each_job_once(service_store: Store, service_url: str) -> None:
    names = [f"job{i}" for i in range(3)]
    for name in names:
        # bert-tiny on 2 devices: a sim job scores its whole space, and the queue, not the space, is the point
        service_store.jobs.submit(name, {**REQUEST, "model": "bert-tiny", "gpus": 2, "name": name, "trials": 2})
    ran: dict[str, int] = {}
    errors: list[BaseException] = []

    def work(label: str) -> None:
        try:
            with open_store(service_url) as own:  # a worker of its own, with its own connections
                worker = Worker(own, lease_s=30, poll_s=0.1, name=label)
                ran[label] = 0
                while worker.run(once=True):  # one job at a time until the queue is empty
                    ran[label] += 1
        except BaseException as err:  # reported below: a thread's failure must fail the test
            errors.append(err)

    threads = [threading.Thread(target=work, args=(label,)) for label in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    assert sum(ran.values()) == len(names)
    jobs = service_store.jobs.list()
    assert [(j.study, j.status, j.attempts) for j in jobs] == [(n, "complete", 1) for n in names]
    assert {j.worker for j in jobs} <= {"w1", "w2"}
    for name in names:
        launched = [t for t in service_store.trials(name) if t.status != "pruned"]
        assert len(launched) == 2 and len({t.config_hash for t in launched}) == 2


def _run_with_a_join_after_the_first_pass(store: Store, monkeypatch: pytest.MonkeyPatch, name: str,
                                         body: dict, raised_to: int) -> list[tuple[int, bool, str]]:
    """Submit ``body`` as study ``name`` and run it with one worker; when the first pass of ``tune``
    ends, its owner's join raises the budget to ``raised_to``. Returns each pass's (trials, resume,
    stop reason)."""
    import autoslapo.service.worker as worker_module
    from autoslapo.service.jobs import StudyRequest

    real_tune, passes = worker_module.tune, []

    def tune_then_join(options, store, **kwargs):  # type: ignore[no-untyped-def]
        outcome = real_tune(options, store, **kwargs)
        passes.append((options.trials, options.resume, outcome.stop_reason))
        if len(passes) == 1:
            assert store.jobs.raise_budget(name, raised_to) is not None
        return outcome

    monkeypatch.setattr(worker_module, "tune", tune_then_join)
    store.jobs.submit(name, StudyRequest.from_json(body).to_dict(), owner="me")
    assert Worker(store, poll_s=0.05).run(once=True) == 1
    job = store.jobs.get(name)
    assert (job.status, job.attempts, job.request["trials"]) == ("complete", 1, raised_to)
    return passes


@pytest.mark.slow
def test_a_budget_raised_while_the_study_runs_is_run_to_by_the_same_worker(service_store: Store,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": "bert", "gpus": 8, "backend": "sim", "sampler": "tpe", "baselines": False, "trials": 2}
    passes = _run_with_a_join_after_the_first_pass(service_store, monkeypatch, "grow", body, 4)
    assert passes == [(2, False, "budget"), (4, True, "budget")]
    launched = [t for t in service_store.trials("grow") if t.status != "pruned"]
    assert len(launched) == 4 and len({t.config_hash for t in launched}) == 4
    assert service_store.get_study("grow").status == "complete"


@pytest.mark.slow
def test_a_sweep_whose_budget_was_raised_stores_the_best_of_the_new_budget(service_store: Store,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": "bert", "gpus": 8, "backend": "sim", "baselines": False, "trials": 3}  # sim: a sweep
    passes = _run_with_a_join_after_the_first_pass(service_store, monkeypatch, "sweep", body, 6)
    assert passes == [(3, False, "swept"), (6, True, "swept")]
    assert len([t for t in service_store.trials("sweep") if t.status == "complete"]) >= 6


def test_a_lease_shorter_than_the_heartbeat_needs_is_refused(service_store: Store, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from autoslapo.cli import main

    db = tmp_path / "never.db"
    assert main(["worker", "--once", "--lease", "0.001", "--storage", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert "--lease must be at least 1 s (the heartbeat renews the claim every third of it" in err
    assert "got 0.001; leave it out for 30, or give 1 or more" in err and not db.exists()
    with pytest.raises(UsageError, match="--lease must be at least 1 s"):
        Worker(service_store, lease_s=0.5, poll_s=0.1)
    with pytest.raises(UsageError, match="--lease"):  # nan passed both checks from Python
        Worker(service_store, lease_s=float("nan"), poll_s=0.1)
    assert Worker(service_store, lease_s=1, poll_s=0.1).run(once=True) == 0  # the shortest lease it keeps
