"""``open_store`` and ``Store``: studies and trials in SQLite or PostgreSQL.

Every public method runs one short transaction of its own (retried on lock, serialization and
dropped-connection errors) and returns frozen records, never ORM objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from autoslapo.storage import BASELINES_SUFFIX
from store import _budget, _calibrations, _engine, _migrate, _open, _queries, _trials
from store._convert import study_record, study_row
from store._frames import export_frame, trials_frame
from store._jobs import JobQueue
from store._records import (
    RANK_METRICS,
    STUDY_STATUSES,
    HistoryPoint,
    StudyRecord,
    StudySummary,
    TrialRecord,
    check_metric,
    config_hash,
)
from store._schema import StudyRow, TrialRow, utcnow
from store._tokens import TokenTable
from store._trials import INTERRUPTED
from store._url import display, sqlite_path

if TYPE_CHECKING:
    import optuna
    import pandas as pd


def open_store(url: str | None = None, *, read_only: bool = False) -> Store:
    """Open (creating or upgrading as needed) the store at ``url``.

    ``url`` None -> $AUTOSLAPO_STORAGE -> ``sqlite:///autoslapo.db`` in the working directory.
    Raises StorageError, leaving the target as it was, for a malformed URL, an unreachable
    server, a file that is not a SQLite database, a damaged database, a SQLite database that
    holds other tables and none of autoslapo's, a SQLite file in a directory SQLite cannot write
    to, or a schema revision written by a newer autoslapo.

    ``read_only`` (for commands that only read): never creates a database or autoslapo's tables
    (a database without them is refused), leaves a store at the head revision unwritten, and reads
    a SQLite store in a read-only directory through an immutable open (refused when its ``-wal``
    file holds commits).
    """
    engine, parsed = _open.open_engine(url, read_only=read_only)
    return Store(engine, parsed)


class Store(_budget.StudyBudgets):
    """Studies and their trials in one SQL database, shared with Optuna's own tables.

    Build it with ``open_store``; close it (or use it as a context manager) when done.
    """

    def __init__(self, engine: Engine, url: URL) -> None:
        self._engine = engine
        self._tx = _engine.Transactions(engine, url)
        self._url = url
        self._study_ids: dict[str, int] = {}
        #: The service's queued study jobs (``submit``, ``claim``, ``heartbeat``, ``finish``, ``cancel``).
        self.jobs = JobQueue(self._tx)
        #: The service's API tokens, as argon2 hashes (``add``, ``by_key``, ``list``, ``revoke``).
        self.tokens = TokenTable(self._tx)

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL with any password replaced by ``***`` (safe to print)."""
        return display(self._url)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._url.get_backend_name()

    @property
    def in_memory(self) -> bool:
        """True for an in-memory SQLite database: one connection, seen by this process only."""
        return self.backend == "sqlite" and sqlite_path(self._url) is None

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
        return self._tx.read("read the schema revision", lambda s: _migrate.current_revision(s.connection()))

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
        values = study_row(
            name,
            model=model,
            cluster=cluster,
            space_name=space_name,
            space_version=space_version,
            objective=objective,
            backend=backend,
            model_signature=model_signature,
            cluster_fingerprint=cluster_fingerprint,
        )

        def insert(session: Session) -> StudyRecord:
            row = StudyRow(**values)
            session.add(row)
            session.flush()
            return study_record(row)

        created = self._tx.write_unique(f"create study {name!r}", insert)
        if created is not None:
            return created
        existing = self.get_study(name)
        same = (existing.model_signature, existing.cluster_fingerprint) == (model_signature, cluster_fingerprint)
        if exist_ok and same:
            return existing
        why = "for a different model or cluster" if not same else "already"
        raise StorageError(
            f"study names must be unique: {name!r} exists {why} (model {existing.model_name}, "
            f"{existing.gpus}x {existing.gpu_type}); pick another name or resume that study"
        )

    def has_study(self, name: str) -> bool:
        """True if a study called ``name`` exists."""
        return self._tx.read("look up a study",
                             lambda s: s.scalar(select(StudyRow.id).where(StudyRow.name == name)) is not None)

    def get_study(self, name: str) -> StudyRecord:
        """The study called ``name``; raises StorageError (listing some names) if there is none."""
        row = self._tx.read(
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
        return self._tx.read(
            "list studies",
            lambda s: [study_record(r) for r in s.scalars(select(StudyRow).order_by(StudyRow.id))],
        )

    def study_summaries(self) -> list[StudySummary]:
        """Every study, oldest first, with its trial counts by status and its best complete trial
        by samples/s: what a list of studies shows, in three queries however many studies there are."""
        return _queries.study_summaries(self._tx)

    def set_study_status(self, name: str, status: str, *, only_from: str | None = None) -> StudyRecord:
        """Set a study's status (one of ``STUDY_STATUSES``) and its ``updated_at``; with ``only_from``
        only if it is in that status (``("running", only_from="running")``: the tuner's heartbeat)."""
        if status not in STUDY_STATUSES:
            raise StorageError(f"study status must be one of {', '.join(STUDY_STATUSES)}: got {status!r}")
        study_id = self._study_id(name)
        where = [StudyRow.id == study_id] + ([StudyRow.status == only_from] if only_from else [])
        self._tx.write(
            "update a study",
            lambda s: s.execute(update(StudyRow).where(*where).values(status=status, updated_at=utcnow())),
        )
        return self.get_study(name)

    def delete_study(self, name: str) -> None:
        """Delete a study and all its trials (Optuna's study of that name is not touched)."""
        study_id = self._study_id(name)

        def drop(session: Session) -> None:
            session.execute(delete(TrialRow).where(TrialRow.study_id == study_id))
            session.execute(delete(StudyRow).where(StudyRow.id == study_id))

        self._tx.write("delete a study", drop)
        self._study_ids.pop(name, None)

    def _no_study(self, name: str) -> StorageError:
        # the tuner's companion studies of baselines are not names to tune, resume or show by hand
        import difflib

        names = [r.name for r in self.list_studies() if not r.name.endswith(BASELINES_SUFFIX)]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        if close:
            return StorageError(f"no study named {name!r} in {self.url}: did you mean {', '.join(close)}? "
                                "(`autoslapo studies` lists them all)")
        known = ", ".join(names[-10:]) if names else "none yet"
        more = f" ({len(names)} in all; the 10 newest: `autoslapo studies` lists them all)" if len(names) > 10 else ""
        return StorageError(f"no study named {name!r} in {self.url}: known studies are {known}{more}; check the name")

    def _study_id(self, name: str) -> int:
        cached = self._study_ids.get(name)
        if cached is not None:
            return cached
        found = self._tx.read(
            "look up a study", lambda s: s.scalar(select(StudyRow.id).where(StudyRow.name == name))
        )
        if found is None:
            raise self._no_study(name)
        self._study_ids[name] = found
        return found

    # -- trials: writing (the machinery is in store._trials) ---------------------------------

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
        return _trials.add_trial(
            self._tx,
            study,
            self._study_id(study),
            number,
            config,
            result,
            started_at=started_at,
            ended_at=ended_at,
        )

    def add_trials(self, study: str, trials: Iterable[tuple[int, dict[str, Any], dict[str, Any]]]) -> int:
        """Store many finished ``(number, config, result)`` trials in one transaction; return the count.

        All or nothing: a duplicate anywhere raises StorageError and stores none of them.
        """
        return _trials.add_trials(self._tx, study, self._study_id(study), trials)

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
        return _trials.claim_trial(
            self._tx, study, self._study_id(study), config, budget=budget, result=result, host=host
        )

    def add_new_trials(self, study: str, trials: Iterable[tuple[dict[str, Any], dict[str, Any]]], *,
                       times: Sequence[tuple[datetime, datetime] | None] = ()) -> int:
        """Store finished ``(config, result)`` trials under the next free numbers; return how many.

        Configs the study already has are skipped (another tuner stored them first). One transaction
        under the study's lock, like ``claim_trial``. ``times``: each trial's (start, end), by position
        (missing or None: now, for both)."""
        return _trials.add_new_trials(self._tx, study, self._study_id(study), trials, times)

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
        return _trials.start_trial(
            self._tx,
            study,
            self._study_id(study),
            number,
            config,
            host=host,
            restart=restart,
            started_at=started_at,
        )

    def finish_trial(
        self, study: str, number: int, result: dict[str, Any], *, ended_at: datetime | None = None
    ) -> TrialRecord:
        """Record the result of a ``running`` trial and return the finished trial.

        Idempotent for a retry with the same result. Raises StorageError if the trial was never
        started, and DuplicateTrial if it already finished with a different result.
        """
        return _trials.finish_trial(self._tx, study, self._study_id(study), number, result, ended_at=ended_at)

    def amend_trial(self, study: str, number: int, result: dict[str, Any]) -> TrialRecord:
        """Replace the result of finished trial ``number`` with a re-measurement of it; return it.

        The status must stay what it is (repeats refine a measurement, they do not re-run a
        trial); ``ended_at`` is kept. Raises StorageError when the trial does not exist, is still
        running, or the new result's status differs.
        """
        return _trials.amend_trial(self._tx, study, self._study_id(study), number, result)

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
        return _trials.mark_stale_running(
            self._tx, study, self._study_id(study), older_than_s=older_than_s, host=host, reason=reason
        )

    # -- trials: reading (the queries are in store._queries) ---------------------------------

    def get_trial(self, study: str, number: int) -> TrialRecord | None:
        """Trial ``number`` of ``study``, or None."""
        return _queries.one_trial(self._tx, study, self._study_id(study), TrialRow.number == int(number))

    def find_trial(self, study: str, config: dict[str, Any]) -> TrialRecord | None:
        """The trial of ``study`` that ran ``config`` (matched by its canonical hash), or None."""
        digest = config_hash(config)
        return _queries.one_trial(self._tx, study, self._study_id(study), TrialRow.config_hash == digest)

    def trials(self, study: str, *, status: str | None = None) -> list[TrialRecord]:
        """The trials of ``study`` ordered by number, optionally only those with ``status``."""
        return _queries.trials(self._tx, study, self._study_id(study), status=status)

    def count_trials(self, study: str) -> int:
        """How many trials ``study`` holds (any status)."""
        return _queries.count_trials(self._tx, self._study_id(study))

    def best_trials(
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
        links: Mapping[str, float] | None = None,
        gpus_per_node: int | None = None,
    ) -> list[TrialRecord]:
        """The best complete trials for a model on ``gpus`` devices, across studies, best first.

        ``model`` matches a study's model signature or its model name (preset); ``gpu_type``
        None matches any device type. ``measured_only`` drops estimates. A headroom filter keeps
        trials whose peak memory leaves at least that many bytes (or that fraction) of the
        device's memory free, and drops trials with unknown memory. ``links`` (e.g.
        ``{"inter_node_gbps": 6.25}``) keeps studies whose cluster has those link bandwidths, and
        ``gpus_per_node`` those whose nodes hold that many devices (None: any). Empty list when none match.
        """
        return _queries.best_trials(
            self._tx,
            model,
            gpus,
            gpu_type,
            metric=metric,
            measured_only=measured_only,
            min_headroom_bytes=min_headroom_bytes,
            min_headroom_fraction=min_headroom_fraction,
            limit=limit,
            links=links,
            gpus_per_node=gpus_per_node,
        )

    def history(self, study: str, *, metric: str | None = None) -> list[HistoryPoint]:
        """The study's trials in order, each with its value and the best complete value so far.

        ``metric`` defaults to the study's objective (or ``samples_per_s`` if that is not a metric).
        """
        if metric is None:
            objective = self.get_study(study).objective
            metric = objective if objective in RANK_METRICS else "samples_per_s"
        return _queries.history_points(self.trials(study), check_metric(metric))

    def to_dataframe(self, study: str) -> pd.DataFrame:
        """The study's trials as a DataFrame: metric columns, then ``config.<knob>`` columns."""
        return trials_frame(self.trials(study))

    def export(self, study: str, path: str | Path) -> Path:
        """Write the study's trials to ``path`` (``.csv`` or ``.parquet``) and return the path."""
        return export_frame(self.to_dataframe(study), path)

    # -- optuna ----------------------------------------------------------------------------

    # -- calibrations (the cost model's per-cluster correction; see store._calibrations) ------

    def save_calibration(self, fingerprint: str, params: dict[str, Any], n_trials: int) -> None:
        """Store (or replace) the cost-model calibration of the cluster ``fingerprint``.

        ``params``: the correction's factors as JSON-safe values; ``n_trials``: how many measured
        trials it was fitted to. Raises StorageError for an empty fingerprint, non-finite factors
        or a negative count.
        """
        _calibrations.save(self._tx, fingerprint, params, n_trials)

    def calibration(self, fingerprint: str) -> dict[str, Any] | None:
        """The calibration of cluster ``fingerprint``: ``{"params", "n_trials", "updated_at"}``, or None."""
        return _calibrations.load(self._tx, fingerprint)

    def optuna_storage(
        self, *, heartbeat_interval: int | None = 60, grace_period: int | None = None
    ) -> optuna.storages.RDBStorage:
        """An Optuna RDB storage on this database, so ``optuna-dashboard URL`` shows the search.

        With ``heartbeat_interval`` (seconds) Optuna fails trials whose process stopped beating.
        Raises StorageError for an in-memory SQLite store (Optuna would see another database).
        """
        return _engine.optuna_storage(
            self._url, heartbeat_interval=heartbeat_interval, grace_period=grace_period
        )
