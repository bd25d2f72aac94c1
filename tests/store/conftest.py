"""Fixtures for the store suite: every contract test runs on SQLite and on a private PostgreSQL.

The PostgreSQL server is real (the session fixture ``pg_server`` of tests/pgfixtures.py, shared by
every folder through tests/conftest.py, starts it on a free port and removes it afterwards). Where
it cannot start, its tests skip, except under CI=true, where a missing server is a failure rather
than a silently smaller suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store, open_store
from tests.pgfixtures import BACKENDS, database_url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend a contract test runs against."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL to a fresh, empty database on ``backend``."""
    yield from database_url(backend, tmp_path, request)


@pytest.fixture
def db(store_url: str) -> Iterator[Store]:
    """An open store on a fresh database of the test's backend."""
    store = open_store(store_url)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def study(db: Store) -> str:
    """The name of a fresh study in ``db``."""
    db.create_study("s", **study_kwargs())
    return "s"


def model_dict(preset: str = "bert-large", **overrides: Any) -> dict[str, Any]:
    """A model description as ModelSpec.to_dict() gives it."""
    model = dict(
        family="bert",
        preset=preset,
        hidden=1024,
        layers=24,
        heads=16,
        kv_heads=16,
        ffn=4096,
        seq_len=512,
        vocab=30522,
    )
    model.update(overrides)
    return model


def cluster_dict(
    gpus: int = 8, gpu_type: str = "a100-80gb", memory_bytes: int = 80 * 2**30
) -> dict[str, Any]:
    """A cluster description as ClusterSpec.to_dict() gives it."""
    return dict(gpus=gpus, gpus_per_node=min(gpus, 8), gpu_type=gpu_type, memory_bytes=memory_bytes)


def study_kwargs(
    preset: str = "bert-large", gpus: int = 8, gpu_type: str = "a100-80gb", memory_bytes: int = 80 * 2**30
) -> dict[str, Any]:
    """Keyword arguments for Store.create_study."""
    return dict(
        model=model_dict(preset),
        cluster=cluster_dict(gpus, gpu_type, memory_bytes),
        space_name="transformer",
        space_version="1",
        objective="samples_per_s",
        backend="sim",
        model_signature=f"sig-{preset}",
        cluster_fingerprint=f"fp-{gpus}-{gpu_type}",
    )


def config(i: int) -> dict[str, Any]:
    """A schedule config that differs for every ``i``."""
    return dict(tp=2 ** (i % 4), pp=1, dp=8 // 2 ** (i % 4), micro_batch=i, ckpt_ratio=0.5, attention="sdpa")


def result(
    i: int, status: str = "complete", *, measured: bool = False, peak: int | None = None
) -> dict[str, Any]:
    """A result dict as TrialResult.to_dict() gives it, with throughput growing with ``i``."""
    return dict(
        status=status,
        reason="" if status == "complete" else f"{status} at step 1",
        samples_per_s=100.0 + i if status == "complete" else None,
        tokens_per_s=(100.0 + i) * 512 if status == "complete" else None,
        tflops_per_device=50.0 + i / 10,
        hw_tflops_per_device=60.0 + i / 10,
        peak_memory_bytes=peak if peak is not None else (10 + i % 60) * 2**30,
        step_time_s=0.5,
        step_time_spread_s=0.01,
        final_loss=7.5,
        measured=measured,
        host="node-1",
    )
