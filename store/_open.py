"""Opening a database for ``open_store``: the checks made before connecting, then the engine.

A SQLite file is looked at read-only first (``_engine.probe_sqlite``): a damaged file, a schema
written by a newer autoslapo, or a database that is someone else's (tables, none of them
autoslapo's) is refused before anything is written to it. ``read_only`` is for commands that only
read: they never create a database or autoslapo's tables (a missing or empty file, or a SQLite database
with no tables at all, raises ``NoStore``: nothing is stored there yet), never take a write lock on a store
already at the head revision, and read a SQLite store in a directory SQLite cannot write to
through an immutable open (WAL mode keeps ``-wal``/``-shm`` files beside the database, which such
a directory cannot hold).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from autoslapo.errors import NoStore, StorageError
from store import _engine, _migrate
from store._schema import VERSION_TABLE
from store._url import check_sqlite_file, display, parse_url, resolve_url, sqlite_path

#: The tables Optuna's RDB storage makes (optuna/storages/_rdb/models.py): a SQLite file holding only
#: these is Optuna's database, which a store may share (``tune`` mirrors its trials into it).
OPTUNA_TABLES = frozenset({
    "studies", "study_directions", "study_user_attributes", "study_system_attributes", "trials", "trial_params",
    "trial_values", "trial_intermediate_values", "trial_user_attributes", "trial_system_attributes",
    "trial_heartbeats", "version_info", "alembic_version",
})


def not_ours(where: str, names: frozenset[str] | None) -> StorageError:
    """A database that holds no autoslapo tables: refused, with what it holds instead."""
    if names:
        shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return StorageError(
            f"not an autoslapo store: {where} holds other tables ({shown}) and none of autoslapo's (a store is "
            "a new file or one autoslapo made); it was left untouched; point --storage at an autoslapo store or "
            "at a new file"
        )
    return StorageError(
        f"not an autoslapo store: {where} holds no autoslapo tables yet (commands that only read never "
        "create them); run `autoslapo tune MODEL --gpus N` with this --storage first, or point --storage at "
        "an autoslapo store"
    )


def unwritable_directory(path: Path, *, wal: bool = False, exists: bool = True) -> StorageError:
    """The one-line error for a SQLite store whose directory SQLite cannot write to."""
    why = (f", and {str(path) + '-wal'!r} holds commits not yet in the database, which only a "
           "writable directory lets SQLite read" if wal else "")
    return StorageError(
        "the directory of a SQLite store must be writable (SQLite's WAL mode keeps -wal and -shm "
        f"files beside the database): {str(path.parent)!r} is not, for {str(path)!r}{why}; "
        + ("the file was left untouched" if exists else "nothing was written")
        + "; make the directory writable, or copy the database"
        + (" with its -wal file" if wal else "") + " to a writable directory and point --storage there"
    )


def _sqlite_immutable(path: Path, *, read_only: bool, exists: bool) -> bool:
    """Whether to open ``path`` immutable (a read in a directory SQLite cannot write); raises the
    one-line error when that cannot be done safely, or for a write there."""
    if os.access(path.parent, os.W_OK):
        return False
    if not read_only:
        raise unwritable_directory(path, exists=exists)
    if not exists:
        return False
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:  # commits an immutable open would not see
        raise unwritable_directory(path, wal=True)
    return True


def open_engine(url: str | None, *, read_only: bool = False) -> tuple[Engine, URL]:
    """``open_store``'s work: check the database at ``url``, bring its schema to the head (unless
    ``read_only`` finds it there already), and return its engine and parsed URL."""
    parsed = parse_url(resolve_url(url))
    where = display(parsed)
    immutable = False
    revision: str | None = None
    checked = False  # revision known without connecting (a SQLite file looked at read-only)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is None:
            if read_only:
                raise StorageError("a read-only store needs a file or server database: got in-memory SQLite; "
                                   "use sqlite:///file.db")
        else:
            parsed = parsed.set(database=str(path))
            exists = check_sqlite_file(path)
            immutable = _sqlite_immutable(path, read_only=read_only, exists=exists)
            if not exists and read_only:
                raise NoStore(f"no store at {where}: the file does not exist or is empty; run "
                                   "`autoslapo tune MODEL --gpus N` to make one, or point --storage at an existing store")
            if exists:
                existed = [p.exists() for p in _engine.sibling_files(path)]
                try:
                    revision, names = _engine.probe_sqlite(path, VERSION_TABLE, immutable=immutable)
                    _migrate.check_revision(revision, where)
                    # Optuna's own tables may be there first: its RDB storage shares the store's database
                    if read_only and not names:  # no tables at all (say `sqlite3 x.db VACUUM`): as a missing file
                        raise NoStore(str(not_ours(where, None)))
                    if VERSION_TABLE not in names and (names - OPTUNA_TABLES or read_only):
                        raise not_ours(where, names)
                except StorageError:
                    _engine.remove_new_siblings(path, existed)
                    raise
                checked = True
    engine = _engine.build_engine(parsed, read_only=read_only, immutable=immutable)
    try:
        if parsed.get_backend_name() == "postgresql":
            # Read-only look first, so a newer schema is refused before any lock or DDL.
            try:
                with engine.connect() as conn:
                    revision = _migrate.current_revision(conn)
            except SQLAlchemyError as err:
                raise _engine.storage_error(err, what="open the store", url=parsed) from None
            _migrate.check_revision(revision, where)
            if read_only and revision is None:
                raise not_ours(where, None)
            checked = True
        if read_only and checked and revision == _migrate.head_revision():
            return engine, parsed
        if immutable:  # an older schema needs an upgrade, which needs the -wal file
            raise unwritable_directory(Path(str(parsed.database)))
        _engine.with_retry(lambda: _migrate.upgrade(engine, where=where), what="open the store", url=parsed)
    except BaseException:
        engine.dispose()
        raise
    return engine, parsed
