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
    with pytest.raises(ValueError, match="submit, requeue, follow"):
        JoinPlan("run", "queued", 1, 0)
