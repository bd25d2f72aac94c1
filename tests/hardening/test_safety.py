"""Access and safety: stored rows and space files are data, never code; passwords never printed."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.redact import redact
from tests.pgserver import PgServer

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("autoslapo", "store", "tuner", "search_spaces")
# Ways to turn bytes into code or objects: none may appear in the packages.
FORBIDDEN = re.compile(
    r"import pickle|from pickle|pickle\.loads?\(|cloudpickle|import dill|marshal\.loads?\(|shelve\."
    r"|(?<![.\w])eval\(|(?<![.\w])exec\(|yaml\.(unsafe_)?load\(|shell=True|os\.system\(|os\.popen\("
)


def test_no_package_evaluates_or_unpickles_anything() -> None:
    hits = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if FORBIDDEN.search(code):
                    hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, hits


HOSTILE = "__import__('os').system('touch {flag}')"


def test_stored_rows_are_read_back_as_plain_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from store import open_store

    flag = tmp_path / "pwned"
    text = HOSTILE.format(flag=flag)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--trials", "2", "--study", "s",
                 "--no-baselines", "--storage", url]) == 0
    with open_store(url) as store:
        store.start_trial("s", 99, {"tp": 1, "note": text})
        store.finish_trial("s", 99, {"status": "failed", "reason": text, "extra": {"x": text}})
    for argv in (["show", "s"], ["show", "s", "--json"], ["studies", "--json"],
                 ["export", "s", "-o", str(tmp_path / "s.csv")], ["best", "bert-tiny", "--gpus", "4"]):
        assert main([*argv, "--storage", url]) == 0, argv
    out = capsys.readouterr().out
    assert text in out or text[:40] in out  # shown verbatim (maybe cut), as text
    assert not flag.exists()
    # What the store keeps is JSON text, readable by anything.
    with sqlite3.connect(tmp_path / "a.db") as conn:
        for (config, result) in conn.execute("SELECT config, result FROM autoslapo_trials"):
            json.loads(config)
            json.loads(result)


@pytest.mark.parametrize("suffix,body", [
    (".toml", 'name = "{t}"\ndescription = "{t}"\n[knobs]\nmicro_batch = [1, 2]\n'),
    (".json", '{{"name": "{t}", "description": "{t}", "knobs": {{"micro_batch": [1, 2]}}}}'),
])
def test_space_files_are_parsed_as_data(tmp_path: Path, suffix: str, body: str) -> None:
    from search_spaces import load_space

    flag = tmp_path / "pwned"
    text = HOSTILE.format(flag=flag).replace("'", "")
    path = tmp_path / f"space{suffix}"
    path.write_text(body.format(t=text))
    space = load_space(path)
    assert space.name == text and not flag.exists()


@pytest.mark.parametrize("url", [
    "postgresql://alice:hunter2@db.example:5432/autoslapo",
    "postgresql+psycopg://alice:hunter2@db.example/autoslapo?sslmode=require",
    "postgresql://db.example/autoslapo?user=alice&password=hunter2",
    "see postgres://bob:hunter2@10.0.0.1/x and sqlite:///a.db",
])
def test_redact_hides_every_password_form(url: str) -> None:
    assert "hunter2" not in redact(url)
    assert "***" in redact(url)


@pytest.mark.postgres
def test_no_printing_path_shows_the_password(pg: PgServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The private server trusts local users, so a URL with a password still connects."""
    from store import open_store

    secret = "pw-9f8e7d"
    pg.create_database("redact")
    url = f"postgresql://postgres:{secret}@127.0.0.1:{pg.port}/redact"
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--trials", "2", "--study", "r",
                 "--storage", url]) == 0
    assert main(["studies", "--storage", url]) == 0
    assert main(["studies", "--json", "--storage", url]) == 0
    assert main(["show", "r", "--storage", url]) == 0
    assert main(["show", "nope", "--storage", url]) == 2  # the error names the store
    assert main(["best", "bert-large", "--gpus", "64", "--storage", url]) != 0  # "no trial ... in <url>"
    assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--study", "nope", "--resume",
                 "--storage", url]) == 2
    monkeypatch.setenv("AUTOSLAPO_STORAGE", url)
    assert main(["studies"]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err
    assert "***" in err
    with open_store(url) as store:
        assert secret not in repr(store) and secret not in store.url
        assert all(secret not in json.dumps(s.__dict__, default=str) for s in store.list_studies())
