"""Noise statistics: median and spread, the bootstrap interval of a speed-up, repeats folded in."""

from __future__ import annotations

import random

import pytest

from autoslapo.errors import ConfigError
from autoslapo.result import TrialResult
from autoslapo.stats import median_spread, ratio_ci, repeat_samples, with_repeats


def test_median_and_interquartile_range() -> None:
    assert median_spread([3.0]) == (3.0, 0.0)
    med, iqr = median_spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0 and iqr == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="at least one sample"):
        median_spread([])


@pytest.mark.parametrize("n", [4, 20])
def test_the_95_percent_interval_covers_the_true_ratio_about_95_percent_of_the_time(n: int) -> None:
    # Synthetic throughputs: lognormal noise of 5% around 1.2 (tuned) and 1.0 (baseline). With
    # n = 4 (a search measurement + 3 repeats) the percentile bootstrap covers ~92% of the time.
    rng = random.Random(n)
    experiments, hits = 200, 0
    for i in range(experiments):
        a = [1.2 * rng.lognormvariate(0.0, 0.05) for _ in range(n)]
        b = [rng.lognormvariate(0.0, 0.05) for _ in range(n)]
        ci = ratio_ci(a, b, resamples=1000, seed=i)
        assert ci.low <= ci.ratio <= ci.high
        hits += ci.low <= 1.2 <= ci.high
    assert 0.88 <= hits / experiments <= 1.0


def test_the_interval_is_seeded_and_says_whether_it_excludes_one() -> None:
    a, b = [1.19, 1.25, 1.21, 1.16], [1.0, 1.02, 0.98, 1.01]
    ci = ratio_ci(a, b, seed=7)
    assert ci == ratio_ci(a, b, seed=7)
    assert ci.ratio == pytest.approx(1.20 / 1.005)
    assert ci.significant and ci.low > 1.0 and ci.to_dict()["significant"] is True
    overlap = ratio_ci([1.0, 1.1, 0.95, 1.05], [1.02, 0.97, 1.08, 1.0], seed=7)
    assert overlap.low < 1.0 < overlap.high and not overlap.significant


@pytest.mark.parametrize(
    ("a", "b", "kw", "match"),
    [([], [1.0], {}, "both sides"), ([1.0], [0.0], {}, "positive"), ([1.0], [1.0], {"confidence": 1.0}, "between"),
     ([1.0], [1.0], {"resamples": 10}, "100 resamples")],
)
def test_bad_inputs_are_refused(a: list[float], b: list[float], kw: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ratio_ci(a, b, **kw)  # type: ignore[arg-type]


def test_repeats_fold_into_the_median_with_their_spread() -> None:
    first = TrialResult("complete", samples_per_s=10.0, tokens_per_s=1280.0, tflops_per_device=2.0,
                        step_time_s=0.8, extra={"losses": [1.0]})
    repeats = [TrialResult("complete", samples_per_s=12.0), TrialResult.failure("timeout", "slow"),
               TrialResult("complete", samples_per_s=11.0)]
    r = with_repeats(first, repeats)
    assert r.samples_per_s == 11.0 and r.tokens_per_s == pytest.approx(1408.0)
    assert r.tflops_per_device == pytest.approx(2.2) and r.step_time_s == pytest.approx(0.8 / 1.1)
    assert r.extra["repeats_samples_per_s"] == [10.0, 12.0, 11.0] and r.extra["samples_per_s_first"] == 10.0
    assert r.extra["samples_per_s_spread"] == pytest.approx(1.0) and r.extra["losses"] == [1.0]
    assert r.extra["repeat_failures"] == ["timeout: slow"]
    assert repeat_samples(r) == [10.0, 12.0, 11.0]
    again = with_repeats(r, [TrialResult("complete", samples_per_s=13.0)])  # more repeats later (resume)
    assert again.extra["repeats_samples_per_s"] == [10.0, 12.0, 11.0, 13.0] and again.samples_per_s == 11.5
    assert TrialResult.from_dict(again.to_dict()) == again
    failed = TrialResult.failure("oom", "x")
    assert with_repeats(failed, repeats) is failed and repeat_samples(failed) == []
