"""One module per schema revision; alembic skips this file."""
