"""A study's own budget: the trials it was asked to run (set by tune and the service, raised by a
resume or a join with more, never lowered). Existing studies keep NULL: unknown.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable, no default) works on SQLite without a table rebuild.
    op.add_column("autoslapo_studies", sa.Column("budget", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("autoslapo_studies") as batch:
        batch.drop_column("budget")
