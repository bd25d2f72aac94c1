"""The model-file cache's upkeep: each use marks an entry, and entries unused for a while are removed.

A model file lives in ``model_cache_dir() / <sha256> /`` with its cached trace. Every load (the
command that names the file, a rank process that loads it by digest, a service that writes a sent
file) touches that folder's modification time, and ``prune`` removes folders no one has used for
``$AUTOSLAPO_MODEL_CACHE_DAYS`` days (default 30; 0 keeps everything). Workers prune after each
job and a server that takes model files when it starts, so a long-running service does not keep
every file ever sent to it. A study whose file was pruned writes it again from its job (the job
keeps the source) or from the user's path.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from autoslapo.errors import ConfigError, UsageError

CACHE_ENV = "AUTOSLAPO_MODEL_CACHE"
DAYS_ENV = "AUTOSLAPO_MODEL_CACHE_DAYS"
DEFAULT_DAYS = 30.0
_ENTRY = re.compile(r"[0-9a-f]{64}")


def cache_root() -> Path:
    """Where model files are kept by digest: ``$AUTOSLAPO_MODEL_CACHE`` or ``~/.cache/autoslapo/models``."""
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/autoslapo/models").expanduser()


def ensure_entry(digest: str, name: str, data: bytes) -> Path:
    """The cached file ``<digest>/<name>``, written (atomically) when this machine has none yet, and
    marked used. What a machine that never saw the file needs before it loads it by digest: a Ray
    node, a service worker.

    Raises: ConfigError when ``data`` is not the file ``digest`` names."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise ConfigError(f"the model file {name} does not match its digest {digest[:12]}: its bytes changed on "
                          "the way; run the command with the .py path again")
    path = cache_root() / digest / name
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-", suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    mark_used(digest)
    return path


def read_entry(digest: str, name: str) -> bytes:
    """The bytes of the cached file ``<digest>/<name>`` (to send where it is not cached).

    Raises: ConfigError when this machine's cache does not hold it."""
    try:
        return (cache_root() / digest / name).read_bytes()
    except OSError:
        raise ConfigError(f"the model file {name} with digest {digest[:12]} is not in the model cache "
                          f"{str(cache_root())!r}; run the command with the .py path on this machine first") from None


def mark_used(digest: str) -> None:
    """Note that the file ``digest`` was just used (best effort: a read-only cache is left as it is)."""
    with contextlib.suppress(OSError):
        os.utime(cache_root() / digest)


def max_age_days() -> float:
    """``$AUTOSLAPO_MODEL_CACHE_DAYS`` (0: never prune), else ``DEFAULT_DAYS``.

    Raises: UsageError for a value that is not a number of days >= 0."""
    text = os.environ.get(DAYS_ENV, "").strip()
    if not text:
        return DEFAULT_DAYS
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not days >= 0:  # also refuses nan
        raise UsageError(f"{DAYS_ENV} must be a number of days >= 0 (0 keeps every model file): got {text[:40]!r}; "
                         f"e.g. {DAYS_ENV}={DEFAULT_DAYS:g}")
    return days


def prune(max_age_s: float | None = None, *, now: float | None = None) -> list[str]:
    """Remove the cache's entries unused for more than ``max_age_s`` seconds (default: ``max_age_days()``;
    0 or less removes nothing). Returns the digests removed. Only ``<sha256>`` folders are touched."""
    age = max_age_days() * 86400.0 if max_age_s is None else max_age_s
    root = cache_root()
    if age <= 0 or not root.is_dir():
        return []
    cutoff = (time.time() if now is None else now) - age
    removed = []
    for entry in sorted(root.iterdir()):
        if not _ENTRY.fullmatch(entry.name) or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry)
                removed.append(entry.name)
    return removed
