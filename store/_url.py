"""Storage URLs: where they come from, what they may be, and the checks made before connecting.

A SQLite file is inspected by its header bytes before SQLAlchemy (or SQLite) may open it, so a
file that is not a database is never written to and never gains ``-wal``/``-shm`` siblings.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from autoslapo.errors import StorageError
from autoslapo.redact import redact

ENV_VAR = "AUTOSLAPO_STORAGE"
DEFAULT_URL = "sqlite:///autoslapo.db"
SQLITE_HEADER = b"SQLite format 3\x00"
_FORMS = "sqlite:///path/to/file.db or postgresql://user@host:5432/dbname"


def resolve_url(url: str | None = None) -> str:
    """Return the storage URL to use: ``url``, else $AUTOSLAPO_STORAGE, else ``sqlite:///autoslapo.db``."""
    if url is not None and url.strip():
        return url.strip()
    env = os.environ.get(ENV_VAR, "").strip()
    return env or DEFAULT_URL


def parse_url(url: str) -> URL:
    """Parse and normalise a storage URL; raise StorageError for anything we cannot serve.

    ``postgres://`` and ``postgresql://`` are served by psycopg 3 (``postgresql+psycopg://``).
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as err:
        raise StorageError(
            f"storage URL must look like {_FORMS}: got {redact(url)!r} ({redact(str(err))}); "
            f"fix --storage or ${ENV_VAR}"
        ) from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    if backend == "postgresql":
        if driver not in ("", "psycopg"):
            raise StorageError(
                f"PostgreSQL is reached through psycopg 3: got driver {driver!r} in {redact(url)!r}; "
                "use postgresql://... or postgresql+psycopg://..."
            )
        if not parsed.database:
            raise StorageError(
                f"a PostgreSQL storage URL must name a database: got {redact(url)!r}; "
                "add /dbname, e.g. postgresql://user@host:5432/autoslapo"
            )
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise StorageError(
                f"SQLite is reached through Python's sqlite3: got driver {driver!r} in {redact(url)!r}; "
                "use sqlite:///path/to/file.db"
            )
        return parsed.set(drivername="sqlite")
    raise StorageError(
        f"storage backend must be sqlite or postgresql: got {parsed.drivername!r} in {redact(url)!r}; "
        f"use {_FORMS}"
    )


def display(url: URL) -> str:
    """The URL as it may be printed or logged: the password replaced by ``***``."""
    return redact(url.render_as_string(hide_password=False))


def sqlite_path(url: URL) -> Path | None:
    """The database file of a SQLite URL, made absolute; ``None`` for an in-memory database."""
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        return None
    if database.startswith("file:"):
        raise StorageError(
            f"SQLite URI filenames are not supported: got {database!r}; use sqlite:///path/to/file.db"
        )
    return Path(database).expanduser().absolute()


def check_sqlite_file(path: Path) -> bool:
    """Check that ``path`` can hold an autoslapo SQLite database, reading at most its header.

    Returns True when the file exists and is a SQLite database, False when it does not exist yet
    or is empty (SQLite treats an empty file as an empty database). Raises StorageError, without
    touching the file, when it is a directory, unreadable, or not a SQLite database.
    """
    if not path.parent.is_dir():
        raise StorageError(
            f"the directory of the SQLite database must exist: {str(path.parent)!r} does not; "
            "create it or point --storage elsewhere"
        )
    if not path.exists():
        return False
    if not path.is_file():
        raise StorageError(
            f"a SQLite storage URL must name a file: {str(path)!r} is not a regular file; "
            "point --storage at a .db file"
        )
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
    except OSError as err:
        raise StorageError(
            f"the SQLite database must be readable: {str(path)!r} gives {err.strerror}; fix its permissions"
        ) from None
    if not header:
        return False
    if len(header) < 100 or not header.startswith(SQLITE_HEADER):
        raise StorageError(
            f"the storage file must be a SQLite database: {str(path)!r} is not (its first bytes are "
            f"{header[:16]!r}); it was left untouched; point --storage at another path"
        )
    return True
