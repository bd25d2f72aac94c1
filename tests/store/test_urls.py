"""Storage URLs: which are accepted, how they are shown, and that passwords never leak."""

from __future__ import annotations

import logging

import pytest

from autoslapo.errors import StorageError
from store import open_store
from store._url import parse_url
from tests.pgserver import PgServer, free_port

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("not a url", "storage URL must look like"),
        ("mysql://root@localhost/db", "storage backend must be sqlite or postgresql"),
        ("postgresql+psycopg2://u@h/db", "through psycopg 3"),
        ("postgresql://u@h:5432", "must name a database"),
        ("sqlite+aiosqlite:///x.db", "through Python's sqlite3"),
    ],
)
def test_malformed_urls_are_one_line_errors(url: str, match: str) -> None:
    with pytest.raises(StorageError, match=match) as caught:
        open_store(url)
    assert "\n" not in str(caught.value)


def test_postgres_urls_use_psycopg() -> None:
    assert parse_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert parse_url("postgresql://u@h/db").drivername == "postgresql+psycopg"


def test_passwords_never_appear(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql://autoslapo:{SECRET}@127.0.0.1:{port}/studies?connect_timeout=2"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StorageError) as caught:
        open_store(url)
    message = str(caught.value)
    assert SECRET not in message and "***" in message and "\n" not in message
    assert "PostgreSQL server" in message
    assert SECRET not in caplog.text
    with pytest.raises(StorageError) as bad:
        open_store(f"mysql://root:{SECRET}@localhost/db")
    assert SECRET not in str(bad.value)


@pytest.mark.postgres
def test_password_is_hidden_on_a_live_store(pg_server: PgServer) -> None:
    url = pg_server.base_url.replace("postgres@", f"postgres:{SECRET}@")  # trust auth ignores it
    with open_store(url) as db:
        assert SECRET not in db.url and SECRET not in repr(db) and ":***@" in db.url
        with pytest.raises(StorageError) as caught:
            db.get_study("missing")
        assert SECRET not in str(caught.value)
