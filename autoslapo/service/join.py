"""``"join": true`` in ``POST /v1/studies``: what the service does with a study that may exist already.

The service's counterpart of ``autoslapo tune --study NAME --join``, under the job model (one job
per study, one worker runs it, never past its budget): a new name is submitted; a queued or
running study is followed (nothing written, the per-token limit not charged again), and its budget
raised to the request's ``trials`` when they are more (its owner or an admin only: the worker goes
on to them instead of ending); a study that ended short of the request's ``trials`` is queued again
as ``resume`` does (its owner or an admin only); one that ended at or past them is only followed.
``plan_join`` reads and decides; the caller writes, and looks again when another request wrote first.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoslapo.cluster import ClusterSpec
from autoslapo.service.auth import Caller
from autoslapo.service.jobs import StudyRequest
from autoslapo.service.payload import model_label
from autoslapo.service.views import LAUNCHED, study_budget
from store import Store

JOIN_ACTIONS = ("submit", "requeue", "raise", "follow")


class JoinRefused(Exception):
    """A join the service refuses: the HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class JoinPlan:
    """What a join does: ``submit`` a new job, ``requeue`` an ended one, ``raise`` a queued or running
    one's budget, or ``follow`` (write nothing);
    ``status`` is the study's status as the caller will see it, ``budget`` the trials it runs to."""

    action: str
    status: str
    budget: int
    launched: int

    def __post_init__(self) -> None:
        if self.action not in JOIN_ACTIONS:
            raise ValueError(f"a join's action must be one of {', '.join(JOIN_ACTIONS)}: got {self.action!r}")


def plan_join(store: Store, name: str, request: StudyRequest, who: Caller) -> JoinPlan:
    """Decide what ``who``'s join of study ``name`` with ``request`` does; nothing is written.

    Raises JoinRefused: 400 for another model or cluster, 403 when an ended study of another token
    would be queued again without the admin role, 409 for a study running outside the service.
    """
    job = store.jobs.get(name)
    rec = store.get_study(name) if store.has_study(name) else None
    if job is None and rec is None:
        return JoinPlan("submit", "queued", request.trials, 0)
    wanted = (request.model_spec().signature(), request.cluster_spec().fingerprint())
    if rec is not None:
        found = (rec.model_signature, rec.cluster_fingerprint)
        shown = f"{rec.model_name} on {ClusterSpec.from_dict(rec.cluster).described_as()}"
    else:
        assert job is not None  # one of the two exists (checked above)
        queued = StudyRequest(**job.request)
        found = (queued.model_spec().signature(), queued.cluster_spec().fingerprint())
        shown = f"{model_label(queued.model)} on {queued.cluster_spec().described_as()}"
    if found != wanted:
        raise JoinRefused(400, f"join needs the study's model and cluster: {name!r} tunes {shown}; "
                               "send the same model, gpus, gpu_type, gpus_per_node and links, or another name")
    launched = sum(1 for t in store.trials(name) if t.status in LAUNCHED) if rec is not None else 0
    if job is not None and not job.finished:
        budget = int(job.request.get("trials") or request.trials)
        if request.trials <= budget:
            return JoinPlan("follow", job.status, budget, launched)
        if job.owner != who.name and not who.may("admin"):
            raise JoinRefused(403, f"token {who.name!r} may raise only its own studies' budgets: {name!r} is "
                                   f"{job.owner!r}'s and {job.status} to {budget} trials; join with trials <= "
                                   f"{budget} to follow it, or ask an admin")
        return JoinPlan("raise", job.status, request.trials, launched)
    if job is None and rec is not None and rec.status == "running":
        raise JoinRefused(409, f"study {name!r} is being tuned outside the service (autoslapo tune): join it there "
                               f"(`autoslapo tune ... --study {name} --join`), or resume it here once it ended")
    ended = job.status if job is not None else rec.status if rec is not None else "complete"
    if launched >= request.trials:
        submitted = job.request.get("trials") if job is not None else None
        budget = study_budget(rec.budget if rec is not None else None, submitted, launched) or launched
        return JoinPlan("follow", ended, budget, launched)
    if job is not None and job.owner != who.name and not who.may("admin"):
        raise JoinRefused(403, f"token {who.name!r} may continue only its own studies: {name!r} is {job.owner!r}'s "
                               f"and ended {ended} at {launched} of {request.trials} trials; join with "
                               f"trials <= {launched} to read it, or ask an admin")
    return JoinPlan("requeue", "queued", request.trials, launched)
