"""Opening a store to read (``open_store(url, read_only=True)``) and the checks every open makes on
a SQLite file: a database that is someone else's is refused untouched, a store in a directory SQLite
cannot write is read (immutable) or refused with the rule, never called damaged."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from autoslapo.errors import StorageError
from store import open_store
from store._migrate import head_revision
from tests.readonly import read_only_directory
from tests.store.conftest import config, result, study_kwargs


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _store_with_a_trial(path: Path) -> str:
    url = f"sqlite:///{path}"
    with open_store(url) as db:
        db.create_study("s", **study_kwargs())
        db.add_trial("s", 0, config(0), result(0))
    return url


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.close()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / "theirs.db"
    _foreign(path)
    before = _digest(path)
    with pytest.raises(StorageError, match=r"^not an autoslapo store: sqlite:///.*theirs\.db holds other "
                                           r"tables \(users\).*point --storage at .* a new file$"):
        open_store(f"sqlite:///{path}", read_only=read_only)
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]


def test_an_empty_sqlite_database_becomes_a_store_but_is_not_read_as_one(tmp_path: Path) -> None:
    path = tmp_path / "blank.db"
    sqlite3.connect(path).execute("VACUUM").connection.close()  # a header, no tables
    assert path.stat().st_size > 0
    with pytest.raises(StorageError, match=r"^not an autoslapo store: .*holds no autoslapo tables yet"):
        open_store(f"sqlite:///{path}", read_only=True)
    with open_store(f"sqlite:///{path}") as db:  # a writing command makes it a store
        assert db.revision() == head_revision()


def test_read_only_never_creates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    with pytest.raises(StorageError, match=r"^no store at .*the file does not exist"):
        open_store(f"sqlite:///{path}", read_only=True)
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_read_only_reads_a_store_and_leaves_it_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ours.db"
    url = _store_with_a_trial(path)
    before = _digest(path)
    with open_store(url, read_only=True) as db:
        assert [s.name for s in db.list_studies()] == ["s"] and len(db.trials("s")) == 1
    assert _digest(path) == before


def test_a_store_in_a_read_only_directory_is_read_immutable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ours.db"
    url = _store_with_a_trial(path)
    before = _digest(path)
    read_only_directory(monkeypatch, tmp_path)
    with open_store(url, read_only=True) as db:
        assert [t.number for t in db.trials("s")] == [0]
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.db"]  # no -wal or -shm made


def test_writing_to_a_store_in_a_read_only_directory_names_the_rule(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ours.db"
    url = _store_with_a_trial(path)
    before = _digest(path)
    read_only_directory(monkeypatch, tmp_path)
    for target in (url, f"sqlite:///{tmp_path / 'new.db'}"):
        with pytest.raises(StorageError) as caught:
            open_store(target)
        message = str(caught.value)
        assert message.startswith("the directory of a SQLite store must be writable (SQLite's WAL mode keeps -wal")
        assert repr(str(tmp_path)) in message and "copy the database to a writable directory" in message
        assert "restore it from a backup" not in message and "\n" not in message
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.db"]


def test_a_read_only_directory_with_unfolded_commits_is_refused(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ours.db"
    url = _store_with_a_trial(path)
    Path(f"{path}-wal").write_bytes(b"\0" * 64)  # commits an immutable open would not see
    read_only_directory(monkeypatch, tmp_path)
    with pytest.raises(StorageError, match=r"must be writable .*-wal' holds commits not yet in the database.*"
                                           r"copy the database with its -wal file"):
        open_store(url, read_only=True)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to a chmod a-w directory")
def test_a_chmod_read_only_directory_is_read_not_called_damaged(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "ours.db"
    url = _store_with_a_trial(path)
    directory.chmod(0o555)
    try:
        with open_store(url, read_only=True) as db:
            assert [t.number for t in db.trials("s")] == [0]
        with pytest.raises(StorageError, match="directory of a SQLite store must be writable"):
            open_store(url)
    finally:
        directory.chmod(0o755)


def test_read_only_refuses_a_postgres_database_without_a_store(store_url: str, backend: str) -> None:
    if backend == "sqlite":  # a fresh SQLite URL is a missing file: see test_read_only_never_creates_a_file
        pytest.skip("PostgreSQL only")
    with pytest.raises(StorageError, match=r"^not an autoslapo store: .*holds no autoslapo tables yet"):
        open_store(store_url, read_only=True)
    with open_store(store_url) as db:  # a writing open creates the store; a read then finds it
        db.create_study("s", **study_kwargs())
    with open_store(store_url, read_only=True) as db:
        assert [s.name for s in db.list_studies()] == ["s"]


def test_an_optuna_database_is_shared_not_refused(tmp_path: Path) -> None:
    """A SQLite file Optuna's RDB storage made holds only Optuna's tables: tune may share it (the store
    mirrors its trials into Optuna's tables of its own database); a read still finds no store there."""
    import optuna

    path = tmp_path / "optuna.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=f"sqlite:///{path}", study_name="theirs").optimize(
        lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with pytest.raises(StorageError, match=r"^not an autoslapo store: .*and none of autoslapo's"):
        open_store(f"sqlite:///{path}", read_only=True)
    with open_store(f"sqlite:///{path}") as db:
        assert db.revision() == head_revision()
    assert optuna.load_study(storage=f"sqlite:///{path}", study_name="theirs").trials[0].state.name == "COMPLETE"
