"""Re-measure a real study's finalists and its baselines in interleaved repeats.

One measurement of a trial on a shared machine moves by several per cent between runs, and a
speed-up of two such measurements by more. After the search, the best ``FINALISTS`` complete
trials and the chosen baselines are measured again, ``repeats`` rounds of each configuration once
in turn (A B C A B C ...), so that a slow minute of the machine falls on every configuration
rather than on one. Each trial's throughput becomes the median of its samples (the search's
measurement and its repeats; ``autoslapo.stats.with_repeats``), stored in place of the single
one (``Store.amend_trial``), and each speed-up gets a bootstrap interval (``speedup_interval``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autoslapo.config import ScheduleConfig
from autoslapo.result import TrialResult
from autoslapo.stats import ratio_ci, repeat_samples, with_repeats

if TYPE_CHECKING:
    from tuner.study import StudyRunner, TuneOutcome

__all__ = ["FINALISTS", "interleaved", "record_speedups", "remeasure", "speedup_interval"]

#: How many of the study's best complete trials are re-measured.
FINALISTS = 3

Picked = tuple[str, ScheduleConfig | None, TrialResult]  # (baseline kind, its config, its result)


def interleaved(evaluate: Callable[[ScheduleConfig], TrialResult], configs: Sequence[ScheduleConfig],
                repeats: int, on_round: Callable[[dict[ScheduleConfig, list[TrialResult]]], None] | None = None,
                ) -> dict[ScheduleConfig, list[TrialResult]]:
    """Evaluate each distinct configuration ``repeats`` times, round by round (A B C A B C ...).

    Returns configuration -> its repeats' results, in order; a configuration listed twice is
    measured once a round. ``on_round`` sees the results so far after each round.
    """
    out: dict[ScheduleConfig, list[TrialResult]] = {c: [] for c in configs}
    for _ in range(repeats):
        for config in out:
            out[config].append(evaluate(config))
        if on_round is not None:
            on_round(out)
    return out


def speedup_interval(tuned: TrialResult | None, baseline: TrialResult, *, repeats: int,
                     seed: int = 0) -> dict[str, Any] | None:
    """The tuned trial's speed-up over ``baseline`` with its 95% interval, or None.

    None unless both completed and hold repeated samples. The dict: ``speedup`` (ratio of the
    medians), ``low``/``high``, ``confidence``, ``significant`` (the interval excludes 1.0),
    ``repeats`` and the samples on each side (``n_tuned``, ``n_baseline``).
    """
    if tuned is None or tuned.status != "complete" or baseline.status != "complete":
        return None
    a, b = repeat_samples(tuned), repeat_samples(baseline)
    if len(a) < 2 or len(b) < 2:
        return None
    ci = ratio_ci(a, b, seed=seed)
    return {"speedup": ci.ratio, "low": ci.low, "high": ci.high, "confidence": ci.confidence,
            "significant": ci.significant, "repeats": repeats, "n_tuned": ci.n_a, "n_baseline": ci.n_b}


def remeasure(runner: StudyRunner, outcome: TuneOutcome, picked: Sequence[Picked] = ()) -> list[Picked]:
    """Re-measure the study's finalists and the complete baselines in ``runner.options.repeats`` rounds.

    Amends every finalist's stored row with its repeats, makes the finalist with the highest
    median the outcome's best, and returns ``picked`` with the baselines' results folded in
    (their rows are written by the caller). Does nothing without repeats or for an instant
    (estimating) evaluator.
    """
    repeats = runner.options.repeats
    if repeats < 1 or runner.evaluator.instant:
        return list(picked)
    store, name = runner.store, runner.name
    done = sorted((t for t in store.trials(name, status="complete") if t.measured and t.samples_per_s),
                  key=lambda t: -(t.samples_per_s or 0.0))
    bases = [config for _, config, result in picked if config is not None and result.status == "complete"]
    runs: dict[ScheduleConfig, list[TrialResult]] = {}
    best: tuple[ScheduleConfig, TrialResult] | None = None
    finalists, rest = done[:FINALISTS], done[FINALISTS:]
    measured = 0

    def evaluate(config: ScheduleConfig) -> TrialResult:  # each measurement shown on the progress line
        nonlocal measured
        measured += 1
        runner.note(f"re-measuring the finalists and baselines ({repeats} round{'s' if repeats != 1 else ''}): run {measured}")
        return runner.evaluator.evaluate(config)

    while finalists:
        configs = [ScheduleConfig.from_dict(t.config) for t in finalists]
        group = list(zip(finalists, configs, strict=True))

        def store_round(sofar: dict[ScheduleConfig, list[TrialResult]], group: list[Any] = group) -> None:
            # each round's medians are stored as it ends: a study stopped (Ctrl-C) keeps the rounds it ran
            for trial, config in group:
                store.amend_trial(name, trial.number, with_repeats(TrialResult.from_dict(trial.result),
                                                                   sofar[config]).to_dict())

        runs.update(interleaved(evaluate, configs + bases, repeats, on_round=store_round))
        bases = []  # the baselines' rounds are the first finalists'
        for trial, config in group:
            result = with_repeats(TrialResult.from_dict(trial.result), runs[config])  # as stored by its last round
            if best is None or result.samples_per_s > best[1].samples_per_s:
                best = (config, result)
        # A finalist's median falls below its one lucky measurement; a trial measured once that is
        # still above the best median is measured again too, so the best stored is a median.
        top = best[1].samples_per_s if best is not None else 0.0
        finalists = [t for t in rest if (t.samples_per_s or 0.0) > top][:FINALISTS]
        rest = [t for t in rest if t not in finalists]
    if best is not None:
        outcome.best_config, outcome.best_result = best
        runner.best_config, runner.best_result, runner.best = best[0], best[1], best[1].samples_per_s
    return [(kind, config, with_repeats(result, runs[config]) if config in runs else result)
            for kind, config, result in picked]


def record_speedups(runner: StudyRunner, outcome: TuneOutcome, speedups: dict[str, dict[str, Any]]) -> None:
    """Store the speed-ups and their intervals with the best trial (``extra["speedup_ci95"]``,
    baseline name -> ``speedup_interval``'s dict)."""
    if outcome.best_config is None or outcome.best_result is None or not speedups:
        return
    row = runner.store.find_trial(runner.name, outcome.best_config.to_dict())
    if row is None or row.status != "complete":
        return
    extra = {**outcome.best_result.extra, "speedup_ci95": speedups}
    outcome.best_result = TrialResult.from_dict({**outcome.best_result.to_dict(), "extra": extra})
    runner.store.amend_trial(runner.name, row.number, outcome.best_result.to_dict())
