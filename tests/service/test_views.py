"""Every view of a trial describes its schedule with the study's model family, as the CLI's tables:
a convolutional study's ``schedule`` line has no ``attn=`` (a knob it has not), a transformer's has."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoslapo.cluster import ClusterSpec
from autoslapo.config import describe
from autoslapo.cost import best_config
from autoslapo.models.spec import ModelSpec
from autoslapo.service import ServiceSettings, Worker, create_app
from autoslapo.service.views import study_family, trial_view
from autoslapo.storage import baseline_study
from store import Store
from tests.service.conftest import bearer
from tests.service.test_app import parse_events, wait_status

CLUSTER = ClusterSpec(gpus=8, gpu_type="a100-80gb")


def _stored_study(store: Store, name: str, preset: str) -> dict[str, Any]:
    """A complete study of ``preset`` with two trials and a baselines companion with one; its best config."""
    spec = ModelSpec.from_name(preset)
    config = best_config(spec, CLUSTER).config.to_dict()
    for study, space in ((name, "test"), (baseline_study(name), "baselines")):
        store.create_study(study, model=spec.to_dict(), cluster=CLUSTER.to_dict(), space_name=space,
                           space_version="1", objective="samples_per_s", backend="sim",
                           model_signature=spec.signature(), cluster_fingerprint=CLUSTER.fingerprint())
    result = {"status": "complete", "samples_per_s": 100.0, "peak_memory_bytes": 2**30, "measured": False}
    store.add_trial(name, 0, config, result)
    store.add_trial(name, 1, {**config, "micro_batch": 1}, {**result, "samples_per_s": 50.0})
    store.add_trial(baseline_study(name), 0, config,
                    {**result, "samples_per_s": 10.0, "extra": {"baseline": "megatron"}})
    for study in (name, baseline_study(name)):
        store.set_study_status(study, "complete")
    return config


def _schedules(client: TestClient, name: str, preset: str, token: str) -> dict[str, list[str]]:
    """The ``schedule`` strings of every service view of ``name``'s trials, by where they were read."""
    auth = bearer(token)
    doc = client.get(f"/v1/studies/{name}", headers=auth).json()
    listed = next(s for s in client.get("/v1/studies", headers=auth).json()["studies"] if s["name"] == name)
    trials = client.get(f"/v1/studies/{name}/trials", headers=auth).json()["trials"]
    best = client.get("/v1/best", params={"model": preset, "gpus": 8, "gpu_type": "a100-80gb"}, headers=auth)
    assert best.status_code == 200, best.text
    with client.stream("GET", f"/v1/studies/{name}/events", headers=auth) as r:
        events = parse_events(r.read().decode())
    page = client.get(f"/studies/{name}", headers=auth).text
    cells = re.findall(r"<td>([^<]*tp=[^<]*)</td>", page) + re.findall(r"<code>(tp=[^<]*)</code>", page)
    return {
        "study.best": [doc["best"]["schedule"]],
        "study.baselines": [b["schedule"] for b in doc["baselines"]],
        "studies.best": [listed["best"]["schedule"]],
        "trials": [t["schedule"] for t in trials],
        "best": [best.json()["schedule"]],
        "events.trial": [d["schedule"] for e, d in events if e == "trial"],
        "events.done": [d["best"]["schedule"] for e, d in events if e == "done"],
        "page": cells,
    }


@pytest.mark.parametrize(("preset", "attention"), [("wideresnet-tiny", False), ("bert-tiny", True)])
def test_every_trial_view_describes_the_schedule_for_the_studys_family(
        service_store: Store, tokens: dict[str, str], preset: str, attention: bool) -> None:
    config = _stored_study(service_store, "fam", preset)
    family = ModelSpec.from_name(preset).family
    with TestClient(create_app(service_store, ServiceSettings(events_poll_s=0.05))) as client:
        seen = _schedules(client, "fam", preset, tokens["read"])
    assert all(seen.values()), seen  # every view showed at least one schedule
    assert seen["study.best"] == seen["best"] == [describe(config, family)]  # as `autoslapo best` prints it
    assert seen["study.baselines"] == [describe(config, family)]
    for where, schedules in seen.items():
        for schedule in schedules:
            assert schedule.startswith("tp="), (where, schedule)
            assert ("attn=" in schedule) is attention, (where, schedule)


def test_a_study_of_a_family_this_version_does_not_know_shows_every_knob(service_store: Store) -> None:
    config = _stored_study(service_store, "old", "bert-tiny")
    study = service_store.get_study("old")
    assert study_family(study) == "bert" and study_family(None) is None
    for stored in ("", "no-such-family"):  # an old row's empty family, or one since removed: not a 500
        unknown = dataclasses.replace(study, model_family=stored)
        assert study_family(unknown) is None
        trial = service_store.trials("old")[0]
        assert trial_view(trial, study_family(unknown))["schedule"] == describe(config)


def test_a_resnet_study_tuned_by_the_service_has_no_attention_in_its_schedules(
        client: TestClient, tokens: dict[str, str], worker: Worker) -> None:
    body = {"model": "wideresnet-tiny", "gpus": 8, "trials": 4, "backend": "sim", "name": "wrn",
            "baselines": False, "sampler": "tpe"}
    assert client.post("/v1/studies", json=body, headers=bearer(tokens["submit"])).status_code == 202
    doc = wait_status(client, "wrn", tokens["read"])
    assert doc["status"] == "complete" and doc["best"] is not None, doc
    trials = client.get("/v1/studies/wrn/trials", headers=bearer(tokens["read"])).json()["trials"]
    schedules = [doc["best"]["schedule"]] + [t["schedule"] for t in trials]
    assert all(s.startswith("tp=") and "attn=" not in s for s in schedules), schedules
    assert all(t["config"]["attn_kernel"] for t in trials)  # the knob is stored, only not shown


def test_best_from_a_server_prints_the_schedule_for_the_studys_family(
        service_store: Store, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import httpx

    from autoslapo.cli import main

    config = _stored_study(service_store, "wrn", "wideresnet-tiny")
    with TestClient(create_app(service_store, ServiceSettings())) as client:
        # the CLI's own client, its requests served by the app in this process
        monkeypatch.setattr(httpx, "request", lambda method, url, **kw: client.request(
            method, url.removeprefix("http://svc"), **{k: v for k, v in kw.items() if k != "timeout"}))
        monkeypatch.setenv("AUTOSLAPO_TOKEN", tokens["read"])
        assert main(["best", "wideresnet-tiny", "--gpus", "8", "--gpu-type", "a100-80gb",
                     "--server", "http://svc"]) == 0
    out = capsys.readouterr().out
    assert describe(config, "wideresnet") in out and "attn=" not in out, out
