"""Between plain dicts/records and rows: result dicts to column values, ORM rows to records."""

from __future__ import annotations

import math
import platform
from importlib import metadata
from typing import Any

from autoslapo.errors import StorageError
from store._records import FINISHED_STATUSES, StudyRecord, TrialRecord, check_trial_status, clean_json
from store._schema import StudyRow

_FLOAT_METRICS = (
    "samples_per_s",
    "tokens_per_s",
    "tflops_per_device",
    "hw_tflops_per_device",
    "step_time_s",
    "step_time_spread_s",
    "final_loss",
)
#: Every per-trial metric column (what a restarted trial clears).
METRIC_COLUMNS: tuple[str, ...] = (*_FLOAT_METRICS, "peak_memory_bytes")
_SOFTWARE = ("autoslapo", "torch", "optuna", "sqlalchemy", "alembic", "transformers", "deepspeed", "ray")


def _number(key: str, value: Any, kind: type) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value)  # numpy scalars, Decimal, numeric strings
        except (TypeError, ValueError):
            raise StorageError(
                f"result[{key!r}] must be a number or None: got {value!r}; fix the evaluator's TrialResult"
            ) from None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return kind(value)


def result_columns(result: dict[str, Any]) -> dict[str, Any]:
    """Column values for a finished trial from its result dict (``TrialResult.to_dict()``).

    Raises StorageError for an unknown status or a metric that is not a number.
    """
    if not isinstance(result, dict):
        raise StorageError(
            f"a trial result must be a dict (TrialResult.to_dict()): got {type(result).__name__}"
        )
    status = check_trial_status(str(result.get("status", "complete")), allowed=FINISHED_STATUSES)
    columns: dict[str, Any] = {key: _number(key, result.get(key), float) for key in _FLOAT_METRICS}
    columns.update(
        status=status,
        peak_memory_bytes=_number("peak_memory_bytes", result.get("peak_memory_bytes"), int),
        measured=bool(result.get("measured", False)),
        reason=str(result.get("reason") or ""),
        result=clean_json(result),
    )
    host = result.get("host")
    if host:
        columns["host"] = str(host)
    return columns


def software_versions() -> dict[str, str]:
    """Versions of Python and the libraries a trial's numbers depend on (without importing them)."""
    versions = {"python": platform.python_version()}
    for name in _SOFTWARE:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def study_row(
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
) -> dict[str, Any]:
    """Column values of a new study row (``Store.create_study`` says what the arguments are).

    Raises StorageError for a name of the wrong length or a cluster without a positive ``gpus``.
    """
    if not name or len(name) > 200:
        raise StorageError(f"a study name must have 1 to 200 characters: got {name!r}")
    if not isinstance(cluster.get("gpus"), int) or cluster["gpus"] < 1:
        raise StorageError(f"cluster['gpus'] must be a positive int: got {cluster.get('gpus')!r}")
    memory = cluster.get("memory_bytes")
    return dict(
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


def study_record(row: StudyRow) -> StudyRecord:
    """A frozen record of a study row (detached copies of its JSON)."""
    return StudyRecord(
        name=row.name,
        model_name=row.model_name,
        model_family=row.model_family,
        model=dict(row.model),
        model_signature=row.model_signature,
        cluster=dict(row.cluster),
        cluster_fingerprint=row.cluster_fingerprint,
        gpus=row.gpus,
        gpu_type=row.gpu_type,
        gpu_memory_bytes=row.gpu_memory_bytes,
        space_name=row.space_name,
        space_version=row.space_version,
        objective=row.objective,
        backend=row.backend,
        status=row.status,
        created_at=row.created_at,
        updated_at=row.updated_at,
        software=dict(row.software or {}),
        budget=row.budget,
    )


def trial_record(row: Any, study: str) -> TrialRecord:
    """A frozen record of a trial row of ``study`` (an ORM ``TrialRow`` or a Core row of its table)."""
    return TrialRecord(
        study=study,
        number=row.number,
        config=dict(row.config),
        config_hash=row.config_hash,
        status=row.status,
        samples_per_s=row.samples_per_s,
        tokens_per_s=row.tokens_per_s,
        tflops_per_device=row.tflops_per_device,
        hw_tflops_per_device=row.hw_tflops_per_device,
        peak_memory_bytes=row.peak_memory_bytes,
        step_time_s=row.step_time_s,
        step_time_spread_s=row.step_time_spread_s,
        final_loss=row.final_loss,
        measured=bool(row.measured),
        reason=row.reason or "",
        host=row.host or "",
        started_at=row.started_at,
        ended_at=row.ended_at,
        result=dict(row.result or {}),
    )
