"""A Hugging Face config sent as data in ``model``: checked, kept in the job, rebuilt by every worker."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.errors import UsageError
from autoslapo.models.resolve import resolve_model
from autoslapo.remote import model_field, model_query
from autoslapo.service import Worker
from autoslapo.service.jobs import StudyRequest
from store import Store
from tests.service.conftest import bearer
from tests.service.test_app import wait_status
from tuner import tune

CONFIG_PATH = Path(__file__).parents[1] / "autoslapo" / "data" / "hf" / "mistral-tiny.json"
CONFIG = json.loads(CONFIG_PATH.read_text())
BASE = {"gpus": 8, "backend": "sim", "sampler": "tpe", "baselines": False}


def test_a_config_payload_builds_the_spec_the_config_file_does() -> None:
    request = StudyRequest.from_json({**BASE, "model": {"hf_config": CONFIG}})
    spec = resolve_model(str(CONFIG_PATH))
    assert request.model_spec() == spec
    assert request.default_name() == "mistral-8xa100-80gb-sim"
    kept = json.loads(json.dumps(request.to_dict()))  # what the job row keeps, through JSON
    assert StudyRequest(**kept).to_options(name="s", resume=True).model == spec


@pytest.mark.parametrize(("model", "words"), [
    ({"hf_config": {**CONFIG, "model_type": "mamba"}}, "model_type must be one of"),
    ({"hf_config": {**CONFIG, "hidden_size": "x"}}, "needs an integer 'hidden_size'"),
    ({"hf_config": {**CONFIG, "sliding_window": "a"}}, "model.hf_config cannot be read"),
    ({"hf_config": [1]}, "must be the JSON object of a config.json"),
    ({"hf_config": CONFIG, "module": "x"}, "exactly one key"),
    ({}, "exactly one key"),
    ([CONFIG], "must be str or dict"),
])
def test_a_bad_model_payload_is_one_line(model: object, words: str) -> None:
    with pytest.raises(UsageError, match=words) as err:
        StudyRequest.from_json({**BASE, "model": model})
    assert "\n" not in str(err.value)


def test_submit_run_and_ask_for_the_best_of_a_config(client: TestClient, tokens: dict[str, str], worker: Worker,
                                                      service_store: Store) -> None:
    submit = bearer(tokens["submit"])
    bad = client.post("/v1/studies", json={**BASE, "model": {"hf_config": {**CONFIG, "model_type": "mamba"}}},
                      headers=submit)
    assert bad.status_code == 400 and "model_type" in bad.json()["error"] and "\n" not in bad.json()["error"]
    assert service_store.jobs.list() == [] and service_store.list_studies() == []  # the store is unchanged
    posted = client.post("/v1/studies", json={**BASE, "model": {"hf_config": CONFIG}, "trials": 4}, headers=submit)
    assert posted.status_code == 202, posted.text
    name = posted.json()["name"]
    assert name == "mistral-8xa100-80gb-sim"
    doc = wait_status(client, name, tokens["read"])
    assert doc["status"] == "complete" and doc["launched"] == 4 and doc["model"] == "mistral"
    signature = resolve_model(str(CONFIG_PATH)).signature()
    assert service_store.get_study(name).model_signature == signature
    best = client.get("/v1/best", params={"model": model_query(str(CONFIG_PATH)), "gpus": 8},
                      headers=bearer(tokens["read"]))
    assert best.status_code == 200, best.text
    assert best.json()["study"] == name and best.json()["config"] == doc["best"]["config"]


@pytest.mark.slow
def test_a_worker_that_takes_a_config_job_over_builds_the_same_spec(service_store: Store) -> None:
    request = StudyRequest.from_json({**BASE, "model": {"hf_config": CONFIG}, "trials": 5, "name": "cfg"})
    service_store.jobs.submit("cfg", request.to_dict())
    ghost = service_store.jobs.claim("ghost", 0.3)  # a worker that ran two trials, then died
    assert ghost is not None
    tune(dataclasses.replace(StudyRequest(**ghost.request).to_options(name="cfg"), trials=2), service_store)
    time.sleep(0.5)  # its lease lapses
    assert Worker(service_store, lease_s=5, poll_s=0.1).run(once=True) == 1
    job = service_store.jobs.get("cfg")
    assert job is not None and job.status == "complete" and job.attempts == 2
    assert service_store.get_study("cfg").model_signature == resolve_model(str(CONFIG_PATH)).signature()
    assert len([t for t in service_store.trials("cfg") if t.status != "pruned"]) == 5


def test_the_client_sends_a_config_as_data_and_asks_by_signature(tmp_path: Path) -> None:
    assert model_field("bert") == "bert" and model_query("bert") == "bert"
    assert model_field(str(CONFIG_PATH)) == {"hf_config": CONFIG}
    assert model_query(str(CONFIG_PATH)) == resolve_model(str(CONFIG_PATH)).signature()
    assert model_query(resolve_model("bert")) == resolve_model("bert").signature()
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**CONFIG, "model_type": "mamba"}))
    with pytest.raises(UsageError, match="model_type"):
        model_field(str(bad))  # refused before anything is sent
    with pytest.raises(UsageError, match="cannot read the model file"):
        model_field(str(tmp_path / "mine.py"))  # a model file is sent as text (tests/service/test_modfile.py)
