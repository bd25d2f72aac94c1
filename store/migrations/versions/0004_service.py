"""The service: API tokens (argon2 hashes only) and queued study jobs with worker leases.

Revision ID: 0004
Revises: 0003
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "autoslapo_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("key", sa.String(32), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("secret_hash", sa.String(255), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("revoked_at", TZ, nullable=True),
        sa.CheckConstraint("role IN ('read', 'submit', 'admin')", name="ck_autoslapo_tokens_role"),
        sa.PrimaryKeyConstraint("id", name="pk_autoslapo_tokens"),
        sa.UniqueConstraint("name", name="uq_autoslapo_tokens_name"),
        sa.UniqueConstraint("key", name="uq_autoslapo_tokens_key"),
    )
    op.create_table(
        "autoslapo_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("request", JSON, nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("worker", sa.String(255), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_until", TZ, nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'complete', 'stopped', 'failed', 'cancelled')",
            name="ck_autoslapo_jobs_status",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_autoslapo_jobs"),
        sa.UniqueConstraint("study", name="uq_autoslapo_jobs_study"),
    )
    op.create_index("ix_autoslapo_jobs_status_lease_until", "autoslapo_jobs", ["status", "lease_until"])


def downgrade() -> None:
    op.drop_index("ix_autoslapo_jobs_status_lease_until", table_name="autoslapo_jobs")
    op.drop_table("autoslapo_jobs")
    op.drop_table("autoslapo_tokens")
