"""Hardware TFLOP/s and final loss per trial; indexes for the best-schedule query.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable, no default) works on SQLite without a table rebuild.
    op.add_column("autoslapo_trials", sa.Column("hw_tflops_per_device", sa.Float(), nullable=True))
    op.add_column("autoslapo_trials", sa.Column("final_loss", sa.Float(), nullable=True))
    op.create_index(
        "ix_autoslapo_trials_best", "autoslapo_trials", ["study_id", "status", "samples_per_s"]
    )
    op.create_index(
        "ix_autoslapo_trials_best_tokens", "autoslapo_trials", ["study_id", "status", "tokens_per_s"]
    )


def downgrade() -> None:
    op.drop_index("ix_autoslapo_trials_best_tokens", table_name="autoslapo_trials")
    op.drop_index("ix_autoslapo_trials_best", table_name="autoslapo_trials")
    with op.batch_alter_table("autoslapo_trials") as batch:
        batch.drop_column("final_loss")
        batch.drop_column("hw_tflops_per_device")
