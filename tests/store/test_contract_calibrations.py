"""The store contract for cost-model calibrations, on SQLite and on a real PostgreSQL server.

These are the calls the tuner makes (``tuner/study.py``): ``calibration(fingerprint)`` when a study
opens, ``save_calibration`` after each refit; a later study on the same cluster reads it back.
"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from autoslapo.errors import StorageError
from store import Store, open_store

FACTORS = {"compute": 0.8, "memory_bw": 1.1, "comm": 0.6, "overhead": 1.3, "activation": 1.5}


def test_absent_until_saved_then_read_back(db: Store) -> None:
    assert db.calibration("fp-a") is None
    db.save_calibration("fp-a", FACTORS, 3)
    got = db.calibration("fp-a")
    assert got is not None
    assert got["params"] == FACTORS and got["n_trials"] == 3
    assert isinstance(got["updated_at"], datetime) and got["updated_at"].tzinfo is not None
    assert db.calibration("fp-b") is None  # keyed by fingerprint


def test_a_save_replaces_the_clusters_calibration(db: Store) -> None:
    db.save_calibration("fp-a", FACTORS, 3)
    db.save_calibration("fp-b", {"compute": 2.0}, 1)
    db.save_calibration("fp-a", {**FACTORS, "compute": 0.5}, 7)
    a, b = db.calibration("fp-a"), db.calibration("fp-b")
    assert a is not None and a["params"]["compute"] == 0.5 and a["n_trials"] == 7
    assert b is not None and b["params"] == {"compute": 2.0} and b["n_trials"] == 1


def test_another_connection_sees_it(db: Store, store_url: str) -> None:
    db.save_calibration("fp-a", FACTORS, 2)
    with open_store(store_url) as other:
        got = other.calibration("fp-a")
    assert got is not None and got["params"] == FACTORS


@pytest.mark.parametrize(("fingerprint", "params", "n", "match"), [
    ("", FACTORS, 1, "fingerprint must be a non-empty string"),
    ("fp", {"compute": float("nan")}, 1, "must be finite numbers"),
    ("fp", FACTORS, -1, "n_trials must be a whole number"),
])
def test_bad_calibrations_are_refused(db: Store, fingerprint: str, params: dict[str, float], n: int,
                                      match: str) -> None:
    with pytest.raises(StorageError, match=match):
        db.save_calibration(fingerprint, params, n)
    assert db.calibration("fp") is None


def test_concurrent_first_saves_leave_one_row(db: Store, store_url: str) -> None:
    stores = [open_store(store_url) for _ in range(4)]
    errors: list[BaseException] = []

    def save(i: int) -> None:
        try:
            for k in range(5):
                stores[i].save_calibration("fp-race", {"compute": 1.0 + i / 10}, k)
        except BaseException as err:  # collected for the assertion below
            errors.append(err)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert errors == []
    got = db.calibration("fp-race")
    assert got is not None and got["n_trials"] == 4
    assert got["params"]["compute"] in {1.0, 1.1, 1.2, 1.3}
