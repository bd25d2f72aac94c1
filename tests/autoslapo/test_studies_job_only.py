"""A study submitted to the service that no worker started (a job, no study row yet: queued, or cancelled
while queued) is listed by ``autoslapo studies`` and shown by ``autoslapo show``, as the service lists
it (before: ``studies`` left it out and ``show`` said there was no such study)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoslapo.cli import main
from autoslapo.service.jobs import StudyRequest
from tests.readonly import STUDY, bert_store, digest, read_only_directory

NOTE = "a study submitted to a service that no worker started"


def _request(**fields: Any) -> dict[str, Any]:
    """A job's request as the service stores it (``POST /v1/studies``'s body, checked)."""
    return StudyRequest.from_json({"backend": "sim", "baselines": False, **fields}).to_dict()


def _store_with_jobs(path: Path) -> str:
    """``bert_store`` (study bert-8, one trial), then a queued job (gpt2 on 16 devices, own links), a job
    cancelled while queued (bert on 8), and a job for bert-8 itself (a resume: listed once, as the study)."""
    from store import open_store

    url = bert_store(path)
    with open_store(url) as db:
        db.jobs.submit("waiting", _request(model="gpt2", gpus=16, trials=20, inter_node_gbps=6.25, global_batch=64))
        db.jobs.submit("dropped", _request(model="bert", gpus=8, trials=5))
        db.jobs.cancel("dropped")
        db.jobs.requeue(STUDY, _request(model="bert", gpus=8, trials=3))
    return url


def test_studies_lists_queued_and_cancelled_jobs_among_the_studies(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "jobs.db"
    assert main(["studies", "--storage", bert_store(tmp_path / "plain.db")]) == 0  # a store that never served
    assert NOTE not in capsys.readouterr().out
    url = _store_with_jobs(path)
    before = digest(path)

    assert main(["studies", "--storage", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["STUDY", "MODEL", "CLUSTER", "BATCH", "BACKEND", "TRIALS", "BEST", "samples/s",
                                "STATUS"]
    assert [line.split()[0] for line in lines[1:4]] == [STUDY, "waiting", "dropped"]  # oldest first
    assert lines[2].split() == ["waiting", "gpt2", "16", "x", "a100-80gb", "(inter-node", "6.25", "GB/s)", "64",
                                "sim", "0", "-", "queued"]
    assert lines[3].split() == ["dropped", "bert", "8", "x", "a100-80gb", "-", "sim", "0", "-", "cancelled"]
    assert any(NOTE in line for line in lines[4:])

    assert main(["studies", "--storage", url, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [STUDY, "waiting", "dropped"]
    study, _, dropped = rows
    assert set(study) <= set(dropped)  # a study's fields, and what the job adds
    assert {k: dropped[k] for k in ("model", "model_label", "family", "gpus", "gpu_type", "status", "trials",
                                    "best_samples_per_s", "best_trial", "budget", "started")} == {
        "model": "bert-large", "model_label": "bert", "family": "bert", "gpus": 8, "gpu_type": "a100-80gb",
        "status": "cancelled", "trials": 0, "best_samples_per_s": None, "best_trial": None, "budget": 5,
        "started": False}
    assert "started" not in study and study["trials"] == 1

    for flags, names in ((["--model", "gpt2"], ["waiting"]), (["--model", "bert-large"], [STUDY, "dropped"]),
                         (["--model", "bert"], [STUDY, "dropped"]), (["--gpus", "16"], ["waiting"])):
        assert main(["studies", "--storage", url, "--json", *flags]) == 0
        assert [r["name"] for r in json.loads(capsys.readouterr().out)] == names, flags
    assert main(["studies", "--storage", url, "--model", "llama-7b"]) == 0
    assert "(3 stored;" in capsys.readouterr().err
    assert digest(path) == before  # read, never written


def test_show_of_a_job_only_study_says_what_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "autoslapo.db"
    url = _store_with_jobs(path)
    before = digest(path)
    read_only_directory(monkeypatch, directory)  # read as a read-only mount is: an immutable open

    assert main(["show", "dropped", "--storage", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "study dropped: bert on 8 x a100-80gb, backend sim, budget 5 trials, status cancelled"
    assert out[1].startswith("cancelled before a worker started it: no trials")
    assert main(["show", "waiting", "--storage", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("study waiting: gpt2 on 16 x a100-80gb (inter-node 6.25 GB/s), backend sim, budget 20 trials, "
                      "status queued")
    assert out[1].startswith("queued: no worker has started it yet")

    assert main(["show", "dropped", "--storage", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["show", STUDY, "--storage", url, "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert set(doc) == set(other) == {"study", "trials"} and doc["trials"] == []
    assert doc["study"]["status"] == "cancelled" and doc["study"]["budget"] == 5 and doc["study"]["trials"] == 0

    assert main(["show", "nope", "--storage", url]) == 2  # neither a study nor a job: as before
    err = capsys.readouterr().err
    assert "no study named 'nope'" in err and len(err.strip().splitlines()) == 1
    assert digest(path) == before and sorted(p.name for p in directory.iterdir()) == ["autoslapo.db"]
