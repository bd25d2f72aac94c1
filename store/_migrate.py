"""Schema revisions: which one a database is at, and upgrading it to the head, programmatically.

No ``alembic.ini`` is read: the script directory is this package's ``migrations`` folder and the
connection is handed to ``env.py``. An upgrade runs in one transaction that first takes a lock
(``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL), so several processes opening a
fresh database at once migrate it exactly once.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection

from autoslapo.errors import StorageError
from store._engine import writer
from store._schema import VERSION_TABLE

MIGRATIONS = Path(__file__).with_name("migrations")
# Any constant works; it only has to be the same in every autoslapo process.
_PG_LOCK_KEY = 0x6175746F736C  # "autosl"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


@cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    """The newest schema revision this autoslapo knows."""
    head = _script().get_current_head()
    if head is None:  # pragma: no cover - the package ships revisions
        raise StorageError(f"no schema revisions found in {MIGRATIONS}; reinstall autoslapo")
    return head


def known_revisions() -> set[str]:
    """Every schema revision this autoslapo can upgrade from."""
    return {rev.revision for rev in _script().walk_revisions()}


def check_revision(revision: str | None, where: str) -> None:
    """Raise StorageError when ``revision`` was written by a newer autoslapo than this one."""
    if revision is not None and revision not in known_revisions():
        raise StorageError(
            f"the database schema must be one this autoslapo knows (up to {head_revision()}): "
            f"{where} is at revision {revision!r}, written by a newer autoslapo; it was left untouched; "
            "upgrade autoslapo (pip install -U autoslapo) or use another --storage"
        )


def current_revision(conn: Connection) -> str | None:
    """The autoslapo revision recorded in the database behind ``conn``, or None if none."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    row = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).first()
    return None if row is None else str(row[0])


def upgrade(engine: Engine, revision: str = "head", *, where: str = "the database") -> str:
    """Upgrade the database to ``revision`` (default: the head) and return the revision it is at.

    Does nothing when it is already there. Raises StorageError, before changing anything, when
    the database is at a revision this autoslapo does not know (a newer one).
    """
    target = head_revision() if revision == "head" else revision
    with writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
        current = current_revision(conn)
        check_revision(current, where)
        if current == target:
            return target
        cfg = _config()
        cfg.attributes["connection"] = conn
        # Alembic logs each step at INFO; the store stays quiet unless asked.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        command.upgrade(cfg, target)
    return target
