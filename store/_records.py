"""Plain values the store hands out: frozen dataclasses, never ORM objects.

Nothing here imports SQLAlchemy, so callers may build and compare records without a database.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoslapo.config import config_hash as knob_hash
from autoslapo.errors import StorageError

#: Every status a trial row can hold; ``running`` is written when a trial starts.
TRIAL_STATUSES: tuple[str, ...] = ("running", "complete", "oom", "failed", "timeout", "pruned")
#: Statuses a finished trial may end in.
FINISHED_STATUSES: tuple[str, ...] = TRIAL_STATUSES[1:]
#: Statuses a study row may hold.
STUDY_STATUSES: tuple[str, ...] = ("created", "running", "complete", "stopped", "failed")
#: Trial metrics that ``best()`` and ``history()`` may rank by (all: higher is better).
RANK_METRICS: tuple[str, ...] = ("samples_per_s", "tokens_per_s", "tflops_per_device", "hw_tflops_per_device")


class DuplicateTrial(StorageError):
    """A trial with this number or this configuration already exists in the study.

    ``existing`` is the row already stored, so a caller can decide whether it is its own retry.
    """

    def __init__(self, message: str, existing: TrialRecord) -> None:
        super().__init__(message)
        self.existing = existing

    def __reduce__(self) -> tuple[type[DuplicateTrial], tuple[str, TrialRecord]]:
        # Default exception pickling passes only ``args``; Ray and multiprocessing need both.
        return (DuplicateTrial, (str(self), self.existing))


def clean_json(value: Any) -> Any:
    """Return ``value`` with tuples as lists and NaN/inf floats as ``None`` (strict JSON).

    PostgreSQL rejects NaN in JSON, and SQLite turns it into NULL in REAL columns; storing
    ``None`` everywhere keeps both backends identical.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Serialise ``value`` as canonical JSON: sorted keys, no spaces, NaN refused.

    Raises StorageError when ``value`` holds something JSON cannot carry.
    """
    try:
        return json.dumps(clean_json(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as err:
        raise StorageError(
            f"configs and results must be JSON values (dict, list, str, number, bool, None): {err}; "
            "convert them with to_dict() first"
        ) from None


def config_hash(config: dict[str, Any]) -> str:
    """Return the duplicate-trial key of ``config``: ``autoslapo.config.config_hash`` of its JSON form,
    the one digest the tuner uses too (StorageError for what JSON cannot carry)."""
    return knob_hash(json.loads(canonical_json(config)))


@dataclass(frozen=True)
class StudyRecord:
    """One study: what was tuned, on what, how, and with which software."""

    name: str
    model_name: str
    model_family: str
    model: dict[str, Any]
    model_signature: str
    cluster: dict[str, Any]
    cluster_fingerprint: str
    gpus: int
    gpu_type: str
    gpu_memory_bytes: int | None
    space_name: str
    space_version: str
    objective: str
    backend: str
    status: str
    created_at: datetime
    updated_at: datetime
    software: dict[str, Any] = field(default_factory=dict)
    #: The trials the study was asked to run (``Store.raise_budget``: set by tune and the service, raised
    #: by a resume or join with more, never lowered); None for a study stored before revision 0005.
    budget: int | None = None


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a study: its configuration and what running or estimating it gave.

    Metrics are ``None`` when the trial did not produce them (a failed, OOM or running trial).
    ``result`` is the full result dict as given, so keys without a column survive.
    """

    study: str
    number: int
    config: dict[str, Any]
    config_hash: str
    status: str
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_device: float | None = None
    hw_tflops_per_device: float | None = None
    peak_memory_bytes: int | None = None
    step_time_s: float | None = None
    step_time_spread_s: float | None = None
    final_loss: float | None = None
    measured: bool = False
    reason: str = ""
    host: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """True once the trial left ``running``."""
        return self.status != "running"


@dataclass(frozen=True)
class StudySummary:
    """A study at a glance: its record, how many trials it holds by status, and its best complete
    trial by samples/s (None before one completes)."""

    study: StudyRecord
    counts: dict[str, int]
    best: TrialRecord | None


@dataclass(frozen=True)
class HistoryPoint:
    """One step of a study's history: a trial's value and the best value up to it."""

    number: int
    status: str
    value: float | None
    best_so_far: float | None
    measured: bool
    started_at: datetime | None
    ended_at: datetime | None


def check_trial_status(status: str, *, allowed: tuple[str, ...] = TRIAL_STATUSES) -> str:
    """Return ``status`` if it is one of ``allowed``; raise StorageError naming the valid ones."""
    if status not in allowed:
        raise StorageError(f"trial status must be one of {', '.join(allowed)}: got {status!r}")
    return status


def check_metric(metric: str) -> str:
    """Return ``metric`` if trials can be ranked by it; raise StorageError naming the valid ones."""
    if metric not in RANK_METRICS:
        raise StorageError(f"metric must be one of {', '.join(RANK_METRICS)}: got {metric!r}")
    return metric
