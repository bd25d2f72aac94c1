"""The service's error lines name what its client sent (body fields, query parameters), not the
CLI's flags, and ``GET /v1/best``'s 404 speaks of this server, not of its store."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from autoslapo.service.messages import best_missing, body_fields
from tests.service.conftest import bearer


@pytest.mark.parametrize(("method", "path", "body", "words"), [
    ("post", "/v1/studies", {"model": "bert", "gpus": 12},
     "gpus must fill whole nodes: got gpus=12 with gpus_per_node=8 (1.50 nodes); use a multiple of 8 or change "
     "gpus_per_node"),
    ("post", "/v1/studies", {"model": "bert", "gpus": 8, "gpu_type": "zz"}, "gpu_type must be one of"),
    ("post", "/v1/studies", {"model": "bert", "gpus": 8, "timeout_s": -1}, "timeout_s must be positive, finite seconds"),
    ("post", "/v1/studies", {"model": "bert", "gpus": 8, "sampler": "zz"}, "sampler must be one of"),
    ("post", "/v1/estimate", {"model": "bert", "gpus": 8, "gpus_per_node": 3}, "change gpus_per_node"),
    ("post", "/v1/estimate", {"model": "bert", "gpus": 8, "shape": {"hidden": 10**6}},
     "hidden must be at most 262,144 (several times the largest model published): got 1,000,000 for model "
     "bert-large; give a smaller shape.hidden"),
    ("post", "/v1/estimate", {"model": "bert", "gpus": 8, "top": 0}, "got 0; e.g. top=5"),
    ("get", "/v1/estimate?model=bert&gpus=0", None, "gpus must be a positive integer: got 0"),
    ("get", "/v1/estimate?model=bert&gpus=12&gpus_per_node=8", None, "got gpus=12 with gpus_per_node=8"),
    ("get", "/v1/best?model=bert&gpus=8&gpu_type=zz", None, "gpu_type must be one of"),
])
def test_errors_of_shared_checks_name_the_request_fields(client: TestClient, tokens: dict[str, str], method: str,
                                                         path: str, body: dict | None, words: str) -> None:
    auth = bearer(tokens["submit"])
    r = client.post(path, json=body, headers=auth) if method == "post" else client.get(path, headers=auth)
    error = r.json()["error"]
    assert r.status_code == 400 and words in error, error
    assert "--" not in error and "\n" not in error, error
    assert client.get("/v1/studies", headers=auth).json()["studies"] == []  # nothing stored


def test_a_quoted_command_keeps_its_flags_and_unknown_flags_are_left() -> None:
    line = "--gpus must be 8: got --gpus 12; run `autoslapo tune bert --gpus 8` or start with --max-running 2"
    assert body_fields(line, "/v1/studies") == (
        "gpus must be 8: got gpus=12; run `autoslapo tune bert --gpus 8` or start with --max-running 2")
    assert body_fields("give a smaller --hidden", "/v1/studies") == "give a smaller hidden"
    assert body_fields("give a smaller --hidden", "/v1/estimate") == "give a smaller shape.hidden"


def test_best_404_speaks_of_this_server_and_how_to_submit(client: TestClient, tokens: dict[str, str],
                                                          service_url: str) -> None:
    r = client.get("/v1/best", params={"model": "bert", "gpus": 12, "gpus_per_node": 4}, headers=bearer(tokens["read"]))
    error = r.json()["error"]
    assert r.status_code == 404, error
    assert error == ("no study on this server has a recorded schedule for bert-large on 12 x any device (4 a node); "
                     "submit one: POST /v1/studies with this model and cluster, or `autoslapo tune bert-large "
                     "--gpus 12 --gpus-per-node 4 --server http://testserver`")
    unknown = client.get("/v1/best", params={"model": "nosuch", "gpus": 8}, headers=bearer(tokens["read"]))
    assert unknown.status_code == 404 and "none of them on this server" in unknown.json()["error"]
    for answer in (error, unknown.json()["error"]):
        assert service_url not in answer and "sqlite" not in answer


def test_best_missing_drops_any_store_url() -> None:
    line = ("no recorded schedule for gpt2 on 8 x any device passes the filters (measured_only=True, ...) in "
            "postgresql+psycopg://u:***@db:5432/tune; relax them or tune with a measuring backend")
    assert best_missing(line, "http://s") == (
        "no study on this server has a recorded schedule for gpt2 on 8 x any device passes the filters "
        "(measured_only=True, ...); relax them, or submit a study with a measuring backend (POST /v1/studies, "
        "backend ray)")
