"""Fixtures of the hardening suite: a private PostgreSQL server (skipped where it cannot start)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pgserver import PgServer, unavailable_reason


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """A private PostgreSQL server for the session; a failure under CI=true, else a skip, if impossible."""
    reason = unavailable_reason()
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if reason is not None:
        if ci:
            pytest.fail(f"CI=true needs the PostgreSQL tests to run: {reason}")
        pytest.skip(reason)
    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()
