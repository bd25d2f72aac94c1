"""The server-rendered pages: the submit form only for tokens that may submit."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoslapo.service.worker import Worker
from tests.service.conftest import bearer
from tests.service.test_app import wait_status


def test_the_submit_form_is_shown_only_to_tokens_that_may_submit(client: TestClient,
                                                                 tokens: dict[str, str]) -> None:
    read = client.get("/", headers=bearer(tokens["read"]))
    assert read.status_code == 200 and "<form id=submit>" not in read.text
    submit = client.get("/", headers=bearer(tokens["submit"]))
    assert submit.status_code == 200 and "<form id=submit>" in submit.text
    assert "fetch('/v1/studies'" in submit.text and "<option selected>a100-80gb</option>" in submit.text
    assert "<input name=inter_node_gbps type=number" in submit.text and "body.inter_node_gbps = " in submit.text


def test_signing_in_sets_a_cookie_that_the_form_post_uses(client: TestClient, tokens: dict[str, str]) -> None:
    signed = client.post("/login", data={"token": tokens["submit"]}, follow_redirects=False)
    assert signed.status_code == 303 and "httponly" in signed.headers["set-cookie"].lower()
    r = client.post("/v1/studies", json={"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "name": "form"})
    assert r.status_code == 202, r.text
    page = client.get("/studies/form")
    assert page.status_code == 200 and "<b id=status>queued</b>" in page.text
    missing = client.get("/studies/frm")  # a browser's mistyped study: a page (it was the API's JSON)
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "role=alert" in missing.text and "href='/'" in missing.text


def _study_data(page: str) -> dict[str, Any]:
    found = re.search(r"<script type=application/json id=study-data>(.*?)</script>", page)
    assert found, "the study page embeds its trials for the chart"
    return dict(json.loads(found.group(1)))


def test_a_queued_study_page_follows_the_events_and_has_no_report_yet(client: TestClient,
                                                                      tokens: dict[str, str]) -> None:
    r = client.post("/v1/studies", json={"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "name": "q"},
                    headers=bearer(tokens["submit"]))
    assert r.status_code == 202, r.text
    page = client.get("/studies/q", headers=bearer(tokens["read"])).text
    assert _study_data(page) == {"name": "q", "live": True, "points": [], "running": []}
    assert "new EventSource('/v1/studies/'" in page and "<svg id=chart" in page
    assert "<iframe id=report" not in page and "id=snippet" not in page


@pytest.mark.slow
def test_a_finished_study_page_charts_every_launched_trial_and_frames_the_report(
        client: TestClient, tokens: dict[str, str], worker: Worker) -> None:
    r = client.post("/v1/studies", json={"model": "bert", "gpus": 8, "trials": 4, "backend": "sim", "name": "done"},
                    headers=bearer(tokens["submit"]))
    assert r.status_code == 202, r.text
    doc = wait_status(client, "done", tokens["read"])
    assert doc["status"] == "complete", doc
    page = client.get("/studies/done", headers=bearer(tokens["read"])).text
    data = _study_data(page)
    assert data["live"] is False and len(data["points"]) == doc["launched"] == 4
    assert max(p["v"] for p in data["points"]) == doc["best"]["samples_per_s"]
    assert "<iframe id=report" in page and "src='/v1/studies/done/report'" in page
    assert "<button id=copy" in page and "autoslapo.apply_best(" in page
    report = client.get("/v1/studies/done/report", headers=bearer(tokens["read"]))
    assert report.status_code == 200 and "<img" in report.text


def test_pages_refuse_query_parameters_they_do_not_take(client: TestClient, tokens: dict[str, str]) -> None:
    auth = bearer(tokens["read"])
    r = client.get("/", params={"al": "true"}, headers=auth)  # a mistyped all=true showed the plain list
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert "/ takes only the query parameters all: got &#x27;al&#x27;" in r.text and "role=alert" in r.text
    study = client.get("/studies/x", params={"tab": "trials"}, headers=auth)
    assert study.status_code == 400 and "/studies/x takes no query parameters: got &#x27;tab&#x27;" in study.text
    assert client.get("/", params={"all": "true"}, headers=auth).status_code == 200
    assert client.get("/v1/studies", params={"al": "true"}, headers=auth).json()["error"].startswith(
        "/v1/studies takes only the query parameters all: got 'al'")  # the API's answer, as before
