"""One root exception for autoslapo, and the few kinds the CLI tells apart.

Messages state the rule, then the values, then the fix:
``tp*pp*dp must equal --gpus: got tp=8, pp=2, dp=2 (32) for --gpus 64; pick degrees whose product is 64``.
"""

from __future__ import annotations


class AutoslapoError(Exception):
    """Root of every error autoslapo raises on purpose.

    ``exit_code`` is what the CLI exits with: 2 for bad input, 1 for a runtime failure.
    """

    exit_code = 1


class UsageError(AutoslapoError):
    """Bad input from the user: unknown name, impossible value, conflicting flags."""

    exit_code = 2


class ConfigError(UsageError):
    """A knob, model or cluster description breaks a rule (checked before anything runs)."""


class ScheduleError(UsageError):
    """A primitive was misused: a size that does not divide, an unknown path, a bad cut."""


class StorageError(AutoslapoError):
    """The store cannot be opened or written (bad URL, not a database, newer schema)."""

    exit_code = 2


class NoStore(StorageError):
    """Nothing is stored at a SQLite URL yet: a missing or empty file, or a SQLite database with no
    tables at all, opened to read (a read never creates a store there; it reads as no studies)."""


class StorageLost(StorageError):
    """The store failed while a study was running: a runtime failure (what is stored is kept and the
    study resumes with ``--resume``), not bad input."""

    exit_code = 1


class VerifyError(AutoslapoError):
    """A schedule changed the function: an output or a gradient differs from the reference."""


class TrialError(AutoslapoError):
    """A trial could not be run at all (not the same as a trial that failed: that is data)."""
