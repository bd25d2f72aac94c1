"""For the tests of commands that only read: a directory that looks read-only to the store, for tests
that run as root (whom ``chmod a-w`` lets through: the store asks ``os.access`` whether SQLite could
write its side files there); a store of one study, and a file's digest (unchanged by a read)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec

STUDY = "bert-8"


def digest(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bert_store(path: Path, *, trial: bool = True) -> str:
    """A SQLite store at ``path`` made as ``tune`` makes one (``open_store(url)``, a writing open), holding
    study ``STUDY`` of bert-large on 8 devices, with one complete trial when ``trial``; its URL."""
    from store import open_store

    url = f"sqlite:///{path}"
    spec, cluster = ModelSpec.from_name("bert"), ClusterSpec(gpus=8, gpu_type="a100-80gb")
    with open_store(url) as db:
        db.create_study(STUDY, model=spec.to_dict(), cluster=cluster.to_dict(), space_name=spec.family,
                        space_version="1", objective="samples_per_s", backend="sim",
                        model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
        if trial:
            db.add_trial(STUDY, 0, ScheduleConfig(tp=1, pp=1, dp=8, micro_batch=4).to_dict(),
                         {"status": "complete", "samples_per_s": 100.0, "peak_memory_bytes": 20 * 2**30,
                          "step_time_s": 1.0})
    return url


def read_only_directory(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make ``directory`` look read-only to the store (as a read-only mount or ``chmod a-w`` does)."""
    real: Callable[..., bool] = os.access

    def access(path: os.PathLike[str] | str, mode: int, *args: object, **kwargs: object) -> bool:
        if Path(path) == directory and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
