"""``/openapi.json`` describes the bodies of ``POST /v1/studies`` and ``POST /v1/estimate`` (the fields
their readers take), and ``/docs`` is a page of its own, with no asset from elsewhere."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from fastapi.testclient import TestClient

from autoslapo.service.estimate import ESTIMATE_FIELDS, EstimateRequest
from autoslapo.service.jobs import StudyRequest
from tests.service.conftest import bearer


def _body(doc: dict[str, Any], path: str) -> dict[str, Any]:
    body = doc["paths"][path]["post"]["requestBody"]
    assert body["required"] is True
    return dict(body["content"]["application/json"]["schema"])


def test_the_post_bodies_are_described_with_the_fields_their_readers_take(client: TestClient,
                                                                          tokens: dict[str, str]) -> None:
    doc = client.get("/openapi.json").json()
    study = _body(doc, "/v1/studies")
    # what StudyRequest.from_json takes: its dataclass's fields, "model" and "gpus" required
    assert set(study["properties"]) == {f.name for f in dataclasses.fields(StudyRequest)}
    assert set(study["required"]) == {f.name for f in dataclasses.fields(StudyRequest)
                                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert study["additionalProperties"] is False
    assert study["properties"]["trials"] == {"type": "integer", "default": 100,
                                             "description": "the study's budget of launched trials (1-100000)"}
    assert study["properties"]["model"]["type"] == ["string", "object"]
    assert study["properties"]["timeout_s"]["type"] == ["number", "null"]
    estimate = _body(doc, "/v1/estimate")
    assert set(estimate["properties"]) == set(ESTIMATE_FIELDS) == {f.name for f in dataclasses.fields(EstimateRequest)}
    assert estimate["required"] == ["model"] and estimate["properties"]["knobs"]["type"] == ["object", "null"]
    # described only: the readers still answer their one-line errors
    r = client.post("/v1/studies", json={"model": "bert", "gpus": 8, "trails": 3}, headers=bearer(tokens["submit"]))
    assert r.status_code == 400 and r.json()["error"].startswith("unknown field 'trails': the fields are model, gpus")
    r = client.post("/v1/estimate", json={"gpus": 8}, headers=bearer(tokens["read"]))
    assert r.status_code == 400 and r.json()["error"].startswith("field 'model' is required")


def test_docs_is_a_self_contained_page_of_every_endpoint(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    # nothing loaded from elsewhere: no script, stylesheet, image or frame, and no URL but the server's
    assert not re.search(r"<script|<link|<img|<iframe|src=|@import|url\(", text, re.IGNORECASE)
    assert not re.search(r"https?://", text)
    doc = client.get("/openapi.json").json()
    for path, item in doc["paths"].items():
        for method in item:
            assert f"<code>{method.upper()} {path}</code>" in text
    assert "<code>model_spec</code>" not in text  # an answer's field, not a body's
    assert "<code>knobs</code>" in text and "<code>intra_node_gbps</code>" in text and "<code>metric</code>" in text
    assert "<td><code>trials</code></td><td>integer</td><td></td><td><code>100</code></td>" in text
    assert client.get("/redoc").status_code == 404  # Swagger's sibling loads from a CDN too
