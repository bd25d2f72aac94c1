"""kill -9 of a real ``autoslapo tune`` process at random points, then ``--resume``: nothing lost."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.hardening.harness import audit, start, tune_argv


def _rows(url: str, study: str) -> int:
    from store import open_store

    with open_store(url) as store:
        return store.count_trials(study) if store.has_study(study) else 0


@pytest.mark.slow
def test_kill_9_three_times_then_resume(tmp_path: Path) -> None:
    url, budget, rng = f"sqlite:///{tmp_path / 'k.db'}", 60, random.Random(1)
    injected = 0
    for _ in range(3):
        resume = ("--resume",) if _rows(url, "k") else ()
        before = _rows(url, "k")
        proc = start(tune_argv(url, "k", budget, extra=resume), tmp_path / "log")
        target = before + rng.randint(1, 15)
        t0 = time.monotonic()
        while proc.poll() is None and _rows(url, "k") < target and time.monotonic() - t0 < 120:
            time.sleep(0.02)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            injected += 1
        proc.wait(timeout=60)
    assert injected >= 2, (tmp_path / "log").read_text()[-2000:]
    assert start(tune_argv(url, "k", budget, extra=("--resume",)), tmp_path / "log").wait(timeout=300) == 0
    a = audit(url, "k")
    assert a.lost(budget) == 0 and a.launched == budget, a
    assert a.duplicated == 0 and a.running == 0, a
