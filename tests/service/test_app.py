"""The HTTP API end to end over a real store and a real worker: the issue's done-when."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from autoslapo.errors import UsageError
from autoslapo.service import Worker
from search_spaces import get_space
from store import Store
from tests.service.conftest import ON_BOTH, bearer

BODY = {"model": "bert", "gpus": 8, "trials": 20, "backend": "sim", "name": "svc", "baselines": False,
        "sampler": "tpe"}  # the sampler named: a launched-trial budget, whatever sim does by default
ISSUE_BODY = {"model": "bert", "gpus": 8, "trials": 20, "backend": "sim", "name": "svc"}  # the issue's, verbatim


def wait_status(client: TestClient, name: str, token: str, timeout_s: float = 120.0) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        doc = client.get(f"/v1/studies/{name}", headers=bearer(token)).json()
        if doc["status"] not in ("queued", "running"):
            return doc
        time.sleep(0.2)
    raise AssertionError(f"{name} did not finish in {timeout_s}s: {doc}")


@ON_BOTH
def test_the_issues_done_when_flow(client: TestClient, tokens: dict[str, str], worker: Worker,
                                   service_store: Store) -> None:
    """The issue's body as it stands (sim's default sweep, baselines on), on SQLite and PostgreSQL."""
    assert client.post("/v1/studies", json=ISSUE_BODY).status_code == 401
    refused = client.post("/v1/studies", json=ISSUE_BODY, headers=bearer(tokens["read"]))
    assert refused.status_code == 403 and "\n" not in refused.json()["error"]
    bad = client.post("/v1/studies", content=b'{"model": "bert", "gpus": 8,', headers={
        **bearer(tokens["submit"]), "Content-Type": "application/json"})
    assert 400 <= bad.status_code < 500 and list(bad.json()) == ["error"] and "\n" not in bad.json()["error"]
    assert service_store.jobs.list() == [] and service_store.list_studies() == []
    r = client.post("/v1/studies", json=ISSUE_BODY, headers=bearer(tokens["submit"]))
    assert r.status_code == 202, r.text
    doc = wait_status(client, "svc", tokens["read"], timeout_s=240)
    assert doc["status"] == "complete" and doc["launched"] == 20, doc
    assert len([t for t in service_store.trials("svc") if t.status != "pruned"]) == 20
    assert client.get("/v1/best", params={"model": "bert", "gpus": 8, "gpu_type": "a100-80gb"}).status_code == 401
    best = client.get("/v1/best", params={"model": "bert", "gpus": 8, "gpu_type": "a100-80gb"},
                      headers=bearer(tokens["read"]))
    assert best.status_code == 200, best.text
    assert best.json()["study"] == "svc" and best.json()["samples_per_s"] == doc["best"]["samples_per_s"]
    config = best.json()["config"]
    assert config["tp"] * config["pp"] * config["dp"] == 8
    job = service_store.jobs.get("svc")
    assert job is not None and job.status == "complete" and job.attempts == 1


def test_submit_runs_to_budget_and_best_answers(client: TestClient, tokens: dict[str, str], worker: Worker,
                                                service_store: Store) -> None:
    r = client.post("/v1/studies", json=BODY, headers=bearer(tokens["submit"]))
    assert r.status_code == 202, r.text
    assert r.json()["url"].endswith("/v1/studies/svc")
    doc = wait_status(client, "svc", tokens["read"])
    assert doc["status"] == "complete", doc
    assert doc["launched"] == 20
    stored = [t for t in service_store.trials("svc") if t.status != "pruned"]
    assert len(stored) == 20
    best = client.get("/v1/best", params={"model": "bert", "gpus": 8, "gpu_type": "a100-80gb"},
                      headers=bearer(tokens["read"]))
    assert best.status_code == 200, best.text
    assert best.json()["study"] == "svc"
    assert best.json()["config"]["tp"] * best.json()["config"]["pp"] * best.json()["config"]["dp"] == 8
    assert best.json()["apply_best"] == ('job = autoslapo.apply_best("bert-large", gpus=8, gpu_type="a100-80gb", '
                                         'server="http://testserver")')
    trials = client.get("/v1/studies/svc/trials", params={"sort": "samples_per_s", "limit": 3},
                        headers=bearer(tokens["read"])).json()
    assert trials["total"] >= 20 and len(trials["trials"]) == 3
    assert trials["trials"][0]["samples_per_s"] == best.json()["samples_per_s"]
    complete = client.get("/v1/studies/svc/trials", params={"status": "complete"}, headers=bearer(tokens["read"]))
    assert complete.json()["total"] == trials["total"]
    unknown = client.get("/v1/studies/svc/trials", params={"status": "happy"}, headers=bearer(tokens["read"]))
    assert unknown.status_code == 400 and unknown.json()["error"].startswith("status must be one of running, complete")
    listed = client.get("/v1/studies", headers=bearer(tokens["read"])).json()["studies"]
    assert [s["name"] for s in listed] == ["svc"]
    page = client.get("/studies/svc", headers=bearer(tokens["read"]))
    assert page.status_code == 200 and "autoslapo.apply_best(" in page.text
    metrics = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert 'autoslapo_studies{status="complete"} 1.0' in metrics
    assert "autoslapo_http_request_seconds_bucket" in metrics


@ON_BOTH
def test_tokens_are_required_and_roles_enforced(client: TestClient, tokens: dict[str, str],
                                                service_store: Store) -> None:
    assert client.get("/v1/studies").status_code == 401
    assert client.get("/v1/studies", headers=bearer("aslp_nope_nope")).status_code == 401
    r = client.post("/v1/studies", json=BODY, headers=bearer(tokens["read"]))
    assert r.status_code == 403 and "read" in r.json()["error"]
    assert client.post("/v1/studies", json=BODY).status_code == 401
    assert service_store.jobs.list() == []
    assert client.get("/healthz").json()["ok"] is True


def test_revoked_token_is_refused(client: TestClient, service_store: Store) -> None:
    from autoslapo.service import create_token

    token = create_token(service_store, "gone", "read")
    service_store.tokens.revoke("gone")
    assert client.get("/v1/studies", headers=bearer(token)).status_code == 401
    assert all(token not in t.secret_hash for t in service_store.tokens.list())


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{not json", 400, "JSON"),
    (b"[1, 2]", 400, "object"),
    (b'{"model": "bert"}', 400, "gpus"),
    (b'{"model": "bert", "gpus": "8"}', 400, "int"),
    (b'{"model": "bert", "gpus": 8, "colour": 1}', 400, "colour"),
    (b'{"model": "nosuch", "gpus": 8}', 400, "nosuch"),
    (b'{"model": "bert", "gpus": 8, "backend": "local"}', 400, "backend"),
    (b'{"model": "bert", "gpus": 8, "name": "a b"}', 400, "study names"),
    (b'{"model": "bert", "gpus": 8, "trials": 0}', 400, "trials"),
    (b'{"model": "bert", "gpus": 8, "seed": -1}', 400, "seed must be a whole number from 0 to 2**32 - 1"),
    (b'{"model": "bert", "gpus": 8, "seed": 99999999999999999999999}', 400, "got 99999999999999999999999"),
    (b'{"model": "bert", "gpus": 8, "gpus_per_node": 0}', 400, "gpus_per_node must be a positive integer: got 0"),
    (b'{"model": "bert", "gpus": 8, "patience": 5}', 400, "got patience 5 with backend sim and no sampler"),
    (b'{"model": "bert", "gpus": 8, "space": {"name": "x", "knobs": {"colour": [1]}}}', 400, "unknown knob 'colour'"),
    (b'{"model": "bert", "gpus": 8, "space": {"name": "x", "knobs": {"tp": [3]}}}', 400, "no value of tp"),
    (b'{"model": "bert", "gpus": 8, "space": "name = "}', 400, "TOML"),
    (b'{"model": "bert", "gpus": 8, "resume": true}', 400, "resume continues a study: name it"),
    (b'{"model": "bert", "gpus": 8, "resume": 1}', 400, "'resume' must be bool"),
    (b'{"model": "bert", "gpus": 8, "join": true}', 400, "join shares a study: name it"),
    (b'{"model": "bert", "gpus": 8, "join": "yes"}', 400, "'join' must be bool"),
    (b'{"model": "bert", "gpus": 8, "name": "j", "join": true, "resume": true}', 400, "join and resume exclude"),
    (b'{"model": "bert", "gpus": 8, "pad": "' + b"x" * 70_000 + b'"}', 413, "bytes"),
])
def test_bad_input_is_one_line_and_changes_nothing(client: TestClient, tokens: dict[str, str],
                                                   service_store: Store, body: bytes, status: int,
                                                   words: str) -> None:
    r = client.post("/v1/studies", content=body, headers={**bearer(tokens["submit"]),
                                                          "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error and "\n" not in error
    assert service_store.jobs.list() == [] and service_store.list_studies() == []


def test_an_inline_space_is_what_the_study_searches(client: TestClient, tokens: dict[str, str], worker: Worker,
                                                    service_store: Store) -> None:
    space = {"name": "mine", "version": "2", "knobs": {"tp": [1, 2], "pp": [1], "micro_batch": [2, 4, 8]},
             "fixed": {"zero_stage": 2, "attn_kernel": "flash", "ckpt_ratio": 0.0}}
    r = client.post("/v1/studies", json={**BODY, "name": "inline", "trials": 6, "space": space},
                    headers=bearer(tokens["submit"]))
    assert r.status_code == 202, r.text
    doc = wait_status(client, "inline", tokens["read"])
    assert doc["status"] == "complete" and doc["launched"] == 6, doc
    study = service_store.get_study("inline")
    assert (study.space_name, study.space_version) == ("mine", "2")
    for t in service_store.trials("inline"):
        assert (t.config["zero_stage"], t.config["attn_kernel"], t.config["ckpt_ratio"]) == (2, "flash", 0.0)
        assert t.config["tp"] in (1, 2) and t.config["pp"] == 1 and t.config["micro_batch"] in (2, 4, 8)
    job = service_store.jobs.get("inline")
    assert job is not None and job.request["space"]["fixed"]["attn_kernel"] == "flash"


def test_resume_continues_a_study_in_its_space(client: TestClient, tokens: dict[str, str], worker: Worker,
                                               service_store: Store) -> None:
    space = {"name": "mine", "knobs": {"tp": [1, 2], "pp": [1], "micro_batch": [2, 4]},
             "fixed": {"zero_stage": 1, "attn_kernel": "sdpa", "ckpt_ratio": 0.0}}
    submit = bearer(tokens["submit"])
    missing = client.post("/v1/studies", json={**BODY, "name": "again", "resume": True}, headers=submit)
    assert missing.status_code == 404 and "no study named 'again'" in missing.json()["error"]
    assert client.post("/v1/studies", json={**BODY, "name": "again", "trials": 4, "space": space},
                       headers=submit).status_code == 202
    assert wait_status(client, "again", tokens["read"])["launched"] == 4
    resume = {**BODY, "name": "again", "trials": 7, "resume": True}  # no space: the one it began with
    other = client.post("/v1/studies", json={**resume, "gpus": 16}, headers=submit)
    assert other.status_code == 400 and "same model, gpus, gpu_type, gpus_per_node and links" in other.json()["error"]
    from autoslapo.service import create_token

    stranger = client.post("/v1/studies", json=resume, headers=bearer(create_token(service_store, "x", "submit")))
    assert stranger.status_code == 403
    assert service_store.jobs.get("again").request["trials"] == 4  # refusals wrote nothing
    assert client.post("/v1/studies", json=resume, headers=submit).status_code == 202
    doc = wait_status(client, "again", tokens["read"])
    assert doc["status"] == "complete" and doc["launched"] == 7, doc
    launched = [t for t in service_store.trials("again") if t.status != "pruned"]
    assert len(launched) == 7 and len({t.config_hash for t in launched}) == 7
    assert all((t.config["attn_kernel"], t.config["micro_batch"] in (2, 4)) == ("sdpa", True) for t in launched)
    job = service_store.jobs.get("again")
    assert job is not None and job.request["space"]["name"] == "mine" and job.attempts == 2
    wide = get_space("bert").to_dict()  # a space that 5000 trials do not exhaust before the cancel
    busy = client.post("/v1/studies", json={**resume, "trials": 5000, "space": wide}, headers=submit)
    assert busy.status_code == 202
    running = client.post("/v1/studies", json=resume, headers=submit)
    assert running.status_code == 409 and "already" in running.json()["error"]
    assert client.post("/v1/studies/again/cancel", headers=submit).status_code == 202
    assert wait_status(client, "again", tokens["read"])["status"] == "cancelled"


@pytest.mark.slow
def test_join_submits_follows_and_continues_a_study(service_store: Store, tokens: dict[str, str],
                                                   worker: Worker) -> None:
    from autoslapo.service import ServiceSettings, create_app, create_token

    stranger = bearer(create_token(service_store, "stranger", "submit"))
    submit, admin = bearer(tokens["submit"]), bearer(tokens["admin"])
    join = {**BODY, "name": "shared", "trials": 4, "join": True}
    with TestClient(create_app(service_store, ServiceSettings(max_queued_per_token=1))) as c:
        first = c.post("/v1/studies", json=join, headers=submit)
        assert first.status_code == 202 and first.json()["joined"] is False, first.text
        assert first.json()["url"].endswith("/v1/studies/shared")
        job = service_store.jobs.get("shared")
        assert job is not None
        # Queued or running: followed, nothing written, the per-token limit (1) not charged again.
        for headers in (submit, stranger):
            again = c.post("/v1/studies", json=join, headers=headers)
            assert again.status_code == 202 and again.json()["joined"] is True, again.text
            assert again.json()["status"] in ("queued", "running") and again.json()["budget"] == 4
        other = c.post("/v1/studies", json={**join, "gpus": 16}, headers=submit)
        assert other.status_code == 400 and "same model, gpus" in other.json()["error"]
        assert "\n" not in other.json()["error"]
        assert c.post("/v1/studies", json={**BODY, "name": "second"}, headers=submit).status_code == 429
        doc = wait_status(c, "shared", tokens["read"])
        assert doc["status"] == "complete" and doc["launched"] == 4, doc
        assert [j.study for j in service_store.jobs.list()] == ["shared"]
        after = service_store.jobs.get("shared")
        assert after is not None and (after.attempts, after.request, after.owner) == (1, job.request, "t-submit")
        # Complete at (or past) the asked budget: 200, followed, nothing written.
        done = c.post("/v1/studies", json={**join, "trials": 3}, headers=stranger)
        assert done.status_code == 200 and done.json()["status"] == "complete" and done.json()["joined"] is True
        # Short of the asked budget: continuing another token's study needs admin.
        refused = c.post("/v1/studies", json={**join, "trials": 6}, headers=stranger)
        assert refused.status_code == 403 and "may continue only its own" in refused.json()["error"]
        assert service_store.jobs.get("shared") == after  # refusals and followers wrote nothing
        more = c.post("/v1/studies", json={**join, "trials": 6}, headers=submit)
        assert more.status_code == 202 and more.json()["joined"] is False and more.json()["budget"] == 6
        assert wait_status(c, "shared", tokens["read"])["launched"] == 6
        assert c.post("/v1/studies", json={**join, "trials": 7}, headers=admin).status_code == 202
        doc = wait_status(c, "shared", tokens["read"])
    assert doc["status"] == "complete" and doc["launched"] == 7, doc
    launched = [t for t in service_store.trials("shared") if t.status != "pruned"]
    assert len(launched) == 7 and len({t.config_hash for t in launched}) == 7
    final = service_store.jobs.get("shared")
    assert final is not None and final.attempts == 3


@ON_BOTH
def test_racing_joins_of_a_new_name_make_one_job(client: TestClient, tokens: dict[str, str],
                                                 service_store: Store) -> None:
    import concurrent.futures

    join = {**BODY, "name": "race", "join": True}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: client.post("/v1/studies", json=join, headers=bearer(tokens["submit"])),
                                range(4)))
    assert all(r.status_code == 202 for r in answers), [r.text for r in answers]
    assert sorted(r.json()["joined"] for r in answers) == [False, True, True, True]
    assert [j.study for j in service_store.jobs.list()] == ["race"]


def test_duplicate_name_is_409_and_cancel_of_queued_job(client: TestClient, tokens: dict[str, str],
                                                        service_store: Store) -> None:
    assert client.post("/v1/studies", json=BODY, headers=bearer(tokens["submit"])).status_code == 202
    again = client.post("/v1/studies", json=BODY, headers=bearer(tokens["admin"]))
    assert again.status_code == 409 and "unique" in again.json()["error"]
    from autoslapo.service import create_token

    other = create_token(service_store, "other", "submit")
    assert client.post("/v1/studies/svc/cancel", headers=bearer(other)).status_code == 403
    r = client.post("/v1/studies/svc/cancel", headers=bearer(tokens["submit"]))
    assert r.status_code == 202 and r.json()["status"] == "cancelled"
    assert client.get("/v1/studies/svc", headers=bearer(tokens["read"])).json()["status"] == "cancelled"
    assert client.get("/v1/studies/nope", headers=bearer(tokens["read"])).status_code == 404


def test_cancel_stops_a_running_study_between_trials(client: TestClient, tokens: dict[str, str],
                                                     worker: Worker, service_store: Store) -> None:
    body = {**BODY, "name": "long", "trials": 5000}
    assert client.post("/v1/studies", json=body, headers=bearer(tokens["submit"])).status_code == 202
    end = time.monotonic() + 60
    while time.monotonic() < end and client.get("/v1/studies/long", headers=bearer(tokens["read"])).json()[
            "launched"] < 3:
        time.sleep(0.1)
    assert client.post("/v1/studies/long/cancel", headers=bearer(tokens["admin"])).status_code == 202
    doc = wait_status(client, "long", tokens["read"], timeout_s=60)
    assert doc["status"] == "cancelled"
    assert 3 <= doc["launched"] < 5000
    assert service_store.get_study("long").status == "stopped"


def test_estimate_and_anonymous_read(service_store: Store, tokens: dict[str, str]) -> None:
    from autoslapo.service import ServiceSettings, create_app

    with TestClient(create_app(service_store, ServiceSettings(allow_anonymous_read=True))) as anon:
        r = anon.get("/v1/estimate", params={"model": "bert", "gpus": 8})
        assert r.status_code == 200, r.text
        assert r.json()["fits"] is True and r.json()["samples_per_s"] > 0
        bad = anon.get("/v1/estimate", params={"model": "bert", "gpus": "x"})
        assert bad.status_code == 400 and bad.json()["error"].startswith("query.gpus: Input should be a valid integer")
        assert "got 'x'; see /docs" in bad.json()["error"]
        missing = anon.get("/v1/estimate", params={"model": "bert"})
        assert missing.status_code == 400 and missing.json()["error"].startswith("query.gpus: Field required;")
        huge = anon.get("/v1/best", params={"model": "bert", "gpus": 2**63})
        assert huge.status_code == 400 and "gpus must be at most 1,048,576" in huge.json()["error"]
        typo = anon.get("/v1/best", params={"model": "bert", "gpus": 8, "gpu-type": "h100-80gb"})
        assert typo.status_code == 400 and typo.json()["error"].startswith(
            "/v1/best takes only the query parameters global_batch, gpu_type, gpus, gpus_per_node, inter_node_gbps, "
            "intra_node_gbps, measured_only, metric, model: got 'gpu-type'")
        trials = anon.get("/v1/studies/none/trials", params={"state": "complete"})
        assert trials.status_code == 400 and "got 'state'" in trials.json()["error"]
        assert anon.get("/v1/studies", params={"x": 1}).json()["error"].startswith(
            "/v1/studies takes only the query parameters all: got 'x'")
        assert anon.get("/", params={"utm": 1}).status_code == 400  # the HTML pages refuse them too
        # but not the tracking parameters a link shared by chat or e-mail gains
        assert anon.get("/", params={"utm_source": "slack", "fbclid": "x"}).status_code == 200
        assert anon.get("/v1/studies", params={"utm_source": "slack"}).status_code == 400  # the API does
        assert anon.post("/v1/studies", json=BODY).status_code == 401
        assert anon.get("/").status_code == 200


def parse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln and not ln.startswith(":")]
        if lines:
            fields = dict(ln.split(": ", 1) for ln in lines)
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_events_stream_one_per_trial_then_done(service_store: Store, tokens: dict[str, str],
                                               worker: Worker) -> None:
    from autoslapo.service import ServiceSettings, create_app

    with TestClient(create_app(service_store, ServiceSettings(events_poll_s=0.1))) as fast:
        body = {**BODY, "name": "ev", "trials": 5}
        assert fast.post("/v1/studies", json=body, headers=bearer(tokens["submit"])).status_code == 202
        with fast.stream("GET", "/v1/studies/ev/events", headers=bearer(tokens["read"])) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = parse_events(r.read().decode())
        assert [e for e, _ in events] == ["trial"] * 5 + ["done"], events
        numbers = [d["number"] for _, d in events[:-1]]
        assert len(set(numbers)) == 5 and all(d["status"] in ("complete", "oom", "failed") for _, d in events[:-1])
        assert events[-1][1]["status"] == "complete" and events[-1][1]["launched"] == 5
        assert fast.get("/v1/studies/nope/events", headers=bearer(tokens["read"])).status_code == 404
        assert fast.get("/v1/studies/ev/events").status_code == 401


def test_baselines_speedups_and_report(client: TestClient, tokens: dict[str, str], worker: Worker) -> None:
    body = {**BODY, "name": "qz7-study", "trials": 5, "baselines": True}
    assert client.post("/v1/studies", json=body, headers=bearer(tokens["submit"])).status_code == 202
    doc = wait_status(client, "qz7-study", tokens["read"])
    assert doc["status"] == "complete", doc
    kinds = {b["baseline"]: b for b in doc["baselines"]}
    assert set(kinds) == {"deepspeed", "megatron"}, doc["baselines"]
    for b in kinds.values():
        if b["status"] == "complete":
            assert b["tuned_samples_per_s"] == pytest.approx(doc["best"]["samples_per_s"])
            assert b["speedup"] == pytest.approx(doc["best"]["samples_per_s"] / b["samples_per_s"])
    assert any(b["speedup"] for b in kinds.values())
    assert "speedup_ci95" in doc["best"]  # an interval only with repeated real trials: None on sim
    r = client.get("/v1/studies/qz7-study/report", headers=bearer(tokens["read"]))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    assert "qz7-study" in r.text and "data:image/png;base64," in r.text
    assert "Tuned vs out-of-the-box baselines" in r.text
    assert client.get("/v1/studies/nope/report", headers=bearer(tokens["read"])).status_code == 404
    assert client.get("/v1/studies/qz7-study/report").status_code == 401


def test_queued_studies_per_token_are_limited(service_store: Store, tokens: dict[str, str]) -> None:
    from autoslapo.service import ServiceSettings, create_app

    with TestClient(create_app(service_store, ServiceSettings(max_queued_per_token=2))) as limited:
        for name in ("q1", "q2"):
            assert limited.post("/v1/studies", json={**BODY, "name": name},
                                headers=bearer(tokens["submit"])).status_code == 202
        r = limited.post("/v1/studies", json={**BODY, "name": "q3"}, headers=bearer(tokens["submit"]))
        assert r.status_code == 429, r.text
        assert "2 queued or running" in r.json()["error"] and "\n" not in r.json()["error"]
        assert [j.study for j in service_store.jobs.list()] == ["q1", "q2"]
        other = limited.post("/v1/studies", json={**BODY, "name": "q3"}, headers=bearer(tokens["admin"]))
        assert other.status_code == 202  # the limit is per token
        assert limited.post("/v1/studies/q1/cancel", headers=bearer(tokens["submit"])).status_code == 202
        again = limited.post("/v1/studies", json={**BODY, "name": "q4"}, headers=bearer(tokens["submit"]))
        assert again.status_code == 202, again.text
    with pytest.raises(UsageError, match="--max-queued-per-token must be at least 1"):
        ServiceSettings(max_queued_per_token=0)


def test_a_join_raises_a_queued_studys_budget(client: TestClient, tokens: dict[str, str],
                                             service_store: Store) -> None:
    from autoslapo.service import create_token

    submit, stranger = bearer(tokens["submit"]), bearer(create_token(service_store, "stranger", "submit"))
    join = {**BODY, "name": "grow", "trials": 3, "join": True}
    assert client.post("/v1/studies", json=join, headers=submit).status_code == 202
    refused = client.post("/v1/studies", json={**join, "trials": 9}, headers=stranger)
    assert refused.status_code == 403 and "may raise only its own" in refused.json()["error"]
    raised = client.post("/v1/studies", json={**join, "trials": 5}, headers=submit)
    assert raised.status_code == 202, raised.text
    assert (raised.json()["joined"], raised.json()["budget"], raised.json()["status"]) == (True, 5, "queued")
    assert client.get("/v1/studies/grow", headers=bearer(tokens["read"])).json()["budget"] == 5
    assert [j.request["trials"] for j in service_store.jobs.list()] == [5]  # still one job
