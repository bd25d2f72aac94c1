"""Alembic environment: runs on the connection ``store._migrate`` passes in, never from a URL.

The connection arrives inside a transaction that already holds the migration lock, so every
revision of one upgrade commits together or not at all.
"""

from __future__ import annotations

from alembic import context

from store._schema import VERSION_TABLE, Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "store migrations run through store.open_store() or store._migrate.upgrade(), "
        "which pass a connection; the alembic command line is not wired to a database"
    )

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    transaction_per_migration=False,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
