"""A private, throwaway PostgreSQL server for tests: started on a free port, removed afterwards.

    with PgServer() as server:
        url = server.create_database("t1")   # postgresql+psycopg://postgres@127.0.0.1:PORT/t1

Its pytest fixtures are in tests/pgfixtures.py (this module imports no pytest: experiments use it).

The server runs from a temporary directory with fsync off (tests need speed, not durability),
listens on 127.0.0.1 and a Unix socket in that directory, and trusts local connections. As root
it runs as the ``postgres`` user, as PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_BIN_ENV = "AUTOSLAPO_PG_BIN"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def find_bin_dir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: $AUTOSLAPO_PG_BIN, Debian's layout, or PATH."""
    candidates: list[Path] = []
    if os.environ.get(PG_BIN_ENV):
        candidates.append(Path(os.environ[PG_BIN_ENV]))
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted(root.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0, reverse=True)
        candidates += [v / "bin" for v in versions]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for candidate in candidates:
        if (candidate / "initdb").is_file() and (candidate / "pg_ctl").is_file():
            return candidate
    return None


def unavailable_reason() -> str | None:
    """Why a private server cannot be started here, or None if it can."""
    if find_bin_dir() is None:
        return f"PostgreSQL binaries (initdb, pg_ctl) not found; install postgresql or set ${PG_BIN_ENV}"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root needs a 'postgres' user to own the server (PostgreSQL refuses root)"
        if shutil.which("runuser") is None:
            return "running as root needs runuser to start the server as 'postgres'"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One private PostgreSQL cluster; ``start()``/``stop()`` or use it as a context manager."""

    def __init__(self) -> None:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError(unavailable_reason() or "PostgreSQL binaries not found")
        self.bin_dir = bin_dir
        self.port = 0
        self.dir: Path | None = None
        self._as_postgres = os.geteuid() == 0

    @property
    def base_url(self) -> str:
        """URL of the server's default ``postgres`` database."""
        return self.url("postgres")

    def url(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this server (psycopg 3)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> PgServer:
        """Create a cluster in a temporary directory and start it on a free port."""
        self.dir = Path(tempfile.mkdtemp(prefix="autoslapo-pg-"))
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        os.chmod(self.dir, 0o700)
        data = self.dir / "data"
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )
        options = (
            "-c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c max_connections=200 -k {self.dir}"
        )
        last: subprocess.CalledProcessError | None = None
        for _ in range(3):  # the free port may be taken between probing and binding
            self.port = free_port()
            try:
                self._run(
                    str(self.bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(self.dir / "log"),
                    "-o",
                    f"-p {self.port} {options}",
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
                return self
            except subprocess.CalledProcessError as err:
                last = err
        self.stop()
        raise RuntimeError(f"PostgreSQL did not start: {last.stderr if last else ''}{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server log (for failure messages)."""
        if self.dir is None or not (self.dir / "log").exists():
            return ""
        return "\n".join((self.dir / "log").read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server at once and delete its directory."""
        if self.dir is None:
            return
        data = self.dir / "data"
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self, name: str) -> str:
        """Create an empty database ``name`` (lowercase identifier) and return its URL."""
        if not _NAME.match(name):
            raise ValueError(f"database names here must be lowercase identifiers: got {name!r}")
        self._admin(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name``, disconnecting whoever still uses it."""
        if not _NAME.match(name):
            raise ValueError(f"database names here must be lowercase identifiers: got {name!r}")
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

