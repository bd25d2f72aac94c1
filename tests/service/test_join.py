"""``plan_join`` over a study tuned outside the service (no job): what a join of it decides."""

from __future__ import annotations

import dataclasses

import pytest

from autoslapo.service.auth import Caller
from autoslapo.service.jobs import StudyRequest
from autoslapo.service.join import JoinPlan, JoinRefused, plan_join
from store import Store
from tuner import tune

BASE = {"model": "bert", "gpus": 8, "backend": "sim", "sampler": "tpe", "baselines": False, "name": "cli",
        "join": True}
SUBMIT = Caller("someone", "submit")


def test_a_study_tuned_by_the_cli_is_followed_continued_or_refused(service_store: Store) -> None:
    request = StudyRequest.from_json({**BASE, "trials": 3})
    assert plan_join(service_store, "cli", request, SUBMIT) == JoinPlan("submit", "queued", 3, 0)
    tune(dataclasses.replace(request.to_options(name="cli"), trials=3), service_store)
    assert plan_join(service_store, "cli", request, SUBMIT) == JoinPlan("follow", "complete", 3, 3)
    more = StudyRequest.from_json({**BASE, "trials": 5})
    assert plan_join(service_store, "cli", more, SUBMIT) == JoinPlan("requeue", "queued", 5, 3)
    with pytest.raises(JoinRefused, match="same model, gpus") as err:
        plan_join(service_store, "cli", StudyRequest.from_json({**BASE, "gpus": 16}), SUBMIT)
    assert err.value.status == 400
    service_store.set_study_status("cli", "running")  # an `autoslapo tune` still at it
    with pytest.raises(JoinRefused, match="outside the service") as err:
        plan_join(service_store, "cli", more, SUBMIT)
    assert err.value.status == 409
    assert service_store.jobs.list() == []  # planning writes nothing


def test_a_plan_names_a_known_action() -> None:
    with pytest.raises(ValueError, match="submit, requeue, raise, follow"):
        JoinPlan("run", "queued", 1, 0)


def test_a_join_asking_for_more_raises_a_queued_studys_budget_for_its_owner_only(service_store: Store) -> None:
    owner, stranger, admin = Caller("t-owner", "submit"), Caller("t-other", "submit"), Caller("t-admin", "admin")
    request = StudyRequest.from_json({**BASE, "name": "q", "trials": 3})
    service_store.jobs.submit("q", request.to_dict(), owner=owner.name)
    more = StudyRequest.from_json({**BASE, "name": "q", "trials": 5})
    assert plan_join(service_store, "q", request, stranger) == JoinPlan("follow", "queued", 3, 0)
    assert plan_join(service_store, "q", more, owner) == JoinPlan("raise", "queued", 5, 0)
    assert plan_join(service_store, "q", more, admin) == JoinPlan("raise", "queued", 5, 0)
    with pytest.raises(JoinRefused, match="may raise only its own") as err:
        plan_join(service_store, "q", more, stranger)
    assert err.value.status == 403 and "trials <= 3" in str(err.value)
    assert service_store.jobs.get("q").request["trials"] == 3  # planning writes nothing
