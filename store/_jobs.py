"""Queued study jobs: the service writes them, workers claim them under a lease and heartbeat.

A claim takes the oldest job that is queued, or running with a lapsed lease (its worker died), in
one write transaction: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (claimers never wait on each
other), ``BEGIN IMMEDIATE`` on SQLite (claimers queue on the database's write lock).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, text, update
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store._budget import check_budget, lift_budget
from store._engine import Transactions
from store._records import clean_json
from store._schema import StudyRow, utcnow
from store._service_schema import JOB_FINISHED, JOB_STATUSES, JobRow

#: The PostgreSQL advisory locks that serialize claims under a running-jobs limit and
#: submissions under a per-owner limit.
CLAIM_LOCK_KEY = 0x6A6F6273  # "jobs"
SUBMIT_LOCK_KEY = CLAIM_LOCK_KEY + 1


class JobLimitError(StorageError):
    """A submission refused because its owner already has the allowed number of unfinished jobs."""


@dataclass(frozen=True)
class JobRecord:
    """One submitted study: its request, who sent it, and where its run stands."""

    id: int
    study: str
    owner: str
    request: dict[str, Any]
    status: str
    cancel_requested: bool
    worker: str
    attempts: int
    lease_until: datetime | None
    error: str
    created_at: datetime
    updated_at: datetime

    @property
    def finished(self) -> bool:
        """True once the job is complete, stopped, failed or cancelled."""
        return self.status in JOB_FINISHED


def _record(row: JobRow) -> JobRecord:
    return JobRecord(row.id, row.study, row.owner, dict(row.request), row.status, bool(row.cancel_requested),
                     row.worker, row.attempts, row.lease_until, row.error, row.created_at, row.updated_at)


class JobQueue:
    """The jobs table of one store (``Store.jobs``)."""

    def __init__(self, tx: Transactions) -> None:
        self._tx = tx

    def submit(self, study: str, request: dict[str, Any], *, owner: str = "",
               max_unfinished: int | None = None) -> JobRecord:
        """Queue a job for a new study; raises StorageError when a study or job of that name exists.

        ``max_unfinished``: raise JobLimitError (nothing written) when ``owner`` already has that
        many queued or running jobs; the count and the insert are one transaction.
        """

        def insert(session: Session) -> JobRecord | None:
            if session.scalar(select(StudyRow.id).where(StudyRow.name == study)) is not None:
                return None
            _check_owner_limit(session, owner, max_unfinished)
            row = JobRow(study=study, owner=owner, request=clean_json(request), status="queued",
                         cancel_requested=False, worker="", attempts=0, error="")
            session.add(row)
            session.flush()
            return _record(row)

        made = self._tx.write_unique(f"queue a job for study {study!r}", insert)
        if made is None:
            raise StorageError(f"study names must be unique: {study!r} exists already; pick another name")
        return made

    def requeue(self, study: str, request: dict[str, Any], *, owner: str = "",
                max_unfinished: int | None = None) -> JobRecord:
        """Queue ``study`` again to resume it (``request`` replaces the job's, its ``space`` kept
        when the new one has none); a study tuned outside the service gets its first job.

        Raises StorageError when the study has neither a job nor trials, or its job is queued or
        running; JobLimitError (nothing written) as ``submit`` does.
        """

        def again(session: Session) -> JobRecord | str:
            row = session.scalar(select(JobRow).where(JobRow.study == study).with_for_update())
            if row is None and session.scalar(select(StudyRow.id).where(StudyRow.name == study)) is None:
                return f"no study {study!r} to resume: submit it without resume first"
            if row is not None and row.status not in JOB_FINISHED:
                return f"study {study!r} is {row.status} already: wait for it to end or cancel it, then resume"
            _check_owner_limit(session, owner, max_unfinished)
            merged = clean_json(request)
            if row is None:
                row = JobRow(study=study, owner=owner, request=merged, status="queued", cancel_requested=False,
                             worker="", attempts=0, error="")
                session.add(row)
            else:
                if merged.get("space") is None and row.request.get("space") is not None:
                    merged["space"] = row.request["space"]  # a resumed study searches the space it began with
                row.request, row.owner, row.status = merged, owner, "queued"
                row.cancel_requested, row.worker, row.lease_until, row.error = False, "", None, ""
            session.flush()
            return _record(row)

        out = self._tx.write(f"queue study {study!r} again", again)
        if isinstance(out, str):
            raise StorageError(out)
        return out

    def get(self, study: str) -> JobRecord | None:
        """The job of ``study``, or None when the study was not submitted as a job."""
        return self._tx.read("read a job", lambda s: (lambda r: None if r is None else _record(r))(
            s.scalar(select(JobRow).where(JobRow.study == study))))

    def list(self) -> list[JobRecord]:
        """Every job, oldest first."""
        return self._tx.read("list jobs", lambda s: [_record(r) for r in s.scalars(select(JobRow).order_by(JobRow.id))])

    def claim(self, worker: str, lease_s: float, *, max_running: int | None = None,
              skip: Collection[int] = ()) -> JobRecord | None:
        """Take the oldest queued job (or running one whose lease lapsed) for ``worker``; None if none.

        ``max_running``: None when ``max_running`` jobs already run under a live lease (the rest
        stay queued). On PostgreSQL an advisory lock makes the count and the claim one step.
        ``skip``: ids of jobs this worker gave back (``release``) and will not take again.
        """
        if max_running is not None and max_running < 1:
            raise StorageError(f"max_running must be >= 1 or None: got {max_running}")

        def take(session: Session) -> JobRecord | None:
            now = utcnow()
            postgres = session.get_bind().dialect.name == "postgresql"
            if max_running is not None:
                if postgres:
                    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CLAIM_LOCK_KEY})
                live = session.scalar(select(func.count()).select_from(JobRow).where(
                    JobRow.status == "running", JobRow.lease_until >= now))
                if (live or 0) >= max_running:
                    return None
            q = (select(JobRow)
                 .where(or_(JobRow.status == "queued", (JobRow.status == "running") & (JobRow.lease_until < now)))
                 .order_by(JobRow.id).limit(1))
            if skip:
                q = q.where(JobRow.id.notin_(sorted(skip)))
            if postgres:
                q = q.with_for_update(skip_locked=True)
            row = session.scalar(q)
            if row is None:
                return None
            row.status, row.worker = "running", worker
            row.attempts += 1
            row.lease_until = now + timedelta(seconds=lease_s)
            session.flush()
            return _record(row)

        return self._tx.write("claim a job", take)

    def release(self, job_id: int, worker: str, note: str) -> bool:
        """Give a job ``worker`` claimed but cannot run back to the queue: queued again, the attempt
        not counted, ``note`` (why) kept as its error until a worker that can run it finishes it.
        Returns False when ``worker`` no longer holds it."""

        def give(session: Session) -> bool:
            row = session.get(JobRow, job_id)
            if row is None or row.status != "running" or row.worker != worker:
                return False
            row.status, row.worker, row.lease_until, row.error = "queued", "", None, note
            row.attempts = max(0, row.attempts - 1)
            return True

        return self._tx.write("release a job", give)

    def heartbeat(self, job_id: int, worker: str, lease_s: float) -> tuple[bool, bool]:
        """Extend ``worker``'s lease; returns (still held, cancel requested)."""

        def beat(session: Session) -> tuple[bool, bool]:
            held = session.execute(
                update(JobRow).where(JobRow.id == job_id, JobRow.worker == worker, JobRow.status == "running")
                .values(lease_until=utcnow() + timedelta(seconds=lease_s))).rowcount  # type: ignore[attr-defined]
            cancel = bool(session.scalar(select(JobRow.cancel_requested).where(JobRow.id == job_id)))
            return bool(held), cancel

        return self._tx.write("extend a job's lease", beat)

    def finish(self, job_id: int, worker: str, status: str, error: str = "", *, budget: int | None = None) -> bool:
        """Record how ``worker``'s run ended; False when the job was no longer its own.

        ``budget``: the trials the run went to; the job is left running (False) when its budget was
        raised past them meanwhile (``raise_budget``), so the worker goes on instead of ending it.
        """
        if status not in JOB_STATUSES:
            raise StorageError(f"job status must be one of {', '.join(JOB_STATUSES)}: got {status!r}")

        def end(session: Session) -> bool:
            row = session.scalar(select(JobRow).where(JobRow.id == job_id).with_for_update())
            if row is None or row.worker != worker or row.status != "running":
                return False
            if budget is not None and int(row.request.get("trials") or 0) > budget:
                return False
            row.status, row.error, row.lease_until = status, error[:2000], None
            return True

        return self._tx.write("finish a job", end)

    def raise_budget(self, study: str, trials: int) -> JobRecord | None:
        """Raise the ``trials`` of ``study``'s queued or running job to ``trials`` (never lowered);
        None when it has no such job (it ended meanwhile: queue it again instead). The worker running
        it sees the new budget when it would end (``finish(budget=...)``) and goes on to it. The
        study's own budget (``Store.raise_budget``) is raised too, in the same transaction, once the
        study exists (a queued job's study is created, with its budget, when a worker starts it)."""
        check_budget(trials)

        def lift(session: Session) -> JobRecord | None:
            row = session.scalar(select(JobRow).where(JobRow.study == study).with_for_update())
            if row is None or row.status in JOB_FINISHED:
                return None
            if int(row.request.get("trials") or 0) < trials:
                row.request = {**row.request, "trials": trials}
            lift_budget(session, study, trials)
            session.flush()
            return _record(row)

        return self._tx.write(f"raise the budget of study {study!r}", lift)

    def cancel(self, study: str) -> JobRecord:
        """Ask the job of ``study`` to stop: a queued job is cancelled at once, a running one between trials."""

        def ask(session: Session) -> JobRecord | None:
            row = session.scalar(select(JobRow).where(JobRow.study == study))
            if row is None:
                return None
            if row.status == "queued":
                row.status = "cancelled"
            elif row.status == "running":
                row.cancel_requested = True
            session.flush()
            return _record(row)

        found = self._tx.write("cancel a job", ask)
        if found is None:
            raise StorageError(f"no job for study {study!r}: only studies submitted to the service can be cancelled")
        return found


def _check_owner_limit(session: Session, owner: str, max_unfinished: int | None) -> None:
    """Raise JobLimitError when ``owner`` has ``max_unfinished`` queued or running jobs (in the
    caller's transaction; on PostgreSQL under an advisory lock, so two submissions count in turn)."""
    if max_unfinished is None:
        return
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUBMIT_LOCK_KEY})
    unfinished = session.scalar(select(func.count()).select_from(JobRow).where(
        JobRow.owner == owner, JobRow.status.in_(("queued", "running")))) or 0
    if unfinished >= max_unfinished:
        raise JobLimitError(f"{owner!r} has {unfinished} queued or running studies, the limit is "
                            f"{max_unfinished}: wait for one to finish or cancel one")
