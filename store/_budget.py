"""A study's own budget: the trials it was asked to run, raised and never lowered, in one statement.

``UPDATE ... SET budget = CASE WHEN budget IS NULL OR budget < :trials THEN :trials ELSE budget END``
is atomic on both backends, so two tuners (or a tuner and the service) raising one study's budget at
once leave the larger of the two, never the smaller. ``updated_at`` is left alone: it is the tuner's
heartbeat (``silent_for``), and a raised budget says nothing about a tuner being alive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import case, select, update
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store._convert import study_record
from store._records import StudyRecord
from store._schema import StudyRow

if TYPE_CHECKING:
    from store._engine import Transactions


def check_budget(trials: int) -> int:
    """Return ``trials`` if it is a positive int; raise StorageError otherwise."""
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise StorageError(f"a study's budget must be a positive number of trials: got {trials!r}")
    return trials


def lift_budget(session: Session, name: str, trials: int) -> bool:
    """Raise study ``name``'s budget to ``trials`` in the caller's transaction (never lower it);
    False when there is no such study."""
    raised = case((StudyRow.budget.is_(None) | (StudyRow.budget < trials), trials), else_=StudyRow.budget)
    done = session.execute(update(StudyRow).where(StudyRow.name == name)
                           .values(budget=raised, updated_at=StudyRow.updated_at))
    return bool(done.rowcount)  # type: ignore[attr-defined]


class StudyBudgets:
    """``Store.raise_budget`` (``Store`` inherits it: its own module is full)."""

    _tx: Transactions

    if TYPE_CHECKING:
        def _no_study(self, name: str) -> StorageError: ...

    def raise_budget(self, name: str, trials: int) -> StudyRecord:
        """Raise study ``name``'s budget (the trials it was asked to run, ``StudyRecord.budget``) to
        ``trials`` and return the study; a smaller ``trials`` leaves it as it is (never lowered), a
        study with none yet (stored before revision 0005) gets ``trials``. One atomic statement, so
        tuners sharing a study never lower each other's. Raises StorageError when there is no such
        study or ``trials`` is not a positive int."""
        check_budget(trials)

        def lift(session: Session) -> StudyRecord | None:
            if not lift_budget(session, name, trials):
                return None
            return study_record(session.scalars(select(StudyRow).where(StudyRow.name == name)).one())

        found = self._tx.write(f"raise the budget of study {name!r}", lift)
        if found is None:
            raise self._no_study(name)
        return found
