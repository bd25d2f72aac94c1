"""``"resume": true`` of a study that has its trials writes nothing (as a join), and names the budget
GET shows; the worker says why a job runs again; a cancel that comes as a run ends is honoured."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

import autoslapo.service.worker as worker_module
from autoslapo.service import Worker
from store import Store
from tests.service.conftest import ON_BOTH, bearer

BODY = {"model": "bert-tiny", "gpus": 4, "trials": 5, "backend": "sim", "sampler": "tpe", "baselines": False,
        "name": "s1"}


def _run(store: Store, said: list[str] | None = None) -> None:
    worker = Worker(store, lease_s=5, poll_s=0.1, log=(said.append if said is not None else None))
    assert worker.run(once=True) == 1


@ON_BOTH
def test_a_resume_of_a_study_that_has_its_trials_is_a_join(client: TestClient, tokens: dict[str, str],
                                                           service_store: Store) -> None:
    submit = bearer(tokens["submit"])
    assert client.post("/v1/studies", json=BODY, headers=submit).status_code == 202
    _run(service_store)
    job = service_store.jobs.get("s1")
    assert job is not None and job.status == "complete"
    for fewer in (3, 5):
        r = client.post("/v1/studies", json={**BODY, "trials": fewer, "resume": True}, headers=submit)
        doc = r.json()
        assert r.status_code == 200, r.text
        assert (doc["status"], doc["budget"], doc["joined"]) == ("complete", 5, False), doc
        assert "nothing was queued" in doc["note"] and "trials above 5" in doc["note"], doc
    assert service_store.jobs.get("s1") == job  # nothing written
    assert Worker(service_store, lease_s=5, poll_s=0.1).run(once=True) == 0  # nothing to claim


def test_tune_server_resume_with_nothing_to_run_prints_the_services_note(
        client: TestClient, tokens: dict[str, str], service_store: Store, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from autoslapo.cli import main
    from tests.service.test_estimate import _routed_to

    assert client.post("/v1/studies", json=BODY, headers=bearer(tokens["submit"])).status_code == 202
    _run(service_store)
    _routed_to(client, monkeypatch)
    monkeypatch.setenv("AUTOSLAPO_TOKEN", tokens["submit"])
    assert main(["tune", "bert-tiny", "--gpus", "4", "--trials", "3", "--sampler", "tpe", "--no-baselines",
                 "--study", "s1", "--resume", "--server", "http://autoslapo.test"]) == 0
    captured = capsys.readouterr()
    assert "nothing was queued" in captured.err and "trials above 5" in captured.err
    assert "study s1: 5 trials launched, status complete" in captured.out


def test_a_resume_with_fewer_trials_answers_the_budget_get_shows(client: TestClient, tokens: dict[str, str],
                                                                 service_store: Store) -> None:
    submit = bearer(tokens["submit"])
    assert client.post("/v1/studies", json={**BODY, "trials": 2}, headers=submit).status_code == 202
    _run(service_store)
    service_store.raise_budget("s1", 3000)  # a resume to 3000, cancelled early: its stored budget stays
    r = client.post("/v1/studies", json={**BODY, "trials": 3, "resume": True}, headers=submit)
    assert r.status_code == 202, r.text
    shown = client.get("/v1/studies/s1", headers=submit).json()["budget"]
    assert r.json()["budget"] == shown == 3000, (r.json(), shown)


def test_the_worker_says_a_resumed_job_was_resumed_and_counts_one_trial(client: TestClient, tokens: dict[str, str],
                                                                        service_store: Store) -> None:
    submit, said = bearer(tokens["submit"]), []
    assert client.post("/v1/studies", json={**BODY, "trials": 1}, headers=submit).status_code == 202
    _run(service_store, said)
    assert client.post("/v1/studies", json={**BODY, "trials": 2, "resume": True}, headers=submit).status_code == 202
    _run(service_store, said)
    assert said[0] == "claimed study 's1': 1 trial of sim", said
    assert said[2] == "claimed study 's1': 2 trials of sim, attempt 2 (resumed at its owner's request)", said


def test_a_resumed_job_whose_worker_died_is_taken_over(client: TestClient, tokens: dict[str, str],
                                                       service_store: Store) -> None:
    submit, said = bearer(tokens["submit"]), []
    assert client.post("/v1/studies", json={**BODY, "trials": 1}, headers=submit).status_code == 202
    _run(service_store)
    assert client.post("/v1/studies", json={**BODY, "trials": 2, "resume": True}, headers=submit).status_code == 202
    ghost = service_store.jobs.claim("ghost", 0.01)  # claimed, its study opened, then the worker died
    assert ghost is not None
    service_store.set_study_status("s1", "running")
    time.sleep(0.05)  # its lease lapses
    _run(service_store, said)
    assert said[0] == "claimed study 's1': 2 trials of sim, attempt 3 (taken over from a worker that stopped)", said


def test_a_cancel_that_comes_as_the_run_ends_is_honoured(client: TestClient, tokens: dict[str, str],
                                                        service_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat looks every third of the lease: a cancel acknowledged after its last look and
    before the run ended used to be lost (the job ended complete)."""
    submit, answers = bearer(tokens["submit"]), []
    real_tune = worker_module.tune

    def tune_then_cancel(options: Any, store: Store, **kwargs: Any) -> Any:
        outcome = real_tune(options, store, **kwargs)
        answers.append(client.post("/v1/studies/s1/cancel", headers=submit))  # the last trial ran: no tick after it
        return outcome

    monkeypatch.setattr(worker_module, "tune", tune_then_cancel)
    assert client.post("/v1/studies", json={**BODY, "trials": 2}, headers=submit).status_code == 202
    _run(service_store)
    assert answers[0].status_code == 202 and answers[0].json()["cancel_requested"] is True, answers[0].text
    doc = client.get("/v1/studies/s1", headers=submit).json()
    assert (doc["status"], doc["study_status"]) == ("cancelled", "stopped"), doc
