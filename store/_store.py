"""``open_store`` and ``Store``: studies and trials in SQLite or PostgreSQL.

Every public method runs one short transaction of its own (retried on lock, serialization and
dropped-connection errors) and returns frozen records, never ORM objects.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Engine, Table, delete, func, or_, select, update
from sqlalchemy import insert as sql_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store import _engine, _migrate
from store._convert import METRIC_COLUMNS, result_columns, software_versions, study_record, trial_record
from store._frames import export_frame, trials_frame
from store._records import (
    RANK_METRICS,
    STUDY_STATUSES,
    DuplicateTrial,
    HistoryPoint,
    StudyRecord,
    TrialRecord,
    check_metric,
    clean_json,
    config_hash,
)
from store._schema import VERSION_TABLE, StudyRow, TrialRow, utcnow
from store._url import check_sqlite_file, display, parse_url, resolve_url, sqlite_path

if TYPE_CHECKING:
    import optuna
    import pandas as pd

T = TypeVar("T")
# Reads go through Core rows, not ORM objects: no identity map, ~3x faster for long lists.
_TRIAL_TABLE = cast(Table, TrialRow.__table__)
_TRIALS = select(_TRIAL_TABLE)
INTERRUPTED = "interrupted: the tuner stopped while this trial was running"


def open_store(url: str | None = None) -> Store:
    """Open (creating or upgrading as needed) the store at ``url``.

    ``url`` None -> $AUTOSLAPO_STORAGE -> ``sqlite:///autoslapo.db`` in the working directory.
    Raises StorageError, leaving the target as it was, for a malformed URL, an unreachable
    server, a file that is not a SQLite database, a damaged database, or a schema revision
    written by a newer autoslapo.
    """
    parsed = parse_url(resolve_url(url))
    where = display(parsed)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is not None:
            parsed = parsed.set(database=str(path))
            if check_sqlite_file(path):
                existed = [p.exists() for p in _engine.sibling_files(path)]
                try:
                    _migrate.check_revision(_engine.probe_sqlite(path, VERSION_TABLE), where)
                except StorageError:
                    _engine.remove_new_siblings(path, existed)
                    raise
    engine = _engine.build_engine(parsed)
    try:
        if parsed.get_backend_name() == "postgresql":
            # Read-only look first, so a newer schema is refused before any lock or DDL.
            try:
                with engine.connect() as conn:
                    _migrate.check_revision(_migrate.current_revision(conn), where)
            except SQLAlchemyError as err:
                raise _engine.storage_error(err, what="open the store", url=parsed) from None
        _engine.with_retry(lambda: _migrate.upgrade(engine, where=where), what="open the store", url=parsed)
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, parsed)


class Store:
    """Studies and their trials in one SQL database, shared with Optuna's own tables.

    Build it with ``open_store``; close it (or use it as a context manager) when done.
    """

    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine = engine
        self._writer = _engine.writer(engine)
        self._url = url
        self._study_ids: dict[str, int] = {}

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL with any password replaced by ``***`` (safe to print)."""
        return display(self._url)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._url.get_backend_name()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def close(self) -> None:
        """Release every pooled connection (SQLite checkpoints its WAL into the main file)."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def revision(self) -> str | None:
        """The schema revision the database is at (the head once opened)."""
        return self._read("read the schema revision", lambda s: _migrate.current_revision(s.connection()))

    def _read(self, what: str, fn: Callable[[Session], T]) -> T:
        def run() -> T:
            with Session(self._engine) as session, session.begin():
                return fn(session)

        return _engine.with_retry(run, what=what, url=self._url)

    def _write(self, what: str, fn: Callable[[Session], T]) -> T:
        def run() -> T:
            with Session(self._writer) as session, session.begin():
                return fn(session)

        return _engine.with_retry(run, what=what, url=self._url)

    def _write_unique(self, what: str, fn: Callable[[Session], T]) -> T | None:
        """Like ``_write``, but None (nothing written) when a unique constraint refuses it."""

        def run() -> T | None:
            try:
                with Session(self._writer) as session, session.begin():
                    return fn(session)
            except IntegrityError:
                return None

        return _engine.with_retry(run, what=what, url=self._url)

    # -- studies ---------------------------------------------------------------------------

    def create_study(
        self,
        name: str,
        *,
        model: dict[str, Any],
        cluster: dict[str, Any],
        space_name: str,
        space_version: str,
        objective: str,
        backend: str,
        model_signature: str,
        cluster_fingerprint: str,
        exist_ok: bool = False,
    ) -> StudyRecord:
        """Record a new study and return it.

        ``model`` is ``ModelSpec.to_dict()`` (its ``preset`` is the name ``best()`` matches) and
        ``cluster`` is ``ClusterSpec.to_dict()`` (``gpus``, ``gpu_type``, ``memory_bytes`` are
        copied into columns). With ``exist_ok`` an existing study of the same name, model
        signature and cluster fingerprint is returned. Raises StorageError when the name is
        taken (by a different model or cluster, or at all without ``exist_ok``).
        """
        if not name or len(name) > 200:
            raise StorageError(f"a study name must have 1 to 200 characters: got {name!r}")
        if not isinstance(cluster.get("gpus"), int) or cluster["gpus"] < 1:
            raise StorageError(f"cluster['gpus'] must be a positive int: got {cluster.get('gpus')!r}")
        memory = cluster.get("memory_bytes")
        values = dict(
            name=name,
            model_name=str(model.get("preset") or model.get("name") or model_signature[:16]),
            model_family=str(model.get("family") or ""),
            model=clean_json(model),
            model_signature=model_signature,
            cluster=clean_json(cluster),
            cluster_fingerprint=cluster_fingerprint,
            gpus=cluster["gpus"],
            gpu_type=str(cluster.get("gpu_type") or ""),
            gpu_memory_bytes=None if memory is None else int(memory),
            space_name=space_name,
            space_version=str(space_version),
            objective=objective,
            backend=backend,
            status="created",
            software=software_versions(),
        )

        def insert(session: Session) -> StudyRecord:
            row = StudyRow(**values)
            session.add(row)
            session.flush()
            return study_record(row)

        created = self._write_unique(f"create study {name!r}", insert)
        if created is not None:
            return created
        existing = self.get_study(name)
        same = (existing.model_signature, existing.cluster_fingerprint) == (
            model_signature,
            cluster_fingerprint,
        )
        if exist_ok and same:
            return existing
        why = "for a different model or cluster" if not same else "already"
        raise StorageError(
            f"study names must be unique: {name!r} exists {why} (model {existing.model_name}, "
            f"{existing.gpus}x {existing.gpu_type}); pick another name or resume that study"
        )

    def has_study(self, name: str) -> bool:
        """True if a study called ``name`` exists."""
        return self._read(
            "look up a study",
            lambda s: s.scalar(select(StudyRow.id).where(StudyRow.name == name)) is not None,
        )

    def get_study(self, name: str) -> StudyRecord:
        """The study called ``name``; raises StorageError (listing some names) if there is none."""
        row = self._read(
            "read a study",
            lambda s: (lambda r: None if r is None else study_record(r))(
                s.scalar(select(StudyRow).where(StudyRow.name == name))
            ),
        )
        if row is None:
            raise self._no_study(name)
        return row

    def list_studies(self) -> list[StudyRecord]:
        """Every study, oldest first."""
        return self._read(
            "list studies",
            lambda s: [study_record(r) for r in s.scalars(select(StudyRow).order_by(StudyRow.id))],
        )

    def set_study_status(self, name: str, status: str) -> StudyRecord:
        """Set a study's status (one of ``STUDY_STATUSES``) and return the updated study."""
        if status not in STUDY_STATUSES:
            raise StorageError(f"study status must be one of {', '.join(STUDY_STATUSES)}: got {status!r}")
        study_id = self._study_id(name)
        self._write(
            "update a study",
            lambda s: s.execute(
                update(StudyRow).where(StudyRow.id == study_id).values(status=status, updated_at=utcnow())
            ),
        )
        return self.get_study(name)

    def delete_study(self, name: str) -> None:
        """Delete a study and all its trials (Optuna's study of that name is not touched)."""
        study_id = self._study_id(name)

        def drop(session: Session) -> None:
            session.execute(delete(TrialRow).where(TrialRow.study_id == study_id))
            session.execute(delete(StudyRow).where(StudyRow.id == study_id))

        self._write("delete a study", drop)
        self._study_ids.pop(name, None)

    def _no_study(self, name: str) -> StorageError:
        names = [r.name for r in self.list_studies()][:10]
        known = ", ".join(names) if names else "none yet"
        return StorageError(
            f"no study named {name!r} in {self.url}: known studies are {known}; check the name"
        )

    def _study_id(self, name: str) -> int:
        cached = self._study_ids.get(name)
        if cached is not None:
            return cached
        found = self._read(
            "look up a study", lambda s: s.scalar(select(StudyRow.id).where(StudyRow.name == name))
        )
        if found is None:
            raise self._no_study(name)
        self._study_ids[name] = found
        return found

    # -- trials: writing -------------------------------------------------------------------

    def _conflict(self, study: str, study_id: int, number: int, digest: str) -> TrialRecord | None:
        def find(session: Session) -> TrialRecord | None:
            row = session.execute(
                _TRIALS.where(TrialRow.study_id == study_id)
                .where(or_(TrialRow.number == number, TrialRow.config_hash == digest))
                .order_by(TrialRow.number != number)
            ).first()
            return None if row is None else trial_record(row, study)

        return self._read("read a trial", find)

    def _insert(self, study: str, values: dict[str, Any]) -> TrialRecord | None:
        """Insert one trial row; None when a unique constraint refused it."""

        def insert(session: Session) -> TrialRecord:
            row = TrialRow(**values)
            session.add(row)
            session.flush()
            return trial_record(row, study)

        return self._write_unique(f"write a trial of {study!r}", insert)

    @staticmethod
    def _duplicate(study: str, number: int, digest: str, existing: TrialRecord) -> DuplicateTrial:
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

    def add_trial(
        self,
        study: str,
        number: int,
        config: dict[str, Any],
        result: dict[str, Any],
        *,
        started_at: datetime | None = None,
        ended_at: datetime | None = None,
    ) -> TrialRecord:
        """Store a finished trial in one step and return it.

        Idempotent: if the same (number, config) is already stored with the same result, that row
        is returned; if it is stored as ``running``, it is finished with ``result``. Raises
        DuplicateTrial (with ``.existing``) when the number or the config is taken otherwise.
        """
        study_id = self._study_id(study)
        digest = config_hash(config)
        now = utcnow()
        values: dict[str, Any] = dict(
            study_id=study_id,
            number=int(number),
            config=clean_json(config),
            config_hash=digest,
            host="",
            started_at=started_at or now,
            ended_at=ended_at or now,
        )
        values.update(result_columns(result))
        for _ in range(3):
            stored = self._insert(study, values)
            if stored is not None:
                return stored
            existing = self._conflict(study, study_id, number, digest)
            if existing is None:
                continue  # the conflicting row was deleted meanwhile: insert again
            if existing.number == number and existing.config_hash == digest:
                if existing.status == "running":
                    return self.finish_trial(study, number, result, ended_at=ended_at)
                if existing.result == clean_json(result):
                    return existing
            raise self._duplicate(study, number, digest, existing)
        raise StorageError(f"cannot write trial {number} of {study!r}: it kept conflicting with deleted rows")

    def add_trials(self, study: str, trials: Iterable[tuple[int, dict[str, Any], dict[str, Any]]]) -> int:
        """Store many finished ``(number, config, result)`` trials in one transaction; return the count.

        All or nothing: a duplicate anywhere raises StorageError and stores none of them.
        """
        study_id = self._study_id(study)
        now = utcnow()
        rows = []
        for number, config, result in trials:
            row: dict[str, Any] = dict(
                study_id=study_id,
                number=int(number),
                config=clean_json(config),
                config_hash=config_hash(config),
                host="",
                started_at=now,
                ended_at=now,
            )
            row.update(result_columns(result))
            rows.append(row)
        if not rows:
            return 0

        def insert_all(session: Session) -> int:
            session.connection().execute(sql_insert(_TRIAL_TABLE), rows)
            return len(rows)

        stored = self._write_unique(f"write trials of {study!r}", insert_all)
        if stored is None:
            raise StorageError(
                f"trial numbers and configs are unique in a study: a batch of {len(rows)} trials for "
                f"{study!r} repeats one; none were stored; use add_trial for idempotent writes"
            )
        return stored

    def claim_trial(
        self,
        study: str,
        config: dict[str, Any],
        *,
        budget: int | None = None,
        result: dict[str, Any] | None = None,
        host: str = "",
    ) -> TrialRecord | None:
        """Store a new trial of ``config`` under the study's next free number; return it.

        For several tuners sharing one study: the number is picked, the budget checked and the row
        written in one transaction that holds the study's lock (``FOR UPDATE`` on PostgreSQL,
        ``BEGIN IMMEDIATE`` on SQLite), so numbers never collide and the budget is never passed.
        The row is ``running`` (finish it with ``finish_trial``), or finished at once with
        ``result``. Returns None when ``budget`` trials that are not ``pruned`` are stored already.
        Raises DuplicateTrial (with ``.existing``) when the study already has this config.
        """
        study_id = self._study_id(study)
        digest = config_hash(config)
        claim = uuid.uuid4().hex
        now = utcnow()
        values: dict[str, Any] = dict(
            study_id=study_id, config=clean_json(config), config_hash=digest, host=host, started_at=now
        )
        if result is None:
            values.update(status="running", measured=False, reason="", result={"claim": claim})
        else:
            values.update(result_columns(result), ended_at=now)

        def claim_tx(session: Session) -> TrialRecord | None:
            session.execute(select(StudyRow.id).where(StudyRow.id == study_id).with_for_update())
            found = session.execute(
                _TRIALS.where(TrialRow.study_id == study_id, TrialRow.config_hash == digest)
            ).first()
            if found is not None:
                existing = trial_record(found, study)
                # A retry after a dropped connection whose first attempt did commit: our own row.
                if existing.result.get("claim") == claim or (
                    result is not None and existing.result == clean_json(result)
                ):
                    return existing
                raise self._duplicate(study, existing.number, digest, existing)
            if budget is not None:
                used = session.scalar(
                    select(func.count())
                    .select_from(TrialRow)
                    .where(TrialRow.study_id == study_id, TrialRow.status != "pruned")
                )
                if int(used or 0) >= budget:
                    return None
            top = session.scalar(select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id))
            row = TrialRow(**values, number=0 if top is None else int(top) + 1)
            session.add(row)
            session.flush()
            return trial_record(row, study)

        return self._write(f"claim a trial of {study!r}", claim_tx)

    def add_new_trials(self, study: str, trials: Iterable[tuple[dict[str, Any], dict[str, Any]]]) -> int:
        """Store finished ``(config, result)`` trials under the next free numbers; return how many.

        Configs the study already has are skipped (another tuner stored them first). One
        transaction under the study's lock, like ``claim_trial``.
        """
        study_id = self._study_id(study)
        now = utcnow()
        items = [(config_hash(c), c, r) for c, r in trials]
        if not items:
            return 0

        def insert_tx(session: Session) -> int:
            session.execute(select(StudyRow.id).where(StudyRow.id == study_id).with_for_update())
            have = set(
                session.scalars(
                    select(TrialRow.config_hash).where(
                        TrialRow.study_id == study_id, TrialRow.config_hash.in_([d for d, _, _ in items])
                    )
                )
            )
            top = session.scalar(select(func.max(TrialRow.number)).where(TrialRow.study_id == study_id))
            number = 0 if top is None else int(top) + 1
            rows = []
            for digest, config, result in items:
                if digest in have:
                    continue
                have.add(digest)
                row: dict[str, Any] = dict(
                    study_id=study_id, number=number, config=clean_json(config), config_hash=digest,
                    host="", started_at=now, ended_at=now,
                )
                row.update(result_columns(result))
                rows.append(row)
                number += 1
            if rows:
                session.connection().execute(sql_insert(_TRIAL_TABLE), rows)
            return len(rows)

        return self._write(f"write trials of {study!r}", insert_tx)

    def start_trial(
        self,
        study: str,
        number: int,
        config: dict[str, Any],
        *,
        host: str = "",
        restart: bool = False,
        started_at: datetime | None = None,
    ) -> TrialRecord:
        """Write trial ``number`` as ``running`` before it runs, and return it (the caller owns it).

        Of several processes starting the same number or config, exactly one gets the row; the
        others get DuplicateTrial (with ``.existing``). A start retried after a dropped
        connection recognises its own row by a claim token kept in ``result["claim"]`` until the
        trial finishes. With ``restart``, a stored trial of this config that ended without
        completing (failed, e.g. by ``mark_stale_running``, oom, timeout, pruned) is reset to
        ``running`` under ``number``; running and complete trials are never taken over.
        """
        study_id = self._study_id(study)
        digest = config_hash(config)
        claim = uuid.uuid4().hex
        values = dict(
            study_id=study_id,
            number=int(number),
            config=clean_json(config),
            config_hash=digest,
            status="running",
            measured=False,
            reason="",
            host=host,
            result={"claim": claim},
            started_at=started_at or utcnow(),
        )
        for _ in range(3):
            stored = self._insert(study, values)
            if stored is not None:
                return stored
            existing = self._conflict(study, study_id, number, digest)
            if existing is None:
                continue  # the conflicting row was deleted meanwhile: insert again
            if existing.status == "running" and existing.result.get("claim") == claim:
                return existing  # our own insert, committed before the connection dropped
            if restart and existing.config_hash == digest and existing.status not in ("running", "complete"):
                restarted = self._restart(study, study_id, existing, values)
                if restarted is not None:
                    return restarted
                continue  # someone else restarted it first: report their row
            raise self._duplicate(study, number, digest, existing)
        raise StorageError(
            f"cannot start trial {number} of {study!r}: it kept conflicting with changing rows"
        )

    def _restart(
        self, study: str, study_id: int, existing: TrialRecord, values: dict[str, Any]
    ) -> TrialRecord | None:
        """Reset an ended, not complete trial to ``running``; None if another process got it first."""
        cleared: dict[str, Any] = dict.fromkeys((*METRIC_COLUMNS, "ended_at"))
        fresh = {
            k: values[k] for k in ("number", "status", "measured", "reason", "host", "result", "started_at")
        }
        match = (TrialRow.study_id == study_id, TrialRow.config_hash == existing.config_hash)

        def reset(session: Session) -> TrialRecord | None:
            done = session.execute(
                update(TrialRow)
                .where(*match, TrialRow.status.not_in(("running", "complete")))
                .values(**cleared, **fresh)
            )
            if done.rowcount == 0:  # type: ignore[attr-defined]
                return None
            return trial_record(session.execute(_TRIALS.where(*match)).one(), study)

        # None also when ``number`` is taken by another trial (a unique violation): the caller's
        # next attempt then reports that trial as the duplicate.
        return self._write_unique(f"restart trial {existing.number} of {study!r}", reset)

    def finish_trial(
        self, study: str, number: int, result: dict[str, Any], *, ended_at: datetime | None = None
    ) -> TrialRecord:
        """Record the result of a ``running`` trial and return the finished trial.

        Idempotent for a retry with the same result. Raises StorageError if the trial was never
        started, and DuplicateTrial if it already finished with a different result.
        """
        study_id = self._study_id(study)
        columns = result_columns(result)
        columns.update(ended_at=ended_at or utcnow())
        match = (TrialRow.study_id == study_id, TrialRow.number == int(number))

        def finish(session: Session) -> TrialRecord | None:
            done = session.execute(
                update(TrialRow).where(*match, TrialRow.status == "running").values(**columns)
            )
            row = session.execute(_TRIALS.where(*match)).first()
            if row is None:
                return None
            record = trial_record(row, study)
            if done.rowcount == 0 and record.result != columns["result"]:  # type: ignore[attr-defined]
                raise self._duplicate(study, number, record.config_hash, record)
            return record

        record = self._write(f"finish trial {number} of {study!r}", finish)
        if record is None:
            raise StorageError(
                f"a trial must be started before it is finished: {study!r} has no trial {number}; "
                "call start_trial first or use add_trial"
            )
        return record

    def amend_trial(self, study: str, number: int, result: dict[str, Any]) -> TrialRecord:
        """Replace the result of finished trial ``number`` with a re-measurement of it; return it.

        The status must stay what it is (repeats refine a measurement, they do not re-run a
        trial); ``ended_at`` is kept. Raises StorageError when the trial does not exist, is still
        running, or the new result's status differs.
        """
        study_id = self._study_id(study)
        columns = result_columns(result)
        match = (TrialRow.study_id == study_id, TrialRow.number == int(number))

        def amend(session: Session) -> tuple[str | None, TrialRecord | None]:
            row = session.execute(_TRIALS.where(*match)).first()
            if row is None:
                return None, None
            before = trial_record(row, study)
            if before.status != columns["status"] or before.status == "running":
                return before.status, None
            session.execute(update(TrialRow).where(*match, TrialRow.status == before.status).values(**columns))
            return before.status, trial_record(session.execute(_TRIALS.where(*match)).one(), study)

        status, record = self._write(f"amend trial {number} of {study!r}", amend)
        if record is None:
            raise StorageError(
                f"only a finished trial's result can be amended, keeping its status: {study!r} trial {number} "
                + ("does not exist" if status is None else f"is {status}, the new result {columns['status']}")
                + "; store a new trial instead"
            )
        return record

    def mark_stale_running(
        self,
        study: str,
        *,
        older_than_s: float | None = None,
        host: str | None = None,
        reason: str = INTERRUPTED,
    ) -> list[TrialRecord]:
        """Mark the study's ``running`` trials as ``failed`` (with ``reason``) and return them.

        For resume: trials a killed tuner left ``running``. ``older_than_s`` keeps trials that
        started recently; ``host`` limits it to one machine's trials. Restart one with
        ``start_trial(..., restart=True)``.
        """
        study_id = self._study_id(study)
        conditions = [TrialRow.study_id == study_id, TrialRow.status == "running"]
        if older_than_s is not None:
            conditions.append(TrialRow.started_at < utcnow() - timedelta(seconds=older_than_s))
        if host is not None:
            conditions.append(TrialRow.host == host)

        def mark(session: Session) -> list[TrialRecord]:
            rows = list(session.execute(_TRIALS.where(*conditions).order_by(TrialRow.number)))
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
            fresh = session.execute(_TRIALS.where(TrialRow.id.in_(ids)).order_by(TrialRow.number))
            return [trial_record(r, study) for r in fresh]

        return self._write(f"mark stale trials of {study!r}", mark)

    # -- trials: reading -------------------------------------------------------------------

    def get_trial(self, study: str, number: int) -> TrialRecord | None:
        """Trial ``number`` of ``study``, or None."""
        return self._one_trial(study, TrialRow.number == int(number))

    def find_trial(self, study: str, config: dict[str, Any]) -> TrialRecord | None:
        """The trial of ``study`` that ran ``config`` (matched by its canonical hash), or None."""
        return self._one_trial(study, TrialRow.config_hash == config_hash(config))

    def _one_trial(self, study: str, condition: Any) -> TrialRecord | None:
        query = _TRIALS.where(TrialRow.study_id == self._study_id(study), condition)

        def find(session: Session) -> TrialRecord | None:
            row = session.execute(query).first()
            return None if row is None else trial_record(row, study)

        return self._read("read a trial", find)

    def trials(self, study: str, *, status: str | None = None) -> list[TrialRecord]:
        """The trials of ``study`` ordered by number, optionally only those with ``status``."""
        study_id = self._study_id(study)
        query = _TRIALS.where(TrialRow.study_id == study_id).order_by(TrialRow.number)
        if status is not None:
            query = query.where(TrialRow.status == status)
        return self._read("read trials", lambda s: [trial_record(r, study) for r in s.execute(query)])

    def count_trials(self, study: str) -> int:
        """How many trials ``study`` holds (any status)."""
        from sqlalchemy import func

        study_id = self._study_id(study)
        return self._read(
            "count trials",
            lambda s: int(
                s.scalar(select(func.count()).select_from(TrialRow).where(TrialRow.study_id == study_id)) or 0
            ),
        )

    def best(
        self,
        model: str,
        gpus: int,
        gpu_type: str | None = None,
        *,
        metric: str = "samples_per_s",
        measured_only: bool = False,
        min_headroom_bytes: int | None = None,
        min_headroom_fraction: float | None = None,
        limit: int = 1,
    ) -> list[TrialRecord]:
        """The best complete trials for a model on ``gpus`` devices, across studies, best first.

        ``model`` matches a study's model signature or its model name (preset); ``gpu_type``
        None matches any device type. ``measured_only`` drops estimates. A headroom filter keeps
        trials whose peak memory leaves at least that many bytes (or that fraction) of the
        device's memory free, and drops trials with unknown memory. Empty list when none match.
        """
        check_metric(metric)
        if limit < 1:
            raise StorageError(f"limit must be at least 1: got {limit}")
        if min_headroom_fraction is not None and not 0 <= min_headroom_fraction < 1:
            raise StorageError(f"min_headroom_fraction must be in [0, 1): got {min_headroom_fraction}")
        value = getattr(TrialRow, metric)
        studies = select(StudyRow.id, StudyRow.name, StudyRow.gpu_memory_bytes).where(
            or_(StudyRow.model_signature == model, StudyRow.model_name == model), StudyRow.gpus == int(gpus)
        )
        if gpu_type is not None:
            studies = studies.where(StudyRow.gpu_type == gpu_type)

        def query(session: Session) -> list[TrialRecord]:
            # One small indexed top-k query per matching study, merged here: each walks the
            # (study_id, status, metric) index from the top instead of sorting every trial.
            found: list[tuple[float, int, int, TrialRecord]] = []
            for study_id, name, memory in session.execute(studies.order_by(StudyRow.id)):
                top = _TRIALS.where(
                    TrialRow.study_id == study_id, TrialRow.status == "complete", value.is_not(None)
                )
                if measured_only:
                    top = top.where(TrialRow.measured.is_(True))
                bounds = []
                if min_headroom_bytes is not None and memory is not None:
                    bounds.append(memory - int(min_headroom_bytes))
                if min_headroom_fraction is not None and memory is not None:
                    bounds.append(int(memory * (1.0 - float(min_headroom_fraction))))
                if (min_headroom_bytes is not None or min_headroom_fraction is not None) and memory is None:
                    continue  # unknown device memory: no headroom can be shown
                if bounds:
                    top = top.where(TrialRow.peak_memory_bytes <= min(bounds))
                for row in session.execute(top.order_by(value.desc(), TrialRow.number).limit(limit)):
                    record = trial_record(row, name)
                    found.append((-getattr(record, metric), study_id, record.number, record))
            found.sort(key=lambda item: item[:3])
            return [item[3] for item in found[:limit]]

        return self._read("find the best schedule", query)

    def history(self, study: str, *, metric: str | None = None) -> list[HistoryPoint]:
        """The study's trials in order, each with its value and the best complete value so far.

        ``metric`` defaults to the study's objective (or ``samples_per_s`` if that is not a metric).
        """
        if metric is None:
            objective = self.get_study(study).objective
            metric = objective if objective in RANK_METRICS else "samples_per_s"
        check_metric(metric)
        points: list[HistoryPoint] = []
        best: float | None = None
        for trial in self.trials(study):
            value = getattr(trial, metric)
            if trial.status == "complete" and value is not None and (best is None or value > best):
                best = value
            points.append(
                HistoryPoint(
                    trial.number, trial.status, value, best, trial.measured, trial.started_at, trial.ended_at
                )
            )
        return points

    def to_dataframe(self, study: str) -> pd.DataFrame:
        """The study's trials as a DataFrame: metric columns, then ``config.<knob>`` columns."""
        return trials_frame(self.trials(study))

    def export(self, study: str, path: str | Path) -> Path:
        """Write the study's trials to ``path`` (``.csv`` or ``.parquet``) and return the path."""
        return export_frame(self.to_dataframe(study), path)

    # -- optuna ----------------------------------------------------------------------------

    def optuna_storage(
        self, *, heartbeat_interval: int | None = 60, grace_period: int | None = None
    ) -> optuna.storages.RDBStorage:
        """An Optuna RDB storage on this database, so ``optuna-dashboard URL`` shows the search.

        With ``heartbeat_interval`` (seconds) Optuna fails trials whose process stopped beating.
        Raises StorageError for an in-memory SQLite store (Optuna would see another database).
        """
        import warnings

        import optuna

        if self.backend == "sqlite" and sqlite_path(self._url) is None:
            raise StorageError(
                "an Optuna study needs a file or server database: got in-memory SQLite; use sqlite:///file.db"
            )
        engine_kwargs: dict[str, Any] = {}
        if self.backend == "sqlite":
            engine_kwargs["connect_args"] = {"timeout": _engine.BUSY_TIMEOUT_S}
        else:
            engine_kwargs["pool_pre_ping"] = True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    self._url.render_as_string(hide_password=False),
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                )
        except (SQLAlchemyError, RuntimeError) as err:
            raise _engine.storage_error(err, what="open Optuna's storage", url=self._url) from None
