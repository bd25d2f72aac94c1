"""The README stays true: its CLI reference is generated from the parsers, its example runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoslapo.cli import docs

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_is_current() -> None:
    readme = (ROOT / "README.md").read_text()
    assert docs.render(readme) == readme, "run: python -m autoslapo.cli.docs"


def test_readme_opens_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().split("```bash", 1)[1].split("```", 1)[0]
    assert "scripts/setup && .venv/bin/autoslapo tune bert --gpus 64" in head
    assert "scripts/test" in head
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_schedule_language_example_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "schedule_example.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "verified" in out.stdout and "mismatch: output" in out.stdout
