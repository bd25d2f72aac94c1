"""A directory that looks read-only to the store, for tests that run as root (whom ``chmod a-w`` lets
through): the store asks ``os.access`` whether SQLite could write its side files there."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def read_only_directory(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Make ``directory`` look read-only to the store (as a read-only mount or ``chmod a-w`` does)."""
    real: Callable[..., bool] = os.access

    def access(path: os.PathLike[str] | str, mode: int, *args: object, **kwargs: object) -> bool:
        if Path(path) == directory and mode & os.W_OK:
            return False
        return real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
