"""Fixtures for the service: a file store with tokens, the app over it, a worker thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.service import ServiceSettings, Worker, create_app, create_token
from store import Store, open_store


@pytest.fixture
def service_store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'svc.db'}") as store:
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
