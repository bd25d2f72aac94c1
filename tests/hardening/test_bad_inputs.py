"""Every bad input of the corpus: one stderr line, exit code 2, no traceback, the store untouched.

Cases run in-process through ``autoslapo.cli.main`` (fast); a sample also runs as a real
``python -m autoslapo`` subprocess so the process exit path is covered too.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoslapo.cli import main
from tests.hardening.bad_inputs import CASES, SECRET, fill, write_space_files

ROOT = Path(__file__).resolve().parents[2]
SUBPROCESS_SAMPLE = ("tune-unknown-model", "tune-storage-not-db", "tune-storage-unreachable",
                     "tune-resume-missing", "show-asc-desc", "best-gpus-zero", "tune-ray-address-no-token")


def _digest(db: Path) -> str:
    h = hashlib.sha256(db.read_bytes())
    wal = Path(f"{db}-wal")
    if wal.exists():
        h.update(wal.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A store seeded by a real small sim study, a file that is no database, the space files."""
    d = tmp_path_factory.mktemp("bad")
    db = d / "seed.db"
    url = f"sqlite:///{db}"
    subprocess.run([sys.executable, "-m", "autoslapo", "tune", "bert-tiny", "--gpus", "4", "--trials", "5",
                    "--backend", "sim", "--study", "seeded", "--no-baselines", "--storage", url],
                   check=True, capture_output=True, cwd=d, env={**os.environ, "PYTHONPATH": str(ROOT)},
                   timeout=120)
    notdb = d / "notes.txt"
    notdb.write_text("hello, not a database\n")
    return {"dir": d, "db": db, "url": url, "notdb": notdb, "spaces": write_space_files(d)}


def _argv(world: dict[str, object], argv: list[str]) -> list[str]:
    return fill(argv, url=str(world["url"]), dir=world["dir"], notdb=world["notdb"],  # type: ignore[arg-type]
                spaces=world["spaces"])  # type: ignore[arg-type]


def _check(case_id: str, code: int, err: str, out: str, expected: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, f"{case_id}: exit {code}, stderr {err[-800:]!r}"
    assert "Traceback" not in err, err
    assert len(lines) == 1, f"{case_id}: {len(lines)} stderr lines: {err[-800:]!r}"
    assert expected.lower() in lines[0].lower(), f"{case_id}: {expected!r} not in {lines[0]!r}"
    assert SECRET not in err + out, f"{case_id}: the password was printed"


def test_corpus_is_large_and_covers_every_command() -> None:
    from autoslapo.cli import SUBCOMMANDS

    assert len(CASES) >= 50
    assert len({c[0] for c in CASES}) == len(CASES)
    assert set(SUBCOMMANDS) <= {c[1][0] for c in CASES}


@pytest.mark.parametrize("case_id,argv,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case_id: str, argv: list[str], expected: str, world: dict[str, object],
                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSLAPO_STORAGE", str(world["url"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.chdir(world["dir"])  # type: ignore[arg-type]
    before = _digest(world["db"])  # type: ignore[arg-type]
    try:
        code = main(_argv(world, argv))
    except SystemExit as e:  # argparse errors leave through SystemExit
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    _check(case_id, code, err, out, expected)
    assert _digest(world["db"]) == before, f"{case_id}: the store changed"  # type: ignore[arg-type]


@pytest.mark.parametrize("case_id", SUBPROCESS_SAMPLE)
def test_bad_input_process(case_id: str, world: dict[str, object]) -> None:
    _, argv, expected = next(c for c in CASES if c[0] == case_id)
    before = _digest(world["db"])  # type: ignore[arg-type]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOSLAPO_STORAGE": str(world["url"]), "HF_HUB_OFFLINE": "1",
           "RAY_AUTH_MODE": ""}
    p = subprocess.run([sys.executable, "-m", "autoslapo", *_argv(world, argv)], capture_output=True, text=True,
                       cwd=world["dir"], env=env, timeout=120)  # type: ignore[call-overload]
    _check(case_id, p.returncode, p.stderr, p.stdout, expected)
    assert _digest(world["db"]) == before  # type: ignore[arg-type]
