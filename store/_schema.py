"""The tables autoslapo owns, as a SQLAlchemy 2.0 typed ORM (the head revision).

Table names carry an ``autoslapo_`` prefix because Optuna's RDB storage lives in the same
database and already owns ``studies``, ``trials`` and ``alembic_version``.
Every change here needs a new revision in ``store/migrations/versions``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from store._records import STUDY_STATUSES, TRIAL_STATUSES

#: Alembic's bookkeeping table for autoslapo (Optuna keeps ``alembic_version`` for itself).
VERSION_TABLE = "autoslapo_alembic_version"

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JsonType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware (SQLite keeps no zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    """The current time in UTC, timezone-aware."""
    return datetime.now(UTC)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class StudyRow(Base):
    __tablename__ = "autoslapo_studies"
    __table_args__ = (
        CheckConstraint(f"status IN ({_in(STUDY_STATUSES)})", name="status"),
        Index(None, "model_name", "gpus", "gpu_type"),
        Index(None, "model_signature", "gpus", "gpu_type"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    model_name: Mapped[str] = mapped_column(String(200))
    model_family: Mapped[str] = mapped_column(String(100))
    model: Mapped[dict[str, Any]] = mapped_column(JsonType)
    model_signature: Mapped[str] = mapped_column(String(128))
    cluster: Mapped[dict[str, Any]] = mapped_column(JsonType)
    cluster_fingerprint: Mapped[str] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_type: Mapped[str] = mapped_column(String(100))
    gpu_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    space_name: Mapped[str] = mapped_column(String(100))
    space_version: Mapped[str] = mapped_column(String(50))
    objective: Mapped[str] = mapped_column(String(50))
    backend: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(20), default="created")
    software: Mapped[dict[str, Any]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    # Revision 0005: the trials the study was asked to run (raised, never lowered); NULL: unknown (older rows).
    budget: Mapped[int | None] = mapped_column(Integer)


class TrialRow(Base):
    __tablename__ = "autoslapo_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        UniqueConstraint("study_id", "config_hash"),
        CheckConstraint(f"status IN ({_in(TRIAL_STATUSES)})", name="status"),
        # Revision 0002: serve best() for the two usual objectives (a top-k walk per study).
        Index("ix_autoslapo_trials_best", "study_id", "status", "samples_per_s"),
        Index("ix_autoslapo_trials_best_tokens", "study_id", "status", "tokens_per_s"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("autoslapo_studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JsonType)
    config_hash: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(20))
    samples_per_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    tflops_per_device: Mapped[float | None] = mapped_column(Float)
    hw_tflops_per_device: Mapped[float | None] = mapped_column(Float)  # revision 0002
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    step_time_spread_s: Mapped[float | None] = mapped_column(Float)
    final_loss: Mapped[float | None] = mapped_column(Float)  # revision 0002
    measured: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    host: Mapped[str] = mapped_column(String(255), default="")
    result: Mapped[dict[str, Any]] = mapped_column(JsonType)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# Reads go through Core rows, not ORM objects: no identity map, ~3x faster for long lists.
TRIAL_TABLE = cast(Table, TrialRow.__table__)
#: ``SELECT`` every column of the trials table (narrow it with ``.where``).
TRIALS = select(TRIAL_TABLE)


class CalibrationRow(Base):
    """Revision 0003: the cost model's correction for one cluster (``autoslapo.cost.correction``)."""

    __tablename__ = "autoslapo_calibrations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster_fingerprint: Mapped[str] = mapped_column(String(128), unique=True)
    params: Mapped[dict[str, Any]] = mapped_column(JsonType)
    n_trials: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
