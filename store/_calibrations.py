"""Per-cluster calibrations of the cost model: one row per cluster fingerprint, replaced on save.

The parameters are the correction's factors (``autoslapo.cost.correction.Correction.to_dict``);
the store keeps them as JSON and does not interpret them. ``Store.save_calibration`` and
``Store.calibration`` are the public face; these functions do the work in one short transaction.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store._engine import Transactions
from store._records import clean_json
from store._schema import CalibrationRow, utcnow


def _check(fingerprint: str, params: dict[str, Any], n_trials: int) -> dict[str, Any]:
    if not isinstance(fingerprint, str) or not fingerprint or len(fingerprint) > 128:
        raise StorageError(f"a calibration's cluster fingerprint must be a non-empty string of at most 128 "
                           f"characters: got {fingerprint!r}; pass ClusterSpec.fingerprint()")
    if not isinstance(params, dict):
        raise StorageError(f"calibration params must be a dict of factors: got {type(params).__name__}")
    bad = {k: v for k, v in params.items()
           if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise StorageError(f"calibration params must be finite numbers: got {bad}; refit the calibration")
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials < 0:
        raise StorageError(f"n_trials must be a whole number of trials, 0 or more: got {n_trials!r}")
    return clean_json(params)  # type: ignore[no-any-return]


def save(tx: Transactions, fingerprint: str, params: dict[str, Any], n_trials: int) -> None:
    """Insert or replace the calibration of ``fingerprint`` (the last writer wins)."""
    params = _check(fingerprint, params, n_trials)

    def upsert(session: Session) -> bool:
        found = session.scalar(select(CalibrationRow.id).where(CalibrationRow.cluster_fingerprint == fingerprint))
        if found is not None:
            session.execute(update(CalibrationRow).where(CalibrationRow.id == found)
                            .values(params=params, n_trials=n_trials, updated_at=utcnow()))
            return True
        session.add(CalibrationRow(cluster_fingerprint=fingerprint, params=params, n_trials=n_trials,
                                   updated_at=utcnow()))
        return True

    # Two tuners saving the first calibration at once: one insert loses the unique race; it then
    # finds the row and replaces it.
    for _ in range(3):
        if tx.write_unique("save a calibration", upsert):
            return
    raise StorageError(f"could not save the calibration of cluster {fingerprint!r}: the row kept changing; retry")


def load(tx: Transactions, fingerprint: str) -> dict[str, Any] | None:
    """``{"params", "n_trials", "updated_at"}`` of ``fingerprint``'s calibration, or None."""

    def read(session: Session) -> dict[str, Any] | None:
        row = session.scalar(select(CalibrationRow).where(CalibrationRow.cluster_fingerprint == fingerprint))
        if row is None:
            return None
        return {"params": dict(row.params), "n_trials": row.n_trials, "updated_at": row.updated_at}

    return tx.read("read a calibration", read)
