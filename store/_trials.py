"""Writing trials: the one row builder, the study lock with the next number, and the conflict rules.

``Store`` keeps the public methods and their contracts; these functions do the work, each in one
short transaction (the insert-and-settle loop in at most a few). ``study`` is the study's name
(records carry it), ``study_id`` its row id.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy import insert as sql_insert
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store._convert import METRIC_COLUMNS, result_columns, trial_record
from store._engine import Transactions
from store._records import DuplicateTrial, TrialRecord, clean_json, config_hash
from store._schema import TRIAL_TABLE, TRIALS, StudyRow, TrialRow, utcnow

INTERRUPTED = "interrupted: the tuner stopped while this trial was running"
_ATTEMPTS = 3
_NOT_RESTARTABLE = ("running", "complete")

#: Decides a unique conflict: the trial to hand back, None to insert again, or raise DuplicateTrial.
Settle = Callable[[TrialRecord], TrialRecord | None]


def trial_row(
    study_id: int,
    config: dict[str, Any],
    *,
    number: int | None = None,
    result: dict[str, Any] | None = None,
    host: str = "",
    started_at: datetime,
    ended_at: datetime | None = None,
) -> dict[str, Any]:
    """Column values of a new trial row of ``config``.

    With ``result`` the row is finished (its status and metrics, ended at ``ended_at``); without,
    it is ``running`` and carries a fresh claim token in its result, by which a write retried
    after a dropped connection recognises its own row. ``number`` None leaves the number to
    ``next_number``. Raises StorageError for a config or result the store cannot hold.
    """
    values: dict[str, Any] = dict(
        study_id=study_id,
        config=clean_json(config),
        config_hash=config_hash(config),
        host=host,
        started_at=started_at,
    )
    if number is not None:
        values["number"] = int(number)
    if result is None:
        values.update(status="running", measured=False, reason="", result={"claim": uuid.uuid4().hex})
    else:
        values.update(result_columns(result), ended_at=ended_at)
    return values


def next_number(session: Session, study_id: int) -> int:
    """Lock the study and return its next trial number (one past the highest, 0 for the first).

    The lock (``FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already holds the
    database) lasts to the end of the transaction, so writers numbering one study take turns.
    """
    session.execute(select(StudyRow.id).where(StudyRow.id == study_id).with_for_update())
    top = session.scalar(select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id))
    return 0 if top is None else int(top) + 1


def _ours(existing: TrialRecord, values: dict[str, Any]) -> bool:
    """True when ``existing`` is the row ``values`` describe: our own earlier attempt, committed
    before its connection dropped (a running row holds our claim token, a finished one our result)."""
    return existing.config_hash == values["config_hash"] and existing.result == values["result"]


def duplicate(study: str, number: int, digest: str, existing: TrialRecord) -> DuplicateTrial:
    """The DuplicateTrial for writing ``number``/``digest`` when ``existing`` holds one of them."""
    if existing.number == number and existing.config_hash != digest:
        rule = f"trial numbers are unique in a study: number {number} is taken by another config"
    elif existing.number != number:
        rule = f"a config runs once per study: it is already trial {existing.number}"
    else:
        rule = f"trial {number} is already stored as {existing.status}"
    return DuplicateTrial(
        f"{rule} (study {study!r}, config {digest[:12]}); reuse the stored trial or pick a new config",
        existing,
    )


def _insert(tx: Transactions, study: str, values: dict[str, Any]) -> TrialRecord | None:
    """Insert one trial row; None when a unique constraint refused it."""

    def insert(session: Session) -> TrialRecord:
        row = TrialRow(**values)
        session.add(row)
        session.flush()
        return trial_record(row, study)

    return tx.write_unique(f"write a trial of {study!r}", insert)


def _conflict(tx: Transactions, study: str, values: dict[str, Any]) -> TrialRecord | None:
    """The stored trial holding ``values``' number (first) or config, or None."""
    number = values["number"]
    query = (
        TRIALS.where(TrialRow.study_id == values["study_id"])
        .where(or_(TrialRow.number == number, TrialRow.config_hash == values["config_hash"]))
        .order_by(TrialRow.number != number)
    )

    def find(session: Session) -> TrialRecord | None:
        row = session.execute(query).first()
        return None if row is None else trial_record(row, study)

    return tx.read("read a trial", find)


def insert_settling(
    tx: Transactions, study: str, values: dict[str, Any], settle: Settle, *, what: str
) -> TrialRecord:
    """Insert the row ``values`` under its own number; on a unique conflict, ``settle`` it.

    ``settle`` gets the stored trial holding the number (or else the config) and returns the
    trial to hand back, None to insert again, or raises DuplicateTrial. A conflicting row that
    vanished before it could be read is retried too. Raises StorageError when rows keep changing.
    """
    for _ in range(_ATTEMPTS):
        stored = _insert(tx, study, values)
        if stored is not None:
            return stored
        existing = _conflict(tx, study, values)
        settled = None if existing is None else settle(existing)
        if settled is not None:
            return settled
    raise StorageError(f"cannot {what}: it kept conflicting with changing rows")


def add_trial(
    tx: Transactions,
    study: str,
    study_id: int,
    number: int,
    config: dict[str, Any],
    result: dict[str, Any],
    *,
    started_at: datetime | None,
    ended_at: datetime | None,
) -> TrialRecord:
    """``Store.add_trial``: a finished trial under ``number``, idempotent for its own retry."""
    now = utcnow()
    values = trial_row(
        study_id, config, number=number, result=result, started_at=started_at or now, ended_at=ended_at or now
    )

    def settle(existing: TrialRecord) -> TrialRecord:
        if existing.number == values["number"] and existing.config_hash == values["config_hash"]:
            if existing.status == "running":
                return finish_trial(tx, study, study_id, number, result, ended_at=ended_at)
            if _ours(existing, values):
                return existing
        raise duplicate(study, number, values["config_hash"], existing)

    return insert_settling(tx, study, values, settle, what=f"write trial {number} of {study!r}")


def start_trial(
    tx: Transactions,
    study: str,
    study_id: int,
    number: int,
    config: dict[str, Any],
    *,
    host: str,
    restart: bool,
    started_at: datetime | None,
) -> TrialRecord:
    """``Store.start_trial``: trial ``number`` written as ``running``, or an ended one restarted."""
    values = trial_row(study_id, config, number=number, host=host, started_at=started_at or utcnow())
    digest = values["config_hash"]

    def settle(existing: TrialRecord) -> TrialRecord | None:
        if _ours(existing, values):
            return existing
        if restart and existing.config_hash == digest and existing.status not in _NOT_RESTARTABLE:
            return _restart(tx, study, study_id, existing, values)  # None: another process got it first
        raise duplicate(study, number, digest, existing)

    return insert_settling(tx, study, values, settle, what=f"start trial {number} of {study!r}")


def _restart(
    tx: Transactions, study: str, study_id: int, existing: TrialRecord, values: dict[str, Any]
) -> TrialRecord | None:
    """Reset an ended, not complete trial to ``running``; None if another process got it first."""
    cleared: dict[str, Any] = dict.fromkeys((*METRIC_COLUMNS, "ended_at"))
    fresh = {k: values[k] for k in ("number", "status", "measured", "reason", "host", "result", "started_at")}
    match = (TrialRow.study_id == study_id, TrialRow.config_hash == existing.config_hash)

    def reset(session: Session) -> TrialRecord | None:
        done = session.execute(
            update(TrialRow)
            .where(*match, TrialRow.status.not_in(_NOT_RESTARTABLE))
            .values(**cleared, **fresh)
        )
        if done.rowcount == 0:  # type: ignore[attr-defined]
            return None
        return trial_record(session.execute(TRIALS.where(*match)).one(), study)

    # None also when ``number`` is taken by another trial (a unique violation): the caller's
    # next attempt then reports that trial as the duplicate.
    return tx.write_unique(f"restart trial {existing.number} of {study!r}", reset)


def add_trials(
    tx: Transactions, study: str, study_id: int, trials: Iterable[tuple[int, dict[str, Any], dict[str, Any]]]
) -> int:
    """``Store.add_trials``: many finished trials under their numbers, all or nothing."""
    now = utcnow()
    rows = [trial_row(study_id, c, number=n, result=r, started_at=now, ended_at=now) for n, c, r in trials]
    if not rows:
        return 0

    def insert_all(session: Session) -> int:
        session.connection().execute(sql_insert(TRIAL_TABLE), rows)
        return len(rows)

    stored = tx.write_unique(f"write trials of {study!r}", insert_all)
    if stored is None:
        raise StorageError(
            f"trial numbers and configs are unique in a study: a batch of {len(rows)} trials for "
            f"{study!r} repeats one; none were stored; use add_trial for idempotent writes"
        )
    return stored


def claim_trial(
    tx: Transactions,
    study: str,
    study_id: int,
    config: dict[str, Any],
    *,
    budget: int | None,
    result: dict[str, Any] | None,
    host: str,
) -> TrialRecord | None:
    """``Store.claim_trial``: a new trial under the next number, within ``budget``, under the lock."""
    now = utcnow()
    values = trial_row(study_id, config, result=result, host=host, started_at=now, ended_at=now)
    digest = values["config_hash"]

    def claim(session: Session) -> TrialRecord | None:
        number = next_number(session, study_id)
        found = session.execute(
            TRIALS.where(TrialRow.study_id == study_id, TrialRow.config_hash == digest)
        ).first()
        if found is not None:
            existing = trial_record(found, study)
            if _ours(existing, values):
                return existing
            raise duplicate(study, existing.number, digest, existing)
        if budget is not None:
            used = session.scalar(
                select(func.count())
                .select_from(TrialRow)
                .where(TrialRow.study_id == study_id, TrialRow.status != "pruned")
            )
            if int(used or 0) >= budget:
                return None
        row = TrialRow(**values, number=number)
        session.add(row)
        session.flush()
        return trial_record(row, study)

    return tx.write(f"claim a trial of {study!r}", claim)


def add_new_trials(
    tx: Transactions, study: str, study_id: int, trials: Iterable[tuple[dict[str, Any], dict[str, Any]]],
    times: Sequence[tuple[datetime, datetime] | None] = (),
) -> int:
    """``Store.add_new_trials``: finished trials of new configs under the next numbers, under the lock."""
    now = utcnow()
    items = [(config_hash(c), c, r, (times[i] if i < len(times) else None) or (now, now))
             for i, (c, r) in enumerate(trials)]
    if not items:
        return 0

    def insert_new(session: Session) -> int:
        number = next_number(session, study_id)
        have = set(
            session.scalars(
                select(TrialRow.config_hash).where(
                    TrialRow.study_id == study_id, TrialRow.config_hash.in_([d for d, *_ in items])
                )
            )
        )
        rows = []
        for digest, config, result, (started, ended) in items:
            if digest in have:
                continue  # stored already (by another tuner), or twice in this batch
            have.add(digest)
            rows.append(
                trial_row(study_id, config, number=number, result=result, started_at=started, ended_at=ended)
            )
            number += 1
        if rows:
            session.connection().execute(sql_insert(TRIAL_TABLE), rows)
        return len(rows)

    return tx.write(f"write trials of {study!r}", insert_new)


def amend_trial(tx: Transactions, study: str, study_id: int, number: int, result: dict[str, Any]) -> TrialRecord:
    """``Store.amend_trial``: a finished trial's result replaced, its status and ``ended_at`` kept."""
    columns = result_columns(result)
    match = (TrialRow.study_id == study_id, TrialRow.number == int(number))

    def amend(session: Session) -> tuple[str | None, TrialRecord | None]:
        row = session.execute(TRIALS.where(*match)).first()
        if row is None:
            return None, None
        before = trial_record(row, study)
        if before.status != columns["status"] or before.status == "running":
            return before.status, None
        session.execute(update(TrialRow).where(*match, TrialRow.status == before.status).values(**columns))
        return before.status, trial_record(session.execute(TRIALS.where(*match)).one(), study)

    status, record = tx.write(f"amend trial {number} of {study!r}", amend)
    if record is None:
        raise StorageError(
            f"only a finished trial's result can be amended, keeping its status: {study!r} trial {number} "
            + ("does not exist" if status is None else f"is {status}, the new result {columns['status']}")
            + "; store a new trial instead"
        )
    return record


def finish_trial(
    tx: Transactions,
    study: str,
    study_id: int,
    number: int,
    result: dict[str, Any],
    *,
    ended_at: datetime | None,
) -> TrialRecord:
    """``Store.finish_trial``: the result of a ``running`` trial, idempotent for its own retry."""
    columns = result_columns(result)
    columns.update(ended_at=ended_at or utcnow())
    match = (TrialRow.study_id == study_id, TrialRow.number == int(number))

    def finish(session: Session) -> TrialRecord | None:
        done = session.execute(update(TrialRow).where(*match, TrialRow.status == "running").values(**columns))
        row = session.execute(TRIALS.where(*match)).first()
        if row is None:
            return None
        record = trial_record(row, study)
        if done.rowcount == 0 and record.result != columns["result"]:  # type: ignore[attr-defined]
            raise duplicate(study, number, record.config_hash, record)
        return record

    record = tx.write(f"finish trial {number} of {study!r}", finish)
    if record is None:
        raise StorageError(
            f"a trial must be started before it is finished: {study!r} has no trial {number}; "
            "call start_trial first or use add_trial"
        )
    return record


def mark_stale_running(
    tx: Transactions,
    study: str,
    study_id: int,
    *,
    older_than_s: float | None,
    host: str | None,
    reason: str,
) -> list[TrialRecord]:
    """``Store.mark_stale_running``: the study's matching ``running`` trials set to ``failed``."""
    conditions = [TrialRow.study_id == study_id, TrialRow.status == "running"]
    if older_than_s is not None:
        conditions.append(TrialRow.started_at < utcnow() - timedelta(seconds=older_than_s))
    if host is not None:
        conditions.append(TrialRow.host == host)

    def mark(session: Session) -> list[TrialRecord]:
        rows = list(session.execute(TRIALS.where(*conditions).order_by(TrialRow.number)))
        if not rows:
            return []
        ids = [r.id for r in rows]
        session.execute(
            update(TrialRow)
            .where(TrialRow.id.in_(ids), TrialRow.status == "running")
            .values(
                status="failed",
                reason=reason,
                ended_at=utcnow(),
                result={"status": "failed", "reason": reason},
            )
        )
        session.expire_all()
        fresh = session.execute(TRIALS.where(TrialRow.id.in_(ids)).order_by(TrialRow.number))
        return [trial_record(r, study) for r in fresh]

    return tx.write(f"mark stale trials of {study!r}", mark)
