"""Engines, connection settings (ours and Optuna's), retried transactions, and the SQLite pre-flight probe.

SQLite: WAL journal (readers never block the writer), a busy timeout, and write transactions that
start with ``BEGIN IMMEDIATE`` so two writers queue on the busy timeout instead of failing when a
read lock cannot be upgraded. PostgreSQL: psycopg 3 with a connect timeout and pre-ping.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from autoslapo.errors import StorageError
from autoslapo.redact import redact
from store._records import canonical_json
from store._url import display, sqlite_path

if TYPE_CHECKING:
    import optuna

T = TypeVar("T")

BUSY_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10
RETRIES = 8
# PostgreSQL SQLSTATEs worth retrying: serialization failure, deadlock, lock timeout, and the
# connection-exception class (08xxx), e.g. a server restart between two statements.
_PG_TRANSIENT = ("40001", "40P01", "55P03", "57P01", "08")
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")


def build_engine(url: URL, *, read_only: bool = False, immutable: bool = False) -> Engine:
    """Create the engine for ``url`` (already checked by ``parse_url``/``check_sqlite_file``).

    SQLite only: ``read_only`` leaves the journal mode as it is (no ``PRAGMA journal_mode`` write);
    ``immutable`` opens the file ``mode=ro&immutable=1`` (no locks, no ``-wal``/``-shm`` files), for
    a store in a directory SQLite cannot write to.
    """
    kwargs: dict[str, Any] = {"json_serializer": canonical_json, "future": True}
    if url.get_backend_name() == "sqlite":
        connect_args: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S, "check_same_thread": False}
        if url.database in (None, "", ":memory:"):
            kwargs["poolclass"] = StaticPool
        if immutable and url.database:
            uri = f"{Path(url.database).as_uri()}?mode=ro&immutable=1"
            kwargs["creator"] = lambda: sqlite3.connect(uri, uri=True, **connect_args)
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        _configure_sqlite(engine, wal=not (read_only or immutable))
        return engine
    connect_args = {} if "connect_timeout" in url.query else {"connect_timeout": CONNECT_TIMEOUT_S}
    return create_engine(url, connect_args=connect_args, pool_pre_ping=True, **kwargs)


def _configure_sqlite(engine: Engine, *, wal: bool = True) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module so BEGIN is ours (see "begin" below).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if wal and engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode = WAL")
        # NORMAL is durable in WAL mode except for the last commits before a power cut.
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def writer(engine: Engine) -> Engine:
    """The engine to use for read-write transactions (``BEGIN IMMEDIATE`` on SQLite)."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(sqlite_immediate=True)
    return engine


def is_transient(err: BaseException) -> bool:
    """True for lock, serialization, deadlock and dropped-connection errors worth a retry."""
    if isinstance(err, DBAPIError) and err.connection_invalidated:
        return True
    if not isinstance(err, OperationalError | DBAPIError):
        return False
    orig = getattr(err, "orig", None)
    sqlstate = getattr(orig, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate.startswith(_PG_TRANSIENT)
    text = str(orig).lower()
    if any(marker in text for marker in _SQLITE_TRANSIENT):
        return True
    # psycopg raises OperationalError without a SQLSTATE when the connection itself is lost.
    return isinstance(err, OperationalError) and orig is not None and "sqlite" not in type(orig).__module__


def with_retry(fn: Callable[[], T], *, what: str, url: URL) -> T:
    """Run ``fn`` (one whole transaction), retrying transient errors with jittered backoff.

    Raises StorageError when the retries run out or the error is not transient.
    """
    delay = 0.02
    for attempt in range(RETRIES + 1):
        try:
            return fn()
        except SQLAlchemyError as err:
            if attempt < RETRIES and is_transient(err):
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            raise storage_error(err, what=what, url=url) from None
    raise AssertionError("unreachable")  # pragma: no cover


class Transactions:
    """Short transactions on one database, each retried whole on transient errors.

    Reads use the plain engine; writes use ``writer(engine)`` (``BEGIN IMMEDIATE`` on SQLite).
    """

    def __init__(self, engine: Engine, url: URL) -> None:
        self.engine = engine
        self.writer = writer(engine)
        self.url = url

    def read(self, what: str, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in a read transaction; ``what`` names it in a StorageError."""

        def run() -> T:
            with Session(self.engine) as session, session.begin():
                return fn(session)

        return with_retry(run, what=what, url=self.url)

    def write(self, what: str, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in a write transaction; ``what`` names it in a StorageError."""

        def run() -> T:
            with Session(self.writer) as session, session.begin():
                return fn(session)

        return with_retry(run, what=what, url=self.url)

    def write_unique(self, what: str, fn: Callable[[Session], T]) -> T | None:
        """Like ``write``, but None (nothing written) when a unique constraint refuses it."""

        def run() -> T | None:
            try:
                with Session(self.writer) as session, session.begin():
                    return fn(session)
            except IntegrityError:
                return None

        return with_retry(run, what=what, url=self.url)


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception's text (driver messages span several)."""
    orig = getattr(err, "orig", None) or err
    for line in str(orig).splitlines():
        if line.strip():
            return line.strip()
    return type(orig).__name__


def storage_error(err: BaseException, *, what: str, url: URL) -> StorageError:
    """Translate a database error into a one-line StorageError with the password redacted."""
    detail = first_line(err)
    where = display(url)
    if "malformed" in detail or "not a database" in detail:
        return StorageError(
            f"the database must be intact to {what}: {where} reports {detail!r}; "
            "restore it from a backup or point --storage at a new file"
        )
    if url.get_backend_name() == "postgresql" and isinstance(err, OperationalError):
        return StorageError(
            f"cannot {what}: the PostgreSQL server at {where} answered {redact(detail)!r}; "
            "check that it is running and that the URL, user and database are right"
        )
    return StorageError(redact(f"cannot {what} in {where}: {detail}"))


@contextlib.contextmanager
def _readonly(path: Path, *, immutable: bool = False) -> Iterator[sqlite3.Connection]:
    mode = "mode=ro&immutable=1" if immutable else "mode=ro"
    conn = sqlite3.connect(f"{path.as_uri()}?{mode}", uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        yield conn
    finally:
        conn.close()


def sibling_files(path: Path) -> list[Path]:
    """The ``-wal`` and ``-shm`` files SQLite keeps next to a WAL-mode database."""
    return [Path(f"{path}-wal"), Path(f"{path}-shm")]


def probe_sqlite(path: Path, version_table: str, *, immutable: bool = False) -> tuple[str | None, frozenset[str]]:
    """Open an existing SQLite database read-only, check it, and return its autoslapo revision and
    the names of its tables and views (SQLite's own left out).

    Runs ``PRAGMA quick_check`` so a damaged file is refused before anything writes to it.
    The revision is ``None`` when autoslapo's tables were never created. Raises StorageError for a
    damaged file. The main file is never written (a read-only open of a WAL database may create
    ``-wal``/``-shm`` files; ``remove_new_siblings`` takes them away again on failure);
    ``immutable`` opens it without locks or side files (a directory SQLite cannot write to).
    """
    try:
        with _readonly(path, immutable=immutable) as conn:
            rows = conn.execute("PRAGMA quick_check").fetchall()
            if rows != [("ok",)]:
                text = " ".join(str(r[0]) for r in rows[:3]).replace("*** in database main ***", "")
                problem = " ".join(text.split())[:160]
                raise sqlite3.DatabaseError(f"database disk image is malformed ({problem})")
            names = frozenset(str(r[0]) for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
            ))
            if version_table not in names:
                return None, names
            row = conn.execute(f"SELECT version_num FROM {version_table}").fetchone()
            return (None if row is None else str(row[0])), names
    except sqlite3.Error as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise StorageError(
            f"the SQLite database must be intact: {str(path)!r} reports {detail!r}; it was left untouched; "
            "restore it from a backup or point --storage at a new file"
        ) from None


def remove_new_siblings(path: Path, existed: list[bool]) -> None:
    """Remove ``-wal``/``-shm`` files that appeared next to ``path`` during a failed open."""
    for sibling, was_there in zip(sibling_files(path), existed, strict=True):
        if not was_there:
            with contextlib.suppress(OSError):
                sibling.unlink()


def optuna_storage(
    url: URL, *, heartbeat_interval: int | None, grace_period: int | None
) -> optuna.storages.RDBStorage:
    """``Store.optuna_storage``: Optuna's RDB storage on ``url``, with our connection settings.

    Raises StorageError for in-memory SQLite (Optuna would see another database) or when Optuna
    cannot open the database.
    """
    import optuna

    sqlite = url.get_backend_name() == "sqlite"
    if sqlite and sqlite_path(url) is None:
        raise StorageError(
            "an Optuna study needs a file or server database: got in-memory SQLite; use sqlite:///file.db"
        )
    engine_kwargs: dict[str, Any] = (
        {"connect_args": {"timeout": BUSY_TIMEOUT_S}} if sqlite else {"pool_pre_ping": True}
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                url.render_as_string(hide_password=False),
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
            )
    except (SQLAlchemyError, RuntimeError) as err:
        raise storage_error(err, what="open Optuna's storage", url=url) from None
