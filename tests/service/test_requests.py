"""Requests at the edges: nulls, deep or non-finite JSON, the tuner's own names, ended studies, the
``apply_best`` line of a config's study, a revoked token's event stream, the count of 500s."""

from __future__ import annotations

import ast
import json
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.service import ServiceSettings, Worker, create_app, create_token
from autoslapo.service.jobs import StudyRequest
from store import Store
from tests.service.conftest import bearer
from tests.service.test_app import BODY, parse_events, wait_status
from tests.service.test_estimate import _routed_to
from tuner import tune

LLAMA = {**json.loads((Path(__file__).parents[1] / "autoslapo" / "data" / "hf" / "mistral-tiny.json").read_text()),
         "model_type": "llama"}  # model name "llama": also what the preset llama-7b answers to
DEEP = b"[" * 30000 + b"]" * 30000


def post(client: TestClient, token: str, path: str, body: bytes) -> tuple[int, str]:
    r = client.post(path, content=body, headers={**bearer(token), "Content-Type": "application/json"})
    return r.status_code, r.json()["error"] if r.status_code >= 400 else r.text


@pytest.mark.parametrize(("body", "words"), [
    (b'{"model": "bert", "gpus": 8, "trials": null}', "field 'trials' must be int, not null: got null; leave it out "
                                                      "for its default (100)"),
    (b'{"model": "bert", "gpus": 8, "gpu_type": null}', "field 'gpu_type' must be str, not null"),
    (b'{"model": "bert", "gpus": 8, "baselines": null}', "leave it out for its default (true)"),
    (b'{"model": "bert", "gpus": 8, "resume": null}', "field 'resume' must be bool, not null"),
    (b'{"model": null, "gpus": 8}', "field 'model' must be str or dict, not null: got null; it is required"),
    (b'{"model": "bert", "gpus": 8, "timeout_s": NaN}', "field 'timeout_s' must be a finite number: got NaN"),
    (b'{"model": "bert", "gpus": 8, "timeout_s": Infinity}', "got Infinity"),
    (b'{"model": "bert", "gpus": 8, "intra_node_gbps": -Infinity}', "field 'intra_node_gbps' must be a finite"),
    (b'{"model": "bert", "gpus": 8, "patience": 1e999}', "field 'patience' must be a finite number"),
    (b'{"model": "bert", "gpus": 8, "space": {"fixed": {"ckpt_ratio": NaN}}}', "'space.fixed.ckpt_ratio' must be a"),
    (DEEP, "the body must be JSON nested at most 64 levels deep"),
    (b'{"model": "bert", "gpus": 8, "space": ' + b"[" * 100 + b"]" * 100 + b"}", "nested at most 64 levels"),
    (b'{"model": "bert", "gpus": 8, "name": "y.baselines"}', "study names ending in '.baselines' are the tuner's own "
                                                             "(a study's baselines): got 'y.baselines'; tune, resume "
                                                             "or join 'y' instead"),
    (b'{"model": "bert", "gpus": 8, "name": ".baselines"}', "got '.baselines'; pick a name that does not end in"),
    (b'{"model": "bert", "gpus": 8, "name": "j1.baselines", "resume": true}', "join 'j1' instead"),
    (b'{"model": "bert", "gpus": 8, "name": "j1.baselines", "join": true}', "join 'j1' instead"),
])
def test_bad_studies_are_400_and_write_nothing(client: TestClient, tokens: dict[str, str], service_store: Store,
                                               body: bytes, words: str) -> None:
    status, error = post(client, tokens["submit"], "/v1/studies", body)
    assert status == 400 and words in error and "\n" not in error, error
    assert service_store.jobs.list() == [] and service_store.list_studies() == []


@pytest.mark.parametrize(("body", "words"), [
    (DEEP, "the body must be JSON nested at most 64 levels deep"),
    (b'{"model": "bert", "gpus": 8, "inter_node_gbps": NaN}', "field 'inter_node_gbps' must be a finite number"),
])
def test_bad_estimates_are_400(client: TestClient, tokens: dict[str, str], body: bytes, words: str) -> None:
    status, error = post(client, tokens["read"], "/v1/estimate", body)
    assert status == 400 and words in error and "\n" not in error, error


def test_null_is_the_default_where_the_default_is_none(client: TestClient, tokens: dict[str, str],
                                                      service_store: Store) -> None:
    body = {**BODY, "timeout_s": None, "patience": None, "sampler": None, "gpus_per_node": None}
    assert client.post("/v1/studies", json=body, headers=bearer(tokens["submit"])).status_code == 202
    job = service_store.jobs.get("svc")
    assert job is not None and (job.request["timeout_s"], job.request["gpus_per_node"]) == (None, None)


def test_best_of_an_unknown_metric_is_400(client: TestClient, tokens: dict[str, str]) -> None:
    r = client.get("/v1/best", params={"model": "bert", "gpus": 8, "metric": "foo"}, headers=bearer(tokens["read"]))
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("metric must be one of samples_per_s, tokens_per_s") and "'foo'" in r.text


def test_apply_best_line_finds_a_configs_study(client: TestClient, tokens: dict[str, str], service_store: Store,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import autoslapo

    request = StudyRequest.from_json({"model": {"hf_config": LLAMA}, "gpus": 8, "gpus_per_node": 4, "trials": 3,
                                      "baselines": False, "sampler": "tpe"})
    tune(request.to_options(name="cfg"), service_store)
    assert service_store.get_study("cfg").model_name == "llama"
    doc = client.get("/v1/studies/cfg", headers=bearer(tokens["read"])).json()
    line = doc["apply_best"]
    assert ", gpus_per_node=4, server=\"http://testserver\")" in line, line
    call = ast.parse(line).body[0].value  # type: ignore[attr-defined]
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert args == [service_store.get_study("cfg").model_signature]
    _routed_to(client, monkeypatch)
    monkeypatch.setenv("AUTOSLAPO_TOKEN", tokens["read"])
    got = autoslapo.best(*args, **kwargs)
    assert got == autoslapo.best(args[0], gpus=8, storage=service_store)
    page = client.get("/studies/cfg", headers=bearer(tokens["read"])).text
    assert service_store.get_study("cfg").model_signature in page


@pytest.mark.slow
def test_baseline_companions_are_listed_only_when_asked(client: TestClient, tokens: dict[str, str],
                                                       service_store: Store) -> None:
    request = StudyRequest.from_json({"model": "bert", "gpus": 8, "trials": 2, "sampler": "tpe"})
    tune(request.to_options(name="withb"), service_store)
    assert service_store.has_study("withb.baselines")
    read = bearer(tokens["read"])
    listed = client.get("/v1/studies", headers=read).json()["studies"]
    assert [s["name"] for s in listed] == ["withb"]
    every = client.get("/v1/studies", params={"all": "true"}, headers=read).json()["studies"]
    assert sorted(s["name"] for s in every) == ["withb", "withb.baselines"]
    assert "withb.baselines" not in client.get("/", headers=read).text
    assert "withb.baselines" in client.get("/", params={"all": "true"}, headers=read).text  # the page took no all
    assert client.get("/v1/studies/withb", headers=read).json()["baselines"]  # its own document keeps them
    typo = client.get("/v1/studies", params={"al": "true"}, headers=read)
    assert typo.status_code == 400 and typo.json()["error"].startswith("/v1/studies takes only the query parameters all")


def test_cancel_of_a_complete_study_is_409_and_changes_nothing(client: TestClient, tokens: dict[str, str],
                                                               service_store: Store, worker: Worker) -> None:
    submit = bearer(tokens["submit"])
    assert client.post("/v1/studies", json={**BODY, "name": "quick", "trials": 2}, headers=submit).status_code == 202
    assert wait_status(client, "quick", tokens["read"])["status"] == "complete"
    before = service_store.jobs.get("quick")
    r = client.post("/v1/studies/quick/cancel", headers=submit)
    assert r.status_code == 409 and r.json()["error"] == (
        "study 'quick' already ended (complete): nothing to cancel, nothing was changed")
    assert service_store.jobs.get("quick") == before


def test_cancel_of_a_cancelled_study_is_409(client: TestClient, tokens: dict[str, str]) -> None:
    submit = bearer(tokens["submit"])
    assert client.post("/v1/studies", json=BODY, headers=submit).status_code == 202
    assert client.post("/v1/studies/svc/cancel", headers=submit).status_code == 202
    again = client.post("/v1/studies/svc/cancel", headers=submit)
    assert again.status_code == 409 and "already ended (cancelled)" in again.json()["error"]


def test_a_revoked_token_ends_its_event_stream(service_store: Store, tokens: dict[str, str]) -> None:
    token = create_token(service_store, "watcher", "read")
    settings = ServiceSettings(events_poll_s=0.1, token_cache_s=1.0)
    with TestClient(create_app(service_store, settings)) as c:
        assert c.post("/v1/studies", json=BODY, headers=bearer(tokens["submit"])).status_code == 202  # stays queued
        threading.Timer(0.5, service_store.tokens.revoke, ("watcher",)).start()
        # Without a recheck the stream would run until the study ends: cancel it after 10 s, whatever happens.
        ender = threading.Timer(10.0, service_store.jobs.cancel, ("svc",))
        ender.start()
        started = time.monotonic()
        try:
            with c.stream("GET", "/v1/studies/svc/events", headers=bearer(token)) as r:
                assert r.status_code == 200
                events = parse_events(r.read().decode())
        finally:
            ender.cancel()
        assert time.monotonic() - started < 5.5
        assert [e for e, _ in events] == ["error"], events
        assert events[0][1]["error"].startswith("a valid token is required") and "stream ended" in events[0][1]["error"]


def test_metrics_count_server_errors(service_store: Store, tokens: dict[str, str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with TestClient(create_app(service_store), raise_server_exceptions=False) as c:
        def boom(name: str) -> None:
            raise RuntimeError("the store fell over")

        monkeypatch.setattr(service_store.jobs, "get", boom)
        assert c.get("/v1/studies/x", headers=bearer(tokens["read"])).status_code == 500
        monkeypatch.undo()
        metrics = c.get("/metrics", headers=bearer(tokens["read"])).text
    assert 'autoslapo_http_requests_total{code="500",method="GET",route="/v1/studies/{name}"} 1.0' in metrics
