"""The service's tables: API tokens (only an argon2 hash of each) and queued study jobs (revision 0004).

Kept apart from ``_schema.py`` so the tuner's tables read on their own; both share one metadata.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, CheckConstraint, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from store._schema import Base, JsonType, UTCDateTime, utcnow

TOKEN_ROLES: tuple[str, ...] = ("read", "submit", "admin")
JOB_STATUSES: tuple[str, ...] = ("queued", "running", "complete", "stopped", "failed", "cancelled")
#: A job in one of these is over: no worker claims it again.
JOB_FINISHED: tuple[str, ...] = ("complete", "stopped", "failed", "cancelled")


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class TokenRow(Base):
    __tablename__ = "autoslapo_tokens"
    __table_args__ = (CheckConstraint(f"role IN ({_in(TOKEN_ROLES)})", name="role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    key: Mapped[str] = mapped_column(String(32), unique=True)  # public part of the token, for the look-up
    role: Mapped[str] = mapped_column(String(20))
    secret_hash: Mapped[str] = mapped_column(String(255))  # argon2id of the whole token
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class JobRow(Base):
    __tablename__ = "autoslapo_jobs"
    __table_args__ = (
        CheckConstraint(f"status IN ({_in(JOB_STATUSES)})", name="status"),
        Index(None, "status", "lease_until"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study: Mapped[str] = mapped_column(String(200), unique=True)
    owner: Mapped[str] = mapped_column(String(100), default="")
    request: Mapped[dict[str, Any]] = mapped_column(JsonType)
    status: Mapped[str] = mapped_column(String(20), default="queued")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker: Mapped[str] = mapped_column(String(255), default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
