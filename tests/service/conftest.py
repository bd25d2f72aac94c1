"""Fixtures for the service: a store with tokens, the app over it, a worker thread.

The store is an SQLite file unless a test parametrizes ``service_backend`` (``ON_BOTH``): then
it runs on SQLite and on the session's private PostgreSQL server too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.service import ServiceSettings, Worker, create_app, create_token
from store import Store, open_store
from tests.pgfixtures import BACKENDS, database_url

#: Run a test on SQLite and on PostgreSQL (direct parametrization overrides ``service_backend``).
ON_BOTH = pytest.mark.parametrize("service_backend", BACKENDS)


@pytest.fixture
def service_backend() -> str:
    return "sqlite"


@pytest.fixture
def service_url(service_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from database_url(service_backend, tmp_path, request)


@pytest.fixture
def service_store(service_url: str) -> Iterator[Store]:
    with open_store(service_url) as store:
        yield store


@pytest.fixture
def tokens(service_store: Store) -> dict[str, str]:
    return {role: create_token(service_store, f"t-{role}", role) for role in ("read", "submit", "admin")}


@pytest.fixture
def client(service_store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(service_store, ServiceSettings())) as c:
        yield c


@pytest.fixture
def worker(service_store: Store) -> Iterator[Worker]:
    w = Worker(service_store, lease_s=5.0, poll_s=0.1)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    w.stop()
    thread.join(timeout=60)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
