"""Trials as a pandas DataFrame, and its export to CSV or Parquet (pandas imported only here)."""

from __future__ import annotations

import json
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
    return frame


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    # A knob that is an int in one trial and a string in another cannot be one Arrow column;
    # such columns (and lists) are written as JSON text instead of failing the export.
    frame = frame.copy()
    for name in frame.columns:
        if frame[name].dtype != object:
            continue
        kinds = {type(v) for v in frame[name] if v is not None}
        if len(kinds) > 1 or kinds & {list, dict}:
            frame[name] = [None if v is None else json.dumps(v, sort_keys=True) for v in frame[name]]
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
            frame.to_csv(target, index=False)
        else:
            _parquet_safe(frame).to_parquet(target, index=False)
    except OSError as err:  # pyarrow's I/O errors are OSErrors too
        raise StorageError(f"export path must be writable: cannot write {str(target)!r} "
                           f"({err.strerror or err}); pass a path you can write") from None
    return target
