"""A SQLite file with nothing in it yet (0 bytes, or a database without a single table) reads as a
missing store does: no studies, the same one-line messages and exit codes, and the file untouched.
A database holding someone else's tables is still refused; a writing open makes either a store."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.errors import StorageError
from autoslapo.storage import open_existing_store
from tests.readonly import STUDY, bert_store, digest, read_only_directory


def _zero_bytes(path: Path) -> None:
    path.touch()


def _vacuumed(path: Path) -> None:  # `sqlite3 x.db "VACUUM;"`: a header page and no tables
    sqlite3.connect(path).execute("VACUUM").connection.close()


def _table_dropped(path: Path) -> None:  # a table made and dropped: a free page left, no tables
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.execute("DROP TABLE t")
    conn.commit()
    conn.close()


def _wal_mode(path: Path) -> None:  # an empty database switched to WAL mode (no -wal file left)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()


EMPTY: dict[str, Callable[[Path], None]] = {
    "zero-bytes": _zero_bytes, "vacuumed": _vacuumed, "table-dropped": _table_dropped, "wal-mode": _wal_mode,
}


def _reads(url: str, out: Path) -> list[list[str]]:
    return [["studies", "--storage", url], ["studies", "--json", "--storage", url],
            ["show", STUDY, "--storage", url], ["best", "bert", "--gpus", "8", "--storage", url],
            ["export", STUDY, "--output", str(out / "t.csv"), "--storage", url],
            ["report", STUDY, "--output", str(out / "r.html"), "--storage", url]]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out.replace(str(path), "PATH"), captured.err.replace(str(path), "PATH")


@pytest.mark.parametrize("make", EMPTY.values(), ids=EMPTY.keys())
def test_an_empty_sqlite_file_reads_as_a_missing_store(tmp_path: Path, make: Callable[[Path], None],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "missing").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "out").mkdir()
    missing, empty = tmp_path / "missing" / "x.db", tmp_path / "empty" / "x.db"
    make(empty)
    before = digest(empty)
    for argv_missing, argv_empty in zip(_reads(f"sqlite:///{missing}", tmp_path / "out"),
                                        _reads(f"sqlite:///{empty}", tmp_path / "out"), strict=True):
        expected = _run(argv_missing, capsys, missing)
        assert _run(argv_empty, capsys, empty) == expected, argv_empty
        assert expected[0] == (0 if argv_missing[0] == "studies" else 2)
        if expected[0] == 2:
            assert "no store at" in expected[2] and len(expected[2].strip().splitlines()) == 1
    assert _run(["studies", "--json", "--storage", f"sqlite:///{empty}"], capsys, empty)[1].strip() == "[]"
    assert digest(empty) == before
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["x.db"]  # no -wal, -shm or journal
    assert list((tmp_path / "missing").iterdir()) == [] and list((tmp_path / "out").iterdir()) == []
    assert open_existing_store(f"sqlite:///{empty}", read_only=True) is None


def test_an_empty_sqlite_file_in_a_read_only_directory_reads_as_no_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.db"
    _table_dropped(path)
    before = digest(path)
    read_only_directory(monkeypatch, tmp_path)
    assert main(["studies", "--json", "--storage", f"sqlite:///{path}"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]


def test_a_sqlite_file_with_another_table_is_still_refused_untouched(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "theirs.db"
    _table_dropped(path)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.close()
    before = digest(path)
    for argv in (["studies", "--storage", f"sqlite:///{path}"], ["show", STUDY, "--storage", f"sqlite:///{path}"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "not an autoslapo store" in err and "(users)" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(StorageError, match="holds other tables"):
        open_existing_store(f"sqlite:///{path}", read_only=True)
    assert digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]


@pytest.mark.parametrize("make", EMPTY.values(), ids=EMPTY.keys())
def test_a_writing_open_makes_an_empty_sqlite_file_a_store(tmp_path: Path, make: Callable[[Path], None],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.db"
    make(path)
    url = bert_store(path, trial=False)
    assert main(["studies", "--json", "--storage", url]) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)] == [STUDY]


def test_a_store_whose_tables_are_still_in_its_wal_file_is_read(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A running tuner's new store may hold its tables only in the -wal file, the main file still
    without one: it is a store, not an empty file."""
    path = tmp_path / "x.db"
    _wal_mode(path)
    holder = sqlite3.connect(path)  # another connection open: closing the writer folds nothing back
    holder.execute("PRAGMA wal_autocheckpoint=0")
    holder.execute("SELECT count(*) FROM sqlite_master").fetchall()
    try:
        url = bert_store(path, trial=False)
        main_file = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
        assert main_file.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)  # tables only in -wal
        main_file.close()
        assert main(["studies", "--json", "--storage", url]) == 0
        assert [s["name"] for s in json.loads(capsys.readouterr().out)] == [STUDY]
    finally:
        holder.close()
