"""A study's progress as the service shows it: ``launched`` counts trials in flight, and its budget
follows a local ``autoslapo tune --resume`` that raised it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from autoslapo.service import Worker
from store import Store
from tests.service.conftest import bearer
from tuner import TuneOptions, tune


@pytest.mark.slow
def test_launched_counts_trials_in_flight_and_budget_follows_a_local_resume(
        client: TestClient, tokens: dict[str, str], service_store: Store) -> None:
    body = {"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "sampler": "tpe", "baselines": False,
            "name": "grown"}
    assert client.post("/v1/studies", json=body, headers=bearer(tokens["submit"])).status_code == 202
    assert Worker(service_store, lease_s=5, poll_s=0.1).run(once=True) == 1
    auth = bearer(tokens["read"])
    doc = client.get("/v1/studies/grown", headers=auth).json()
    assert (doc["status"], doc["launched"], doc["budget"]) == ("complete", 3, 3)
    # `autoslapo tune bert --gpus 8 --study grown --resume --trials 5` on a machine with the same store
    tune(TuneOptions(model=ModelSpec.from_name("bert"), cluster=ClusterSpec(gpus=8), backend="sim", trials=5,
                     study="grown", resume=True, sampler="tpe", baselines=False), service_store)
    doc = client.get("/v1/studies/grown", headers=auth).json()
    assert (doc["launched"], doc["budget"]) == (5, 5), doc
    joined = client.post("/v1/studies", json={**body, "trials": 4, "join": True}, headers=bearer(tokens["submit"]))
    assert joined.status_code == 200 and joined.json()["budget"] == 5, joined.text  # it ended at 5, not 3
    # a tuner's trial in flight (claimed, running): launched, as the budget counts it
    config = {**service_store.trials("grown")[0].config, "micro_batch": 1024}
    running = service_store.claim_trial("grown", config)
    assert running is not None and running.status == "running"
    doc = client.get("/v1/studies/grown", headers=auth).json()
    assert doc["counts"]["running"] == 1 and (doc["launched"], doc["budget"]) == (6, 6), doc
    listed = {s["name"]: s for s in client.get("/v1/studies", headers=auth).json()["studies"]}
    assert (listed["grown"]["launched"], listed["grown"]["budget"]) == (6, 6)
    page = client.get("/studies/grown", headers=auth).text
    assert "data-launched=6 data-budget=6" in page and f'"running": [{running.number}]' in page
