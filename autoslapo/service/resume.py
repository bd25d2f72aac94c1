"""``"resume": true`` in ``POST /v1/studies``: what is refused before anything is written, and what
a resume that has nothing to run answers.

A resume is refused for a study that does not exist (404), is another token's (403), or tuned
another model or cluster (400). One of an ended study whose launched trials already meet the
request's ``trials`` writes nothing, as a join of it does: 200 with the study's status, its budget
and a note saying how to run more (a worker would only have found it at its end again). The budget
every reply names is the one ``GET /v1/studies/NAME`` shows (``shown_budget``): the store never
lowers a study's budget, so a resume asking for fewer trials than that reads the larger one.
"""

from __future__ import annotations

from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.service.auth import Caller
from autoslapo.service.bodies import ApiError
from autoslapo.service.jobs import StudyRequest
from autoslapo.service.views import LAUNCHED, study_view
from store import Store


def check_resume(store: Store, name: str, study: StudyRequest, who: Caller) -> None:
    """Refuse a resume of a study that does not exist (404), is another token's (403), or tuned
    another model or cluster (400), before anything is written."""
    job = store.jobs.get(name)
    if job is None and not store.has_study(name):
        raise ApiError(404, f"no study named {name!r} to resume: submit it without resume first")
    if job is not None and job.owner != who.name and not who.may("admin"):
        raise ApiError(403, f"token {who.name!r} may resume only its own studies: {name!r} is {job.owner!r}'s")
    if store.has_study(name):
        rec = store.get_study(name)
        if (rec.model_signature, rec.cluster_fingerprint) != (study.model_spec().signature(),
                                                              study.cluster_spec().fingerprint()):
            raise ApiError(400, f"resume needs the study's model and cluster: {name!r} tuned {rec.model_name} on "
                                f"{ClusterSpec.from_dict(rec.cluster).described_as()}; send the same model, gpus, "
                                "gpu_type, gpus_per_node and links")


def resume_reached(store: Store, name: str, study: StudyRequest) -> dict[str, Any] | None:
    """The reply's ``status``, ``budget`` and ``note`` when study ``name`` ended (no job queued or
    running, no tuner at it) with at least ``study.trials`` trials launched: nothing to queue. None
    when the resume has trials to run (or the store refuses it: a queued or running study)."""
    if not store.has_study(name):
        return None
    job = store.jobs.get(name)
    rec = store.get_study(name)
    if (job is not None and not job.finished) or (job is None and rec.status == "running"):
        return None  # queued or running: the requeue's 409 says so
    view = study_view(store, rec, job)  # one read of its trials: the count below and the budget GET shows
    launched = sum(view["counts"].get(s, 0) for s in LAUNCHED)
    if launched < study.trials:
        return None
    status = job.status if job is not None else rec.status
    return {"status": status, "budget": view["budget"],
            "note": f"study {name!r} is {status} with {launched} trials launched, which meets trials="
                    f"{study.trials}: nothing was queued; resume (or join) with trials above {launched} to run more"}


def shown_budget(store: Store, name: str) -> int | None:
    """Study ``name``'s budget as ``GET /v1/studies/NAME`` shows it (the stored one, or the job's when more)."""
    rec = store.get_study(name) if store.has_study(name) else None
    job = store.jobs.get(name)
    if rec is None and job is None:
        return None
    return study_view(store, rec, job)["budget"]
