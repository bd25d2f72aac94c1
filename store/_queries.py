"""Reading trials: one trial, a study's trials, the best across studies, a study's history, summaries.

``Store`` keeps the public methods and their contracts; these functions run the queries, each in
one read transaction. ``study`` is the study's name (records carry it), ``study_id`` its row id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, literal, or_, select
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store._convert import study_record, trial_record
from store._engine import Transactions
from store._records import HistoryPoint, StudySummary, TrialRecord, check_metric
from store._schema import TRIALS, StudyRow, TrialRow


def one_trial(tx: Transactions, study: str, study_id: int, condition: Any) -> TrialRecord | None:
    """The trial of the study matching ``condition`` (a SQL expression on ``TrialRow``), or None."""
    query = TRIALS.where(TrialRow.study_id == study_id, condition)

    def find(session: Session) -> TrialRecord | None:
        row = session.execute(query).first()
        return None if row is None else trial_record(row, study)

    return tx.read("read a trial", find)


def trials(tx: Transactions, study: str, study_id: int, *, status: str | None) -> list[TrialRecord]:
    """``Store.trials``: the study's trials by number, optionally only those with ``status``."""
    query = TRIALS.where(TrialRow.study_id == study_id).order_by(TrialRow.number)
    if status is not None:
        query = query.where(TrialRow.status == status)
    return tx.read("read trials", lambda s: [trial_record(r, study) for r in s.execute(query)])


def count_trials(tx: Transactions, study_id: int) -> int:
    """``Store.count_trials``: how many trials the study holds (any status)."""
    query = select(func.count()).select_from(TrialRow).where(TrialRow.study_id == study_id)
    return tx.read("count trials", lambda s: int(s.scalar(query) or 0))


def best_trials(
    tx: Transactions,
    model: str,
    gpus: int,
    gpu_type: str | None,
    *,
    metric: str,
    measured_only: bool,
    min_headroom_bytes: int | None,
    min_headroom_fraction: float | None,
    limit: int,
    links: Mapping[str, float] | None = None,
    gpus_per_node: int | None = None,
) -> list[TrialRecord]:
    """``Store.best``: the best complete trials across matching studies, best first.

    Raises StorageError for an unknown metric, a limit below 1, or a headroom fraction outside [0, 1).
    """
    check_metric(metric)
    if limit < 1:
        raise StorageError(f"limit must be at least 1: got {limit}")
    if min_headroom_fraction is not None and not 0 <= min_headroom_fraction < 1:
        raise StorageError(f"min_headroom_fraction must be in [0, 1): got {min_headroom_fraction}")
    value = getattr(TrialRow, metric)
    # the cluster's JSON is read only when links or a node size are asked for (the hot path reads three columns)
    by_cluster = {**(links or {}), **({"gpus_per_node": gpus_per_node} if gpus_per_node is not None else {})}
    cluster_column = StudyRow.cluster if by_cluster else literal(None)
    studies = select(StudyRow.id, StudyRow.name, StudyRow.gpu_memory_bytes, cluster_column).where(
        or_(StudyRow.model_signature == model, StudyRow.model_name == model), StudyRow.gpus == int(gpus)
    )
    if gpu_type is not None:
        studies = studies.where(StudyRow.gpu_type == gpu_type)
    headroom = min_headroom_bytes is not None or min_headroom_fraction is not None

    def query(session: Session) -> list[TrialRecord]:
        # One small indexed top-k query per matching study, merged here: each walks the
        # (study_id, status, metric) index from the top instead of sorting every trial.
        found: list[tuple[float, int, int, TrialRecord]] = []
        for study_id, name, memory, cluster in session.execute(studies.order_by(StudyRow.id)):
            if headroom and memory is None:
                continue  # unknown device memory: no headroom can be shown
            if by_cluster and any(float((cluster or {}).get(k) or 0.0) != float(v) for k, v in by_cluster.items()):
                continue  # a cluster with other links (another network) or another node size
            top = TRIALS.where(
                TrialRow.study_id == study_id, TrialRow.status == "complete", value.is_not(None)
            )
            if measured_only:
                top = top.where(TrialRow.measured.is_(True))
            bounds = []
            if min_headroom_bytes is not None and memory is not None:
                bounds.append(memory - int(min_headroom_bytes))
            if min_headroom_fraction is not None and memory is not None:
                bounds.append(int(memory * (1.0 - float(min_headroom_fraction))))
            if bounds:
                top = top.where(TrialRow.peak_memory_bytes <= min(bounds))
            for row in session.execute(top.order_by(value.desc(), TrialRow.number).limit(limit)):
                record = trial_record(row, name)
                found.append((-getattr(record, metric), study_id, record.number, record))
        found.sort(key=lambda item: item[:3])
        return [item[3] for item in found[:limit]]

    return tx.read("find the best schedule", query)


def history_points(trials: Sequence[TrialRecord], metric: str) -> list[HistoryPoint]:
    """``Store.history``: each trial with its ``metric`` value and the best complete value so far."""
    points: list[HistoryPoint] = []
    best: float | None = None
    for trial in trials:
        value = getattr(trial, metric)
        if trial.status == "complete" and value is not None and (best is None or value > best):
            best = value
        points.append(
            HistoryPoint(
                trial.number, trial.status, value, best, trial.measured, trial.started_at, trial.ended_at
            )
        )
    return points


def study_summaries(tx: Transactions) -> list[StudySummary]:
    """``Store.study_summaries``: every study, oldest first, with its trial counts and best trial.

    Three queries whatever the number of studies (the service lists them all on every page load):
    the studies, the counts grouped by study and status, and each study's top complete trial by
    samples/s (lowest number among equals), read through the (study, status, samples/s) index.
    """
    top = (
        select(TrialRow.study_id, func.max(TrialRow.samples_per_s).label("top"))
        .where(TrialRow.status == "complete", TrialRow.samples_per_s > 0)
        .group_by(TrialRow.study_id)
        .subquery()
    )
    best = TRIALS.join(top, (TrialRow.study_id == top.c.study_id) & (TrialRow.samples_per_s == top.c.top)).where(
        TrialRow.status == "complete"
    ).order_by(TrialRow.study_id, TrialRow.number)
    counts = select(TrialRow.study_id, TrialRow.status, func.count()).group_by(TrialRow.study_id, TrialRow.status)

    def query(session: Session) -> list[StudySummary]:
        studies = [(row.id, study_record(row)) for row in session.scalars(select(StudyRow).order_by(StudyRow.id))]
        tally: dict[int, dict[str, int]] = {}
        for study_id, status, n in session.execute(counts):
            tally.setdefault(study_id, {})[status] = int(n)
        names = dict((study_id, study.name) for study_id, study in studies)
        tops: dict[int, TrialRecord] = {}
        for row in session.execute(best):
            if row.study_id in names and row.study_id not in tops:
                tops[row.study_id] = trial_record(row, names[row.study_id])
        return [StudySummary(study, tally.get(study_id, {}), tops.get(study_id)) for study_id, study in studies]

    return tx.read("summarise studies", query)
