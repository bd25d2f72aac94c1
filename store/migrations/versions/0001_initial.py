"""First schema: studies and trials.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
STUDY_STATUSES = "'created', 'running', 'complete', 'stopped', 'failed'"
TRIAL_STATUSES = "'running', 'complete', 'oom', 'failed', 'timeout', 'pruned'"


def upgrade() -> None:
    op.create_table(
        "autoslapo_studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("model_name", sa.String(200), nullable=False),
        sa.Column("model_family", sa.String(100), nullable=False),
        sa.Column("model", JSON, nullable=False),
        sa.Column("model_signature", sa.String(128), nullable=False),
        sa.Column("cluster", JSON, nullable=False),
        sa.Column("cluster_fingerprint", sa.String(128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(100), nullable=False),
        sa.Column("gpu_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("space_name", sa.String(100), nullable=False),
        sa.Column("space_version", sa.String(50), nullable=False),
        sa.Column("objective", sa.String(50), nullable=False),
        sa.Column("backend", sa.String(50), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("software", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_autoslapo_studies"),
        sa.UniqueConstraint("name", name="uq_autoslapo_studies_name"),
        sa.CheckConstraint(f"status IN ({STUDY_STATUSES})", name="ck_autoslapo_studies_status"),
    )
    op.create_index(
        "ix_autoslapo_studies_model_name_gpus_gpu_type",
        "autoslapo_studies",
        ["model_name", "gpus", "gpu_type"],
    )
    op.create_index(
        "ix_autoslapo_studies_model_signature_gpus_gpu_type",
        "autoslapo_studies",
        ["model_signature", "gpus", "gpu_type"],
    )
    op.create_table(
        "autoslapo_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("samples_per_s", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("tflops_per_device", sa.Float(), nullable=True),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.Column("step_time_s", sa.Float(), nullable=True),
        sa.Column("step_time_spread_s", sa.Float(), nullable=True),
        sa.Column("measured", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("result", JSON, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_autoslapo_trials"),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["autoslapo_studies.id"],
            name="fk_autoslapo_trials_study_id_autoslapo_studies",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("study_id", "number", name="uq_autoslapo_trials_study_id_number"),
        sa.UniqueConstraint("study_id", "config_hash", name="uq_autoslapo_trials_study_id_config_hash"),
        sa.CheckConstraint(f"status IN ({TRIAL_STATUSES})", name="ck_autoslapo_trials_status"),
    )


def downgrade() -> None:
    op.drop_table("autoslapo_trials")
    op.drop_index("ix_autoslapo_studies_model_signature_gpus_gpu_type", table_name="autoslapo_studies")
    op.drop_index("ix_autoslapo_studies_model_name_gpus_gpu_type", table_name="autoslapo_studies")
    op.drop_table("autoslapo_studies")
