"""Trials as a pandas DataFrame, and its export to CSV or Parquet (pandas imported only here)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoslapo.errors import StorageError
from store._records import TrialRecord

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = (
    "study",
    "number",
    "status",
    "samples_per_s",
    "tokens_per_s",
    "tflops_per_device",
    "hw_tflops_per_device",
    "peak_memory_bytes",
    "step_time_s",
    "step_time_spread_s",
    "final_loss",
    "measured",
    "reason",
    "host",
    "started_at",
    "ended_at",
    "duration_s",
    "config_hash",
)
SUFFIXES = (".csv", ".parquet")


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}", sub, out)
    else:
        out[prefix] = value


def trials_frame(trials: Sequence[TrialRecord]) -> pd.DataFrame:
    """One row per trial: the metric columns, then the config flattened as ``config.<knob>``."""
    import pandas as pd

    rows = []
    for trial in trials:
        row: dict[str, Any] = {name: getattr(trial, name, None) for name in COLUMNS if name != "duration_s"}
        if trial.started_at is not None and trial.ended_at is not None:
            row["duration_s"] = (trial.ended_at - trial.started_at).total_seconds()
        else:
            row["duration_s"] = None
        _flatten("config", trial.config, row)
        # Re-measurements (tuner/repeats.py) live in the result's extra: every sample, their
        # spread, and the speed-up intervals of a best or baseline trial.
        extra = trial.result.get("extra") or {}
        row["repeats_samples_per_s"] = extra.get("repeats_samples_per_s")
        row["samples_per_s_spread"] = extra.get("samples_per_s_spread")
        # The prior's prediction a real trial was proposed with, beside what it measured.
        row["predicted_samples_per_s"] = extra.get("predicted_samples_per_s")
        row["predicted_memory_bytes"] = extra.get("predicted_memory_bytes")
        if isinstance(extra.get("speedup_ci95"), dict):
            _flatten("speedup_ci95", extra["speedup_ci95"], row)
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    # pandas makes an integer column with gaps floats, and a boolean one with gaps objects: the types
    # the trials held, for the file formats that keep them (``export_frame``)
    frame.attrs["nullable"] = {name: kind for name in frame.columns
                               if (kind := _nullable_kind([row.get(name) for row in rows]))}
    return frame


def _nullable_kind(values: list[Any]) -> str | None:
    present = [v for v in values if v is not None]
    if len(present) == len(values) or not present:
        return None
    if all(isinstance(v, bool) for v in present):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "Int64"
    return None


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in value)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the integer and boolean columns that have gaps as pandas' nullable types."""
    frame = frame.copy()
    for name, kind in frame.attrs.get("nullable", {}).items():
        if name in frame.columns:
            frame[name] = frame[name].astype(kind)
    return frame


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    # A knob that is an int in one trial and a string in another cannot be one Arrow column; such
    # columns (and lists of anything but numbers) are written as JSON text instead of failing the export.
    frame = _typed(frame)
    for name in frame.columns:
        if frame[name].dtype != object:
            continue
        present = [v for v in frame[name] if not _missing(v)]
        kinds = {type(v) for v in present}
        if kinds == {list} and all(_numbers(v) for v in present):
            frame[name] = [None if _missing(v) else [float(x) for x in v] for v in frame[name]]
        elif len(kinds) > 1 or kinds & {list, dict}:
            frame[name] = [None if _missing(v) else json.dumps(v, sort_keys=True) for v in frame[name]]
    return frame


def export_frame(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write ``frame`` to ``path`` as CSV or Parquet, chosen by the suffix; return the path.

    Raises StorageError for another suffix or a directory that does not exist.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in SUFFIXES:
        raise StorageError(f"export path must end in {' or '.join(SUFFIXES)}: got {str(target)!r}; rename it")
    if not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not"
        raise StorageError(f"export directory must exist: {str(target.parent)!r} {what}; pass a path in an "
                           "existing directory")
    try:
        if suffix == ".csv":
            _typed(frame).to_csv(target, index=False)
        else:
            _parquet_safe(frame).to_parquet(target, index=False)
    except OSError as err:  # pyarrow's I/O errors are OSErrors too
        raise StorageError(f"export path must be writable: cannot write {str(target)!r} "
                           f"({err.strerror or err}); pass a path you can write") from None
    return target
