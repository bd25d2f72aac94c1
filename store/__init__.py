"""The SQL store: studies and trials in SQLite (default) or PostgreSQL, with Alembic migrations.

    from store import open_store
    with open_store("sqlite:///autoslapo.db") as db:
        db.create_study("bert-64", model=..., cluster=..., ...)
        db.add_trial("bert-64", 0, config, result)
        db.best_trials("bert-large", gpus=64, gpu_type="a100-80gb")

Optuna's RDB storage shares the database (``Store.optuna_storage()``); autoslapo's own tables
are prefixed ``autoslapo_`` and migrate independently of Optuna's.
"""

from __future__ import annotations

from store._jobs import JobLimitError, JobQueue, JobRecord
from store._records import (
    FINISHED_STATUSES,
    RANK_METRICS,
    STUDY_STATUSES,
    TRIAL_STATUSES,
    DuplicateTrial,
    HistoryPoint,
    StudyRecord,
    StudySummary,
    TrialRecord,
    canonical_json,
    config_hash,
)
from store._schema import utcnow
from store._service_schema import JOB_FINISHED, JOB_STATUSES, TOKEN_ROLES
from store._store import Store, open_store
from store._tokens import TokenRecord, TokenTable
from store._url import DEFAULT_URL, ENV_VAR, check_sqlite_file, parse_url, resolve_url, sqlite_path

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "FINISHED_STATUSES",
    "JOB_FINISHED",
    "JOB_STATUSES",
    "RANK_METRICS",
    "STUDY_STATUSES",
    "TOKEN_ROLES",
    "TRIAL_STATUSES",
    "DuplicateTrial",
    "HistoryPoint",
    "JobLimitError",
    "JobQueue",
    "JobRecord",
    "Store",
    "StudyRecord",
    "StudySummary",
    "TokenRecord",
    "TokenTable",
    "TrialRecord",
    "canonical_json",
    "check_sqlite_file",
    "config_hash",
    "open_store",
    "parse_url",
    "resolve_url",
    "sqlite_path",
    "utcnow",
]
