"""The Optuna mirror: every finished trial of a study also lands in an Optuna study of the same name.

The sampler's own Optuna study stays in memory and is rebuilt from the store on resume (fast, and
the store is the single source of truth). This mirror copies the store's finished trials into
Optuna's RDB storage on the *same* database (``Store.optuna_storage()``), so
``optuna-dashboard URL`` opens the search. It is written in batches (every ``every`` finished
trials, and at the end), and is idempotent: each mirrored trial carries its store number in the
user attribute ``autoslapo_number``, and a sync adds only the numbers the mirror lacks, so a resumed
study catches up what a killed tuner had not mirrored yet, without duplicates.

Mapping: ``complete`` -> COMPLETE with the throughput (and peak memory in GiB for a two-objective
study); ``oom``/``failed``/``timeout`` -> FAIL; ``pruned`` -> PRUNED. Params are the space's knob
values (categorical, as the dashboard shows them best); the rest goes to user attributes.

Tuners sharing a study (``--join``) each mirror only the trials they finished themselves, since
two of them catching up the same trial at once would add it twice (Optuna has no unique key to
refuse it); a later ``--resume`` of the study catches up everything.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError, StorageError
from search_spaces import BoundSpace

if TYPE_CHECKING:
    import optuna

    from store import Store, TrialRecord

NUMBER_ATTR = "autoslapo_number"
#: Finished trials between two mirror writes: large enough that the hot loop rarely pays a
#: transaction, small enough that a killed tuner leaves little to catch up.
DEFAULT_EVERY = 25


class OptunaMirror:
    """Copies a store study's finished trials into an Optuna study of the same name; see module doc.

    ``own_only``: mirror only the trial numbers passed to ``note`` (tuners sharing a study).
    ``retried_prefix``: failed trials whose reason starts with it are left out (they are re-run).
    The storage is opened at the first sync; a store Optuna cannot share (in-memory SQLite)
    disables the mirror (``disabled`` says why) instead of failing the search.
    """

    def __init__(self, store: Store, name: str, bound: BoundSpace, *, multi: bool = False,
                 every: int = DEFAULT_EVERY, own_only: bool = False, retried_prefix: str | None = None) -> None:
        self.store, self.name, self.bound = store, name, bound
        self.multi, self.every, self.own_only = multi, max(1, every), own_only
        self.retried_prefix = retried_prefix
        self.disabled: str | None = None
        self._study: optuna.Study | None = None
        self._mirrored: set[int] = set()
        self._own: set[int] = set()
        self._unsynced = 0
        self._dists: dict[str, optuna.distributions.BaseDistribution] | None = None

    # --- opening ---------------------------------------------------------------------------
    def _open(self) -> optuna.Study | None:
        if self._study is not None or self.disabled is not None:
            return self._study
        import optuna
        from sqlalchemy import event

        try:
            storage = self.store.optuna_storage(heartbeat_interval=None)
        except StorageError as err:
            self.disabled = str(err)
            return None
        if self.store.backend == "sqlite":
            # The mirror is re-derivable from autoslapo's tables, so it does not need an fsync per
            # Optuna transaction (Optuna writes each added trial in several); WAL keeps the file
            # consistent either way. This makes a batch ~3x faster on SQLite.
            @event.listens_for(storage.engine, "connect")
            def _relaxed_sync(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()

            storage.engine.dispose()  # reconnect so pooled connections get the pragma
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        directions: list[Literal["minimize", "maximize"]] = ["maximize", "minimize"] if self.multi else ["maximize"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(study_name=self.name, storage=storage, directions=directions,
                                        load_if_exists=True)
        existing: dict[str, optuna.distributions.BaseDistribution] = {}
        for t in study.get_trials(deepcopy=False):
            if NUMBER_ATTR in t.user_attrs:
                self._mirrored.add(int(t.user_attrs[NUMBER_ATTR]))
            existing.update(t.distributions)
        # A knob the Optuna study already has keeps its distribution (Optuna refuses another set of
        # choices for a name): a study resumed over another space (a new version, other pins) mirrors
        # a value outside those choices without that param; the store keeps the whole configuration.
        self._dists = {k: existing.get(k) or optuna.distributions.CategoricalDistribution(list(v))
                       for k, v in self.bound.domains.items()}
        self._study = study
        return study

    # --- writing ---------------------------------------------------------------------------
    def note(self, number: int | None = None) -> None:
        """One more finished trial (``number`` if known); syncs every ``every`` of them."""
        if number is not None and number >= 0:
            self._own.add(number)
        self._unsynced += 1
        if self._unsynced >= self.every:
            self.sync()

    def sync(self) -> int:
        """Mirror every finished store trial the Optuna study lacks; returns how many were added."""
        self._unsynced = 0
        study = self._open()
        if study is None:
            return 0
        todo = [t for t in self.store.trials(self.name)
                if t.status != "running" and t.number not in self._mirrored
                and (not self.own_only or t.number in self._own) and not self._to_retry(t)]
        if not todo:
            return 0
        frozen = [self._frozen(t, len(study.directions)) for t in todo]
        study.add_trials(frozen)
        self._mirrored.update(t.number for t in todo)
        return len(frozen)

    def _to_retry(self, t: TrialRecord) -> bool:
        # A trial a killed tuner left running is marked failed and re-run under its number: mirror
        # its final outcome, not the interruption (an Optuna trial cannot be rewritten).
        return bool(self.retried_prefix) and t.status == "failed" and t.reason.startswith(self.retried_prefix or "")

    def _frozen(self, t: TrialRecord, n_values: int) -> optuna.trial.FrozenTrial:
        import optuna

        assert self._dists is not None  # set by _open
        params: dict[str, Any] = {}
        try:
            point = self.bound.params_of(ScheduleConfig.from_dict(t.config))
        except (ConfigError, TypeError, KeyError):
            point = None
        if point is not None:
            params = {k: v for k, v in point.items() if k in self._dists and _allowed(self._dists[k], v)}
        # Few attributes: Optuna writes each in its own statements, the mirror's main cost. The
        # store number leads to everything else (``autoslapo show``).
        attrs: dict[str, Any] = {NUMBER_ATTR: t.number, "status": t.status, "measured": t.measured}
        if t.reason:
            attrs["reason"] = t.reason[:500]
        for key in ("tokens_per_s", "peak_memory_bytes"):
            value = getattr(t, key)
            if value is not None:
                attrs[key] = value
        state = {"complete": optuna.trial.TrialState.COMPLETE,
                 "pruned": optuna.trial.TrialState.PRUNED}.get(t.status, optuna.trial.TrialState.FAIL)
        values: list[float] | None = None
        if state == optuna.trial.TrialState.COMPLETE:
            values = [float(t.samples_per_s or 0.0)]
            if n_values > 1:
                values.append((t.peak_memory_bytes or 0) / 2**30)
        frozen = optuna.trial.create_trial(
            state=state, values=values, params=params,
            distributions={k: self._dists[k] for k in params}, user_attrs=attrs)
        _set_times(frozen, t.started_at, t.ended_at)
        return frozen


def _allowed(dist: optuna.distributions.BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one of a categorical distribution's choices (any value for another kind)."""
    choices = getattr(dist, "choices", None)
    return choices is None or value in choices


def _set_times(frozen: optuna.trial.FrozenTrial, start: datetime | None, end: datetime | None) -> None:
    # The dashboard shows durations: use the store's clock where it has one.
    if start is not None:
        frozen.datetime_start = start
    if end is not None:
        frozen.datetime_complete = end


def mirrored_numbers(trials: Iterable[optuna.trial.FrozenTrial]) -> list[int]:
    """The store numbers of mirrored Optuna trials (sorted; a duplicate appears twice)."""
    return sorted(int(t.user_attrs[NUMBER_ATTR]) for t in trials if NUMBER_ATTR in t.user_attrs)
