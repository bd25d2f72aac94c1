"""Several tuners on one study (``--study NAME --join``): every trial distinct, the total the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hardening.harness import audit, start, tune_argv
from tests.pgserver import PgServer


def _run_together(url: str, n: int, budget: int, tmp_path: Path) -> None:
    procs = [start(tune_argv(url, "shared", budget, extra=("--join", "--seed", str(i))), tmp_path / f"t{i}.log")
             for i in range(n)]
    codes = [p.wait(timeout=600) for p in procs]
    logs = "\n".join((tmp_path / f"t{i}.log").read_text()[-1500:] for i in range(n))
    assert codes == [0] * n, logs
    assert "database is locked" not in logs
    a = audit(url, "shared")
    assert a.launched == budget, a
    assert a.duplicated == 0 and a.running == 0, a


@pytest.mark.slow
def test_two_tuners_on_one_sqlite_file(tmp_path: Path) -> None:
    _run_together(f"sqlite:///{tmp_path / 'shared.db'}", 2, 30, tmp_path)


@pytest.mark.postgres
@pytest.mark.slow
def test_four_tuners_on_one_postgresql_study(pg: PgServer, tmp_path: Path) -> None:
    _run_together(pg.create_database("four"), 4, 40, tmp_path)


def test_join_and_resume_exclude_each_other(tmp_path: Path) -> None:
    from autoslapo.cli import main

    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--study", "s", "--join", "--resume",
                 "--storage", url]) == 2
    assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--join", "--storage", url]) == 2
