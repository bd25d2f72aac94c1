"""Ray's own log lines stay out of ``autoslapo tune``'s output unless ``AUTOSLAPO_DEBUG=1``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Ray's log format: "2026-01-01 12:00:00,000\tINFO tune.py:1007 -- Wrote the latest version ..."
RAY_LOG_LINE = re.compile(r"\b(INFO|WARNING)\s+\S+\.py:\d+ -- ")


def _tune_through_ray(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "autoslapo", "tune", "bert-tiny", "--gpus", "2", "--backend", "sim",
            "--dispatch", "ray", "--trials", "2", "--no-baselines", "--storage", f"sqlite:///{tmp_path}/s.db"]
    clean = {k: v for k, v in os.environ.items() if k != "AUTOSLAPO_DEBUG"}
    return subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**clean, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **env})


@pytest.mark.ray
@pytest.mark.slow
def test_ray_dispatch_prints_no_ray_log_lines(tmp_path: Path) -> None:
    (tmp_path / "quiet").mkdir()
    quiet = _tune_through_ray(tmp_path / "quiet")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    both = quiet.stdout + quiet.stderr
    assert "2 trials launched" in quiet.stdout
    assert not [line for line in both.splitlines() if RAY_LOG_LINE.search(line)], both
    # the pattern does match Ray's lines: with AUTOSLAPO_DEBUG=1 they come back
    (tmp_path / "debug").mkdir()
    loud = _tune_through_ray(tmp_path / "debug", AUTOSLAPO_DEBUG="1")
    assert loud.returncode == 0, loud.stderr[-2000:]
    assert re.search(r"INFO\s+tune\.py:\d+ -- Wrote the latest version", loud.stderr), loud.stderr[-2000:]
