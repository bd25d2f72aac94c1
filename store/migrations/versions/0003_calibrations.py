"""Per-cluster calibrations of the cost model (the prior that learns from measured trials).

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "autoslapo_calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_fingerprint", sa.String(length=128), nullable=False),
        sa.Column("params", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autoslapo_calibrations")),
        sa.UniqueConstraint("cluster_fingerprint", name=op.f("uq_autoslapo_calibrations_cluster_fingerprint")),
    )


def downgrade() -> None:
    op.drop_table("autoslapo_calibrations")
