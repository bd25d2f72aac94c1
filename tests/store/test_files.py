"""SQLite files the store must refuse without changing a byte, and the settings it relies on."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from autoslapo.errors import StorageError
from store import open_store, resolve_url
from tests.store.conftest import config, result, study_kwargs


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _siblings(path: Path) -> list[Path]:
    return [p for p in (Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")) if p.exists()]


def _refused(path: Path, match: str) -> StorageError:
    before = _digest(path)
    with pytest.raises(StorageError, match=match) as caught:
        open_store(f"sqlite:///{path}")
    assert _digest(path) == before, "the refused file was modified"
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 2
    return caught.value


def _real_db(path: Path, trials: int = 300) -> None:
    with open_store(f"sqlite:///{path}") as db:
        db.create_study("s", **study_kwargs())
        db.add_trials("s", [(i, config(i), result(i) | {"reason": "x" * 200}) for i in range(trials)])
    assert _siblings(path) == []


def test_a_text_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 50)
    err = _refused(path, "must be a SQLite database")
    assert "untouched" in str(err)
    assert _siblings(path) == []


def test_a_short_binary_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "blob.db"
    path.write_bytes(b"SQLite format 3\x00\x01\x02")
    _refused(path, "must be a SQLite database")
    assert _siblings(path) == []


def test_a_damaged_header_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _real_db(path)
    data = bytearray(path.read_bytes())
    data[0:16] = b"\xff" * 16
    path.write_bytes(bytes(data))
    _refused(path, "must be a SQLite database")
    assert _siblings(path) == []


def test_damaged_pages_are_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _real_db(path)
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(2 * page, len(data) - page, 3 * page):  # scribble over every third page
        data[start : start + page] = b"\xa5" * page
    path.write_bytes(bytes(data))
    _refused(path, "must be intact")
    assert _siblings(path) == []


def test_a_truncated_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _real_db(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _refused(path, "must be intact")


def test_directories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="must name a file"):
        open_store(f"sqlite:///{tmp_path}")
    with pytest.raises(StorageError, match="directory of the SQLite database must exist"):
        open_store(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")


def test_an_empty_file_becomes_a_database(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with open_store(f"sqlite:///{path}") as db:
        assert db.revision() == "0003"


def test_wal_mode_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    with open_store(f"sqlite:///{path}") as db, db._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone() == (
        "wal",
    )  # persistent: Optuna's engine gets it too
    raw.close()


def test_default_url_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTOSLAPO_STORAGE", raising=False)
    assert resolve_url(None) == "sqlite:///autoslapo.db"
    monkeypatch.chdir(tmp_path)
    with open_store() as db:
        assert db.url == f"sqlite:///{tmp_path / 'autoslapo.db'}"
    assert (tmp_path / "autoslapo.db").exists()
    monkeypatch.setenv("AUTOSLAPO_STORAGE", f"sqlite:///{tmp_path / 'env.db'}")
    assert resolve_url(None).endswith("env.db")
    assert resolve_url("sqlite:///given.db") == "sqlite:///given.db"
    with open_store() as db:
        assert db.url.endswith("env.db")


def test_in_memory_store(tmp_path: Path) -> None:
    with open_store("sqlite:///:memory:") as db:
        db.create_study("s", **study_kwargs())
        db.add_trial("s", 0, config(0), result(0))
        assert db.best_trials("bert-large", 8)[0].number == 0
        with pytest.raises(StorageError, match="file or server database"):
            db.optuna_storage()
