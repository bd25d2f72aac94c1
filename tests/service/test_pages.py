"""The server-rendered pages: the submit form only for tokens that may submit."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.service.conftest import bearer


def test_the_submit_form_is_shown_only_to_tokens_that_may_submit(client: TestClient,
                                                                 tokens: dict[str, str]) -> None:
    read = client.get("/", headers=bearer(tokens["read"]))
    assert read.status_code == 200 and "<form id=submit>" not in read.text
    submit = client.get("/", headers=bearer(tokens["submit"]))
    assert submit.status_code == 200 and "<form id=submit>" in submit.text
    assert "fetch('/v1/studies'" in submit.text and "<option selected>a100-80gb</option>" in submit.text


def test_signing_in_sets_a_cookie_that_the_form_post_uses(client: TestClient, tokens: dict[str, str]) -> None:
    signed = client.post("/login", data={"token": tokens["submit"]}, follow_redirects=False)
    assert signed.status_code == 303 and "httponly" in signed.headers["set-cookie"].lower()
    r = client.post("/v1/studies", json={"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "name": "form"})
    assert r.status_code == 202, r.text
    page = client.get("/studies/form")
    assert page.status_code == 200 and "<b id=status>queued</b>" in page.text
