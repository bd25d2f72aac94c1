"""``/v1/estimate``: a preset by GET, a preset or a config by POST, a stored study's model by its signature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.cluster import ClusterSpec
from autoslapo.cost import best_config
from autoslapo.models.resolve import resolve_model
from autoslapo.service.estimate import estimate_answer
from autoslapo.service.jobs import StudyRequest
from store import Store
from tests.service.conftest import bearer
from tuner import tune

CONFIG_PATH = Path(__file__).parents[1] / "autoslapo" / "data" / "hf" / "mistral-tiny.json"
CONFIG = json.loads(CONFIG_PATH.read_text())


def test_get_and_post_of_a_preset_answer_the_same(client: TestClient, tokens: dict[str, str]) -> None:
    params = {"model": "bert", "gpus": 16, "gpu_type": "v100-32gb", "global_batch": 256}
    got = client.get("/v1/estimate", params=params, headers=bearer(tokens["read"]))
    posted = client.post("/v1/estimate", json=params, headers=bearer(tokens["read"]))
    assert got.status_code == posted.status_code == 200, posted.text
    assert got.json() == posted.json()
    want = best_config(resolve_model("bert"), ClusterSpec(gpus=16, gpu_type="v100-32gb"), global_batch=256)
    assert posted.json()["samples_per_s"] == pytest.approx(want.samples_per_s)
    assert posted.json()["gpus"] == 16 and posted.json()["gpu_type"] == "v100-32gb"


def test_post_of_a_config_is_the_cost_model_of_its_spec(client: TestClient, tokens: dict[str, str]) -> None:
    r = client.post("/v1/estimate", json={"model": {"hf_config": CONFIG}, "gpus": 8}, headers=bearer(tokens["read"]))
    assert r.status_code == 200, r.text
    want = estimate_answer(resolve_model(str(CONFIG_PATH)), ClusterSpec(gpus=8), None)
    assert r.json() == json.loads(json.dumps(want)) and r.json()["model"] == "mistral"


@pytest.mark.parametrize(("body", "status", "words"), [
    (b'{"model": "bert",', 400, "the body must be JSON"),
    (b'{"model": "bert", "gpus": 8, "trials": 3}', 400, "unknown field 'trials'"),
    (b'{"model": "bert"}', 400, "field 'gpus' is required"),
    (b'{"model": "bert", "gpus": true}', 400, "field 'gpus' must be int"),
    (b'{"model": "nope", "gpus": 8}', 400, "unknown model 'nope'"),
    (b'{"model": {"hf_config": {"model_type": "mamba"}}, "gpus": 8}', 400, "model_type"),
    (b'{"model": "bert", "gpus": 8, "gpu_type": "abacus"}', 400, "abacus"),
    (b'[1]', 400, "must be a JSON object"),
])
def test_a_bad_estimate_is_one_line(client: TestClient, tokens: dict[str, str], body: bytes, status: int,
                                    words: str) -> None:
    r = client.post("/v1/estimate", content=body, headers={**bearer(tokens["read"]), "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert words in r.json()["error"] and "\n" not in r.json()["error"]


def test_estimate_needs_a_token_and_a_body_under_the_limit(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.post("/v1/estimate", json={"model": "bert", "gpus": 8}).status_code == 401
    big = client.post("/v1/estimate", content=b" " * (64 * 1024 + 1), headers=bearer(tokens["read"]))
    assert big.status_code == 413


def test_get_by_signature_reads_the_studys_model(client: TestClient, tokens: dict[str, str],
                                                 service_store: Store) -> None:
    spec = resolve_model(str(CONFIG_PATH))
    read = bearer(tokens["read"])
    missing = client.get("/v1/estimate", params={"model": spec.signature(), "gpus": 8}, headers=read)
    assert missing.status_code == 400 and "no study in the store has the model signature" in missing.json()["error"]
    request = StudyRequest.from_json({"model": {"hf_config": CONFIG}, "gpus": 8, "trials": 1, "baselines": False})
    tune(request.to_options(name="cfg"), service_store)  # a study of the config: its spec is in the store
    found = client.get("/v1/estimate", params={"model": spec.signature(), "gpus": 8}, headers=read)
    posted = client.post("/v1/estimate", json={"model": {"hf_config": CONFIG}, "gpus": 8}, headers=read)
    assert found.status_code == 200, found.text
    assert found.json() == posted.json()
