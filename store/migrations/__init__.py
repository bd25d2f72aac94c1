"""Alembic migrations for autoslapo's tables (run programmatically by ``store._migrate``)."""
