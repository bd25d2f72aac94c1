"""PostgreSQL for tests: one private server for the whole session, fresh databases on it.

The session fixture ``pg_server`` (made visible to every folder by tests/conftest.py) starts the
server of tests/pgserver.py; ``database_url(backend, ...)`` gives a fresh database on SQLite or on
that server, for tests parametrized over ``BACKENDS``. Where the server cannot start, its tests
skip, except under CI=true, where a missing server is a failure rather than a smaller suite.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pgserver import PgServer, unavailable_reason

_counter = itertools.count()
#: The databases a contract or end-to-end test runs on (PostgreSQL ones carry the ``postgres`` mark).
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A private PostgreSQL server for the whole session (skipped, or failed under CI, if impossible)."""
    reason = unavailable_reason()
    if reason is not None:
        if _ci():
            pytest.fail(f"CI=true needs the PostgreSQL tests to run: {reason}")
        pytest.skip(reason)
    server = PgServer()
    try:
        server.start()
    except Exception as err:
        if _ci():
            pytest.fail(f"CI=true needs the PostgreSQL tests to run: {err}")
        pytest.skip(f"PostgreSQL did not start: {err}")
    try:
        yield server
    finally:
        server.stop()


def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """Yield a URL to a fresh, empty database on ``backend`` (``sqlite`` or ``postgresql``), dropped after."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"t{os.getpid()}_{next(_counter)}"
    url = server.create_database(name)
    try:
        yield url
    finally:
        server.drop_database(name)
