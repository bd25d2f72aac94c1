"""The ``sim`` backend's search: score every valid configuration of the bound space, store the best.

The cost model estimates a configuration in tens of microseconds, so a study whose evaluator is
the cost model itself has no reason to sample: ``sweep_space`` scores every distinct valid
configuration (``BoundSpace.configs()``), counts them per status (``pruned``: predicted not to
fit, never scored further), and ranks the rest by samples/s, so the optimum it reports is the
model's exact optimum over the space. ``store_best`` keeps the best of them in the study, up to
its ``--trials`` budget (``trials`` means "trials stored" here), and writes the counts on the
optimum's row (``extra["sweep"]``): the store has no per-study summary column, and a resumed or
re-read study finds them there.

Sampling (``tuner/proposer.py``) stays the search for real trials, and for landscapes the
benchmarks build to test the sampler (``PerturbedSimEvaluator``, ``ReplayEvaluator``).

With ``exact`` (the evaluator is the same cost model as the prior, as ``SimEvaluator`` is) only
the stored best are evaluated again; the rest keep the prior's prediction, which the evaluator
would repeat. That is checked, not assumed: the first evaluated result that disagrees with its
prediction makes the sweep evaluate every configuration that fits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autoslapo.config import ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.result import TrialResult
from tuner.evaluators import SimEvaluator
from tuner.proposer import Prior
from tuner.walk import Tick, paced, valid_configs

if TYPE_CHECKING:
    from store import Store
    from tuner.study import StudyRunner

#: The key of the sweep's summary in the optimum's stored ``extra``.
SUMMARY_KEY = "sweep"


@dataclass(frozen=True)
class Sweep:
    """Every configuration of a bound space scored.

    ``scored``: distinct valid configurations; ``counts``: status -> configurations (``pruned``
    for those predicted not to fit); ``best``: the best ``keep`` complete ones, fastest first
    (ties keep the space's order); ``exact``: only ``best`` were re-evaluated (see the module);
    ``total``: the space's valid configurations, more than ``scored`` when a deadline stopped it.
    """

    scored: int
    counts: Mapping[str, int]
    best: tuple[tuple[ScheduleConfig, TrialResult], ...]
    elapsed_s: float
    exact: bool
    total: int | None = None

    @property
    def timed_out(self) -> bool:
        """The deadline stopped the sweep before it scored every configuration."""
        return self.total is not None and self.scored < self.total

    def summary(self, stored: int) -> dict[str, Any]:
        """JSON-safe: configurations scored, counts per status, ``stored`` trials, the optimum, the time
        (and, for a sweep the deadline stopped, ``"of"``: the space's valid configurations)."""
        top = self.best[0][1].samples_per_s if self.best else None
        return {"scored": self.scored, "counts": dict(sorted(self.counts.items())), "stored": stored,
                "best_samples_per_s": top, "elapsed_s": round(self.elapsed_s, 3),
                **({"of": self.total} if self.timed_out else {})}


def sweep_space(configs: Iterable[ScheduleConfig], predict: Prior, evaluate: Callable[[ScheduleConfig], TrialResult],
                *, keep: int, exact: bool = False, deadline: float | None = None,
                tick: Tick | None = None) -> Sweep:
    """Score every configuration of ``configs``; keep the best ``keep`` complete ones.

    ``predict``: the prior (fit and throughput); a configuration predicted not to fit is counted
    ``pruned``. ``evaluate``: the study's (instant) evaluator. ``exact``: the evaluator repeats the
    prior's throughput, so only the kept ones are evaluated (checked; see the module docstring).
    ``deadline`` (``time.monotonic()``): stop predicting there and keep the best of those scored
    (``Sweep.timed_out``); ``tick(done, total, unit)``: progress every ``TICK`` configurations.
    Returns a ``Sweep``; raises UsageError for a ``keep`` below 1.
    """
    if keep < 1:
        raise UsageError(f"a sweep keeps a positive number of trials: got keep={keep!r}; pass --trials 1 or more")
    started = time.monotonic()
    counts: dict[str, int] = {}
    fitting: list[tuple[ScheduleConfig, float]] = []
    scored = 0
    configs = list(configs)
    for config in configs:
        scored += 1
        p = predict(config)
        if p.fits:
            fitting.append((config, p.samples_per_s))
        else:
            counts["pruned"] = counts.get("pruned", 0) + 1
        if not paced(scored, len(configs), "configurations", deadline=deadline, tick=tick):
            break
    total = len(configs)
    best: list[tuple[ScheduleConfig, TrialResult]] = []
    if exact:
        fitting.sort(key=lambda cp: -cp[1])  # stable: ties keep the space's order
        for config, predicted in fitting[:keep]:
            r = evaluate(config)
            if r.status != "complete" or not math.isclose(r.samples_per_s, predicted, rel_tol=1e-9):
                exact = False  # the evaluator is not the prior after all: score everything
                break
            best.append((config, r))
        if exact:
            if fitting:
                counts["complete"] = len(fitting)
            return Sweep(scored, counts, tuple(best), time.monotonic() - started, True, total)
    results = [(config, evaluate(config)) for config, _ in fitting]
    for _, r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    done = sorted((cr for cr in results if cr[1].status == "complete"), key=lambda cr: -cr[1].samples_per_s)
    return Sweep(scored, counts, tuple(done[:keep]), time.monotonic() - started, False, total)


def store_best(store: Store, study: str, sweep: Sweep, *, budget: int,
               known: Mapping[ScheduleConfig, TrialResult]) -> list[tuple[int, ScheduleConfig, TrialResult]]:
    """Store the sweep's best configurations the study lacks, until it holds ``budget`` launched trials.

    ``known``: the study's launched trials already stored (a resumed or joined study), never
    written twice. A sweep that a ``--timeout`` cut short stored the best of what it had scored (its
    summary says ``of``); its resume, scoring the rest, adds those among the best ``budget`` of both,
    so the study holds the space's optimum (and may hold more than ``budget`` trials: stored ones are
    never removed). Writes in one
    transaction, so a killed tuner leaves all of them or none; then records ``Sweep.summary`` on the
    optimum's row (``extra["sweep"]``). Returns the newly stored ``(number, config, result)``, best first.
    """
    fresh = [(c, r) for c, r in sweep.best if c not in known]
    new = fresh[:max(0, budget - len(known))]
    if any("of" in (r.extra.get(SUMMARY_KEY) or {}) for r in known.values()):  # stored by a sweep cut short
        ours = [r.samples_per_s for r in known.values() if r.status == "complete"]
        # the best ``budget`` of both (a stable sort: a stored trial ranks before an equal fresh one)
        ranked = sorted([(v, 0, i) for i, v in enumerate(ours)] +
                        [(r.samples_per_s, 1, i) for i, (_, r) in enumerate(fresh)], key=lambda x: (-x[0], x[1]))
        keep = {i for _, from_sweep, i in ranked[:budget] if from_sweep}
        new = [cr for i, cr in enumerate(fresh) if i in keep]
    if new:
        store.add_new_trials(study, [(c.to_dict(), r.to_dict()) for c, r in new])
    rows = {t.config_hash: t for t in store.trials(study)}
    stored = sum(1 for t in rows.values() if t.status not in ("pruned", "running"))
    if sweep.best:
        top = rows.get(sweep.best[0][0].config_hash())
        if top is not None and top.status == "complete":
            extra = {**top.result.get("extra", {}), SUMMARY_KEY: sweep.summary(stored)}
            store.amend_trial(study, top.number, {**top.result, "extra": extra})
    out = []
    for c, r in new:
        row = rows.get(c.config_hash())
        if row is not None:
            out.append((row.number, c, r))
    return out



def run_sweep(runner: StudyRunner) -> str:
    """A study's search by sweep: score every configuration of ``runner``'s bound space, store the
    best up to its budget, keep the exact optimum on the runner (its best); returns "swept", or
    "timeout" when ``--timeout`` (``runner.deadline``) stopped it first: the best of those scored are stored."""
    tick = runner.tick("scoring the space by the cost model")
    configs = valid_configs(runner.bound, deadline=runner.deadline, tick=tick)
    if configs is None:  # --timeout passed while the space was walked: nothing scored, nothing stored
        runner.note("--timeout passed before any configuration was scored")
        return "timeout"
    sweep = sweep_space(configs, runner.proposer.predict, runner.evaluator.evaluate,
                        keep=runner.options.trials + len(runner.proposer.measured),
                        exact=type(runner.evaluator) is SimEvaluator, deadline=runner.deadline, tick=tick)
    for number, config, result in store_best(runner.store, runner.name, sweep, budget=runner.options.trials,
                                             known=runner.proposer.measured):
        runner.proposer.add_known(config, result)
        runner._count(config, result)
        if runner.mirror is not None:
            runner.mirror.note(number)
    runner.sweep, runner.counts, runner.pruned = sweep, dict(sweep.counts), sweep.counts.get("pruned", 0)
    if sweep.best:  # the model's optimum over the space, stored unless a resumed study was full
        runner.best_config, runner.best_result = sweep.best[0]
        runner.best = runner.best_result.samples_per_s
    runner.note(f"swept {sweep.scored:,} configurations")
    return "timeout" if sweep.timed_out else "swept"
