"""Shared by the hardening tests and experiments/fault_injection.py: run tuners, count the damage.

``tune_argv`` builds an ``autoslapo tune`` command line; ``audit`` reads a study back from the
store and counts what a fault may have done to it: trials lost (budget not reached), duplicated
(a config or number stored twice), or left ``running``/interrupted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    """The environment a tuner subprocess runs with (this checkout first on the path)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "AUTOSLAPO_STORAGE": ""}


def tune_argv(url: str, study: str, trials: int, *, model: str = "bert-base", gpus: int = 16,
              gpu_type: str = "v100-32gb", backend: str = "sim", extra: tuple[str, ...] = ()) -> list[str]:
    """``python -m autoslapo tune ...`` for one study on ``url``.

    It names the sampler: the faults land between sampled trials, one store write each (without
    ``--sampler`` a sim study scores the whole space and stores its best in one transaction).
    """
    return [sys.executable, "-m", "autoslapo", "tune", model, "--gpus", str(gpus), "--gpu-type", gpu_type,
            "--backend", backend, "--trials", str(trials), "--study", study, "--storage", url,
            "--no-baselines", "--sampler", "tpe", *extra]


def start(argv: list[str], log: Path | None = None) -> subprocess.Popen[str]:
    """Start a tuner; its output goes to ``log`` (or is discarded)."""
    out = open(log, "a") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env(), cwd=ROOT)


@dataclass
class Audit:
    """What the store holds for a study after the faults."""

    launched: int  # trials that are not pruned (complete, oom, failed, timeout)
    rows: int
    duplicated: int  # configs or numbers stored more than once
    running: int  # trials left running or interrupted and never re-run
    statuses: dict[str, int]

    def lost(self, budget: int) -> int:
        """Trials of the budget that never got a finished row."""
        return max(0, budget - (self.launched - self.running))


def audit(url: str, study: str) -> Audit:
    """Read ``study`` back from ``url`` and count (see ``Audit``)."""
    from store import open_store

    with open_store(url) as store:
        rows = store.trials(study)
    statuses: dict[str, int] = {}
    for t in rows:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    dup = (len(rows) - len({t.config_hash for t in rows})) + (len(rows) - len({t.number for t in rows}))
    running = sum(1 for t in rows if t.status == "running" or t.reason.startswith("interrupted"))
    launched = sum(1 for t in rows if t.status != "pruned")
    return Audit(launched, len(rows), dup, running, statuses)
