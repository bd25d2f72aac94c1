"""A study's budget as the service shows it: the store's own (``StudyRecord.budget``) once set, so a
local ``autoslapo tune --resume --trials N`` shows N while it runs; the old rule for older rows."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from autoslapo.service import Worker
from autoslapo.service.views import study_budget
from store import Store
from tests.service.conftest import ON_BOTH, bearer

BODY = {"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "sampler": "tpe", "baselines": False,
        "name": "grown"}


def _doc(client: TestClient, tokens: dict[str, str], name: str) -> dict:
    return client.get(f"/v1/studies/{name}", headers=bearer(tokens["read"])).json()


@ON_BOTH
@pytest.mark.slow
def test_the_stored_budget_shows_while_a_local_resume_runs(client: TestClient, tokens: dict[str, str],
                                                           service_store: Store) -> None:
    assert client.post("/v1/studies", json=BODY, headers=bearer(tokens["submit"])).status_code == 202
    assert Worker(service_store, lease_s=5, poll_s=0.1).run(once=True) == 1
    assert service_store.get_study("grown").budget == 3  # the worker's tuner stored it
    doc = _doc(client, tokens, "grown")
    assert (doc["status"], doc["launched"], doc["budget"]) == ("complete", 3, 3)
    # `autoslapo tune bert --gpus 8 --study grown --resume --trials 10`, one trial in, as the store sees it
    service_store.raise_budget("grown", 10)
    service_store.set_study_status("grown", "running")
    config = {**service_store.trials("grown")[0].config, "micro_batch": 1024}
    assert service_store.claim_trial("grown", config, budget=10) is not None
    doc = _doc(client, tokens, "grown")
    assert (doc["study_status"], doc["launched"], doc["budget"]) == ("running", 4, 10), doc  # not 4
    listed = {s["name"]: s for s in client.get("/v1/studies", headers=bearer(tokens["read"])).json()["studies"]}
    assert (listed["grown"]["launched"], listed["grown"]["budget"]) == (4, 10)
    page = client.get("/studies/grown", headers=bearer(tokens["read"])).text
    assert "data-launched=4 data-budget=10" in page
    # a later local resume asking for fewer lowers nothing
    service_store.raise_budget("grown", 5)
    assert _doc(client, tokens, "grown")["budget"] == 10


def test_a_join_that_raises_a_running_jobs_budget_raises_the_stored_one(client: TestClient, tokens: dict[str, str],
                                                                        service_store: Store) -> None:
    assert client.post("/v1/studies", json=BODY, headers=bearer(tokens["submit"])).status_code == 202
    job = service_store.jobs.claim("w1", 60)  # a worker took it and its tuner opened the study
    assert job is not None
    service_store.create_study("grown", model=ModelSpec.from_name("bert").to_dict(),
                               cluster=ClusterSpec(gpus=8).to_dict(), space_name="transformer", space_version="1",
                               objective="samples_per_s", backend="sim",
                               model_signature=ModelSpec.from_name("bert").signature(),
                               cluster_fingerprint=ClusterSpec(gpus=8).fingerprint())
    service_store.raise_budget("grown", 3)
    raised = client.post("/v1/studies", json={**BODY, "trials": 7, "join": True}, headers=bearer(tokens["submit"]))
    assert raised.status_code == 202 and raised.json()["budget"] == 7, raised.text
    assert service_store.get_study("grown").budget == 7
    assert _doc(client, tokens, "grown")["budget"] == 7


def test_a_study_stored_before_budgets_falls_back_to_the_old_rule() -> None:
    assert study_budget(None, 3, 5) == 5  # submitted 3, a local resume launched 5: 5
    assert study_budget(None, 8, 5) == 8
    assert study_budget(None, None, 5) is None  # tuned outside the service, before the store kept budgets
    assert study_budget(10, 3, 4) == 10  # the stored one
    assert study_budget(10, 12, 4) == 12  # a requeue or join asking for more, not run yet
    assert study_budget(4, None, 0) == 4  # tuned outside the service
