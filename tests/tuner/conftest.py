"""Fixtures for tuner tests: a fresh SQLite store per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'tuner.db'}")
    try:
        yield s
    finally:
        s.close()
