"""The result commands only read: they never create a store, never write to someone else's SQLite
file, and read a store in a directory SQLite cannot write to (or say that rule, never "damaged")."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from autoslapo.cli import main
from tests.readonly import STUDY, bert_store, digest, read_only_directory


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _reads(url: str, tmp_path: Path) -> list[list[str]]:
    return [["studies", "--storage", url], ["show", STUDY, "--storage", url],
            ["export", STUDY, "--output", str(tmp_path / "out" / "t.csv"), "--storage", url],
            ["best", "bert", "--gpus", "8", "--storage", url]]


def test_best_on_a_missing_store_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "none123.db"
    assert main(["best", "bert", "--gpus", "8", "--storage", f"sqlite:///{target}"]) == 2
    line = _one_line_error(capsys)
    assert "no store at" in line and "the file does not exist" in line and "none123.db" in line
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_read_commands_refuse_a_foreign_sqlite_file_untouched(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "foreign2.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    before = digest(path)
    (tmp_path / "out").mkdir()
    for argv in _reads(f"sqlite:///{path}", tmp_path):
        assert main(argv) == 2, argv
        line = _one_line_error(capsys)
        assert "not an autoslapo store" in line and "users" in line and "point --storage" in line, line
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign2.db", "out"]
    with sqlite3.connect(path) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["users"]
    conn.close()


def test_read_commands_read_a_store_in_aread_only_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "ro2"
    directory.mkdir()
    (tmp_path / "out").mkdir()
    path = directory / "autoslapo.db"
    url = bert_store(path)
    before = digest(path)
    read_only_directory(monkeypatch, directory)
    for argv in _reads(url, tmp_path):
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    out = capsys.readouterr().out
    assert STUDY in out and "100.0 samples/s" in out  # studies and show list it, best answers from it
    assert digest(path) == before and sorted(p.name for p in directory.iterdir()) == ["autoslapo.db"]


def test_report_reads_a_store_in_aread_only_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``report`` only reads the store: it opens it read-only there too (before: "must be intact ... restore
    it from a backup" for a healthy file), writes its pages elsewhere, and leaves the database as it was."""
    directory = tmp_path / "ro2"
    directory.mkdir()
    path = directory / "autoslapo.db"
    url = bert_store(path)
    before = digest(path)
    read_only_directory(monkeypatch, directory)
    assert main(["report", STUDY, "--output", str(tmp_path / "rep"), "--storage", url]) == 0, capsys.readouterr().err
    assert (tmp_path / "rep").is_dir() and any((tmp_path / "rep").iterdir())
    assert digest(path) == before
