"""Noise in measurements: median and spread of repeated samples, and a confidence interval for
the ratio of two medians (a speed-up). Pure functions of their arguments (seeded), no I/O.

A throughput measured once on a shared machine moves by several per cent from run to run; a
speed-up of two such numbers can move by more. ``ratio_ci`` resamples each side's repeats
independently (percentile bootstrap) and returns the ratio of the medians with the 2.5th and
97.5th percentiles of the resampled ratios. ``with_repeats`` folds the repeats of a trial into
its result: the median of every sample becomes the throughput, the samples and their spread go
to ``extra``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from autoslapo.errors import ConfigError
from autoslapo.result import TrialResult

__all__ = ["RatioCI", "median_spread", "ratio_ci", "repeat_samples", "with_repeats"]

#: Resamples of a bootstrap: enough that the percentiles move by well under 1% between seeds.
RESAMPLES = 4000


def median_spread(samples: Sequence[float]) -> tuple[float, float]:
    """Median and interquartile range of ``samples`` (IQR 0 for fewer than 2).

    Raises ConfigError for an empty sequence.
    """
    if not samples:
        raise ConfigError("a median needs at least one sample: got none")
    med = statistics.median(samples)
    if len(samples) < 2:
        return med, 0.0
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return med, q[2] - q[0]


@dataclass(frozen=True)
class RatioCI:
    """``ratio`` = median(a) / median(b) and its ``confidence`` interval [``low``, ``high``]."""

    ratio: float
    low: float
    high: float
    confidence: float
    n_a: int
    n_b: int

    @property
    def significant(self) -> bool:
        """True when the interval excludes 1.0 (a real speed-up or slow-down, not noise)."""
        return self.low > 1.0 or self.high < 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "confidence": self.confidence,
                "n_a": self.n_a, "n_b": self.n_b, "significant": self.significant}


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of a sorted list."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def ratio_ci(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
             resamples: int = RESAMPLES, seed: int = 0) -> RatioCI:
    """Ratio of medians ``median(a) / median(b)`` with a percentile-bootstrap interval.

    Each resample draws ``len(a)`` values from ``a`` and ``len(b)`` from ``b`` with replacement;
    the interval is the central ``confidence`` share of the resampled ratios. With one sample on
    a side that side does not vary (the interval then shows the other side's noise only).
    Raises ConfigError for an empty side, a non-positive sample, or a confidence outside (0, 1).
    """
    if not a or not b:
        raise ConfigError(f"a ratio of medians needs samples on both sides: got {len(a)} and {len(b)}")
    if any(not (x > 0 and math.isfinite(x)) for x in (*a, *b)):
        raise ConfigError(f"throughput samples must be positive and finite: got {list(a)} and {list(b)}")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must lie strictly between 0 and 1: got {confidence}")
    if resamples < 100:
        raise ConfigError(f"a bootstrap needs at least 100 resamples: got {resamples}")
    rng = random.Random(seed)
    xs, ys = list(a), list(b)
    ratios = sorted(
        statistics.median(rng.choices(xs, k=len(xs))) / statistics.median(rng.choices(ys, k=len(ys)))
        for _ in range(resamples)
    )
    tail = (1.0 - confidence) / 2.0
    return RatioCI(statistics.median(xs) / statistics.median(ys), _percentile(ratios, tail),
                   _percentile(ratios, 1.0 - tail), confidence, len(xs), len(ys))


def repeat_samples(result: TrialResult) -> list[float]:
    """Every throughput sample a result holds: its repeats if it has them, else its one value."""
    stored = result.extra.get("repeats_samples_per_s")
    if isinstance(stored, list) and stored:
        return [float(x) for x in stored]
    return [result.samples_per_s] if result.status == "complete" else []


def with_repeats(result: TrialResult, repeats: Sequence[TrialResult]) -> TrialResult:
    """``result`` with the throughput of ``repeats`` of the same configuration folded in.

    The samples are ``result``'s own (``repeat_samples``) then each complete repeat's. The new
    throughput is their median (tokens/s and TFLOP/s scaled alike, the step time inversely);
    ``extra`` gains ``repeats_samples_per_s`` (every sample, in order), ``samples_per_s_spread``
    (their IQR), ``samples_per_s_first`` (the first measurement) and ``repeat_failures`` (reasons
    of repeats that did not complete). A result that is not complete is returned unchanged.
    """
    if result.status != "complete":
        return result
    samples = repeat_samples(result) + [r.samples_per_s for r in repeats if r.status == "complete"]
    med, spread = median_spread(samples)
    factor = med / result.samples_per_s
    extra = dict(result.extra)
    extra.setdefault("samples_per_s_first", samples[0])
    extra["repeats_samples_per_s"] = samples
    extra["samples_per_s_spread"] = spread
    failures = list(extra.get("repeat_failures", [])) + [f"{r.status}: {r.reason}" for r in repeats
                                                         if r.status != "complete"]
    if failures:
        extra["repeat_failures"] = failures
    return replace(result, samples_per_s=med, tokens_per_s=result.tokens_per_s * factor,
                   tflops_per_device=result.tflops_per_device * factor,
                   hw_tflops_per_device=result.hw_tflops_per_device * factor,
                   step_time_s=result.step_time_s / factor if result.step_time_s else result.step_time_s,
                   extra=extra)


def interval_samples(ci: dict[str, Any]) -> str:
    """What a stored speed-up interval rests on, for its label: ``3 interleaved repeats`` when both sides
    hold the search's measurement and that many repeats, else ``medians of 5 and 3 measurements`` (a
    resumed study's finalist gains samples each run; the baseline keeps those it was picked with)."""
    reps, a, b = int(ci.get("repeats") or 0), ci.get("n_tuned"), ci.get("n_baseline")
    if a is None or b is None or a == b == reps + 1:
        return f"{reps} interleaved repeat{'s' if reps != 1 else ''}"
    return f"medians of {a} and {b} measurements"

