"""The prior that learns: real trials store their prediction, refit the cluster's correction, and
the proposer's prior moves toward the truth; later studies on the cluster start from it."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import device_perf, estimate
from autoslapo.cost.correction import Correction
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import space_for
from store import Store
from tuner import StudyRunner, TuneOptions
from tuner.learning import PREDICTED_MEMORY, PREDICTED_SAMPLES, KnobEffects, PriorLearner, fit_knob_effects

BASE = ModelSpec.from_name("bert-base")
V100_16 = ClusterSpec(gpus=16, gpu_type="v100-32gb")
PLANTED = Correction(compute=0.6, intra_bw=0.5, inter_bw=0.5, activation=1.4)


@dataclass
class PlantedEvaluator:
    """The cost model with a planted correction, counted as a real (measured) trial."""

    model: ModelSpec
    cluster: ClusterSpec
    truth: Correction
    name: str = "planted"
    instant: bool = False
    seen: list[ScheduleConfig] = field(default_factory=list)

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        self.seen.append(config)
        perf = self.truth.apply(device_perf(self.cluster))
        e = estimate(self.model, config, self.truth.apply_cluster(self.cluster), perf=perf, validate=False)
        if not e.fits:
            return TrialResult.failure("oom", "CUDA out of memory", measured=True, oom_evidence="allocator")
        return TrialResult(status="complete", samples_per_s=e.samples_per_s, tokens_per_s=e.tokens_per_s,
                           peak_memory_bytes=e.memory_per_device_bytes, step_time_s=e.step_time_s, measured=True)


def _prior_error(runner: StudyRunner, evaluator: PlantedEvaluator, configs: list[ScheduleConfig]) -> float:
    """Median |log(predicted / true)| throughput over ``configs`` with the runner's current prior."""
    errs = []
    for c in configs:
        true = evaluator.evaluate(c)
        pred = runner.proposer.predict(c)
        if true.status == "complete" and pred.samples_per_s > 0:
            errs.append(abs(math.log(pred.samples_per_s / true.samples_per_s)))
    return statistics.median(errs)


def test_measured_trials_refit_the_prior_and_shrink_its_error(store: Store) -> None:
    truth = PlantedEvaluator(BASE, V100_16, PLANTED)
    opts = TuneOptions(model=BASE, cluster=V100_16, trials=8, baselines=False, warm_start=False, mirror=False,
                       study="learn")
    runner = StudyRunner(opts, store, evaluator=truth)
    held_out = list(space_for(BASE.family).bind(BASE, V100_16).configs())[::97]
    before = _prior_error(runner, truth, held_out)
    runner.run()
    after = _prior_error(runner, truth, held_out)
    assert runner.learner.refits >= 5
    assert before > 0.3 and after < before / 2, (before, after, runner.learner.correction)
    got = runner.learner.correction
    assert 0.45 < got.compute < 0.8 and got.activation > 1.1
    # every real trial stores the prior's prediction beside its measurement
    launched = [t for t in store.trials("learn") if t.status != "pruned"]
    assert launched and all(PREDICTED_SAMPLES in t.result["extra"] and PREDICTED_MEMORY in t.result["extra"]
                            for t in launched)
    first = launched[0]
    assert first.result["extra"][PREDICTED_SAMPLES] > 1.3 * first.samples_per_s  # proposed before learning
    # the correction is stored by the cluster's fingerprint
    saved = store.calibration(V100_16.fingerprint())
    assert saved is not None and saved["params"] == got.to_dict() and saved["n_trials"] == runner.learner.refits


def test_a_later_study_on_the_cluster_starts_from_the_calibration(store: Store) -> None:
    store.save_calibration(V100_16.fingerprint(), PLANTED.to_dict(), 12)
    truth = PlantedEvaluator(BASE, V100_16, PLANTED)
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100_16, trials=3, baselines=False, warm_start=False,
                                     mirror=False), store, evaluator=truth)
    assert runner.learner.correction == PLANTED
    config = next(iter(space_for(BASE.family).bind(BASE, V100_16).configs()))
    assert math.isclose(runner.proposer.predict(config).samples_per_s, truth.evaluate(config).samples_per_s)
    other = ClusterSpec(gpus=8, gpu_type="v100-32gb")  # another fingerprint: no calibration
    assert PriorLearner(store, BASE, other, enabled=True).correction == Correction()


def test_instant_studies_neither_learn_nor_store_predictions(store: Store) -> None:
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100_16, trials=4, baselines=False, warm_start=False,
                                     mirror=False, study="sim"), store)
    runner.run()
    assert runner.learner.refits == 0 and store.calibration(V100_16.fingerprint()) is None
    assert all(PREDICTED_SAMPLES not in (t.result.get("extra") or {}) for t in store.trials("sim"))


def _planted_residuals(configs: list[ScheduleConfig], noise: float, seed: int = 1) -> list[tuple[ScheduleConfig, float]]:
    rng = random.Random(seed)
    return [(c, math.log(_planted(c)) + rng.gauss(0.0, noise)) for c in configs]


_PLANTED_EFFECTS = {("zero_stage", "3"): 0.8, ("attn_kernel", "'eager'"): 1.2, ("fuse_bias_gelu", "True"): 0.9}


def _planted(c: ScheduleConfig) -> float:
    return math.prod(_PLANTED_EFFECTS.get((k, repr(getattr(c, k))), 1.0) for k, _ in _PLANTED_EFFECTS)


def test_knob_effects_recover_planted_per_value_effects() -> None:
    """Residuals made of a hidden factor per knob value (and 2 % noise): the ridge fit, its ridge
    weighed by the evidence or fixed, finds each value's factor from 60 configurations; one
    configuration moves them little."""
    configs = random.Random(0).sample(list(space_for(BASE.family).bind(BASE, V100_16).configs()), 60)
    pairs = _planted_residuals(configs, 0.02)
    for got in (fit_knob_effects(pairs), fit_knob_effects(pairs, ridge=0.5)):
        for c in configs[:10]:
            assert got.factor(c) == pytest.approx(_planted(c), rel=0.06), c
    for ridge in (None, 0.5):
        one = fit_knob_effects([(configs[0], math.log(2.0))], ridge=ridge)
        assert 1.0 < one.factor(configs[0]) < 2.0  # the ridge holds a single point back
    assert fit_knob_effects([]).factor(configs[0]) == 1.0
    with pytest.raises(ConfigError, match="ridge must not be negative"):
        fit_knob_effects([], ridge=-1.0)
    with pytest.raises(ConfigError, match="positive finite"):
        KnobEffects({("tp", "1"): 0.0})


def test_noisy_residuals_move_the_knob_effects_less_than_clean_ones() -> None:
    """The same planted effects measured with 2 % and with 25 % noise (ranks oversubscribing CPU cores
    scatter that much): the evidence puts the noisy trials' ridge higher, so their effects stay nearer
    1 than a fixed ridge would leave them, while the clean trials' come out near the planted ones."""
    configs = random.Random(0).sample(list(space_for(BASE.family).bind(BASE, V100_16).configs()), 12)

    def spread(effects: KnobEffects) -> float:
        logs = [math.log(effects.factor(c)) for c in configs]
        return max(logs) - min(logs)

    planted = math.log(max(map(_planted, configs)) / min(map(_planted, configs)))
    clean = fit_knob_effects(_planted_residuals(configs, 0.02))
    noisy = [_planted_residuals(configs, 0.25, seed) for seed in range(8)]
    assert spread(clean) == pytest.approx(planted, rel=0.35)
    evidence = [spread(fit_knob_effects(p)) for p in noisy]
    fixed = [spread(fit_knob_effects(p, ridge=0.5)) for p in noisy]
    assert statistics.median(evidence) < 0.75 * statistics.median(fixed)


def test_knob_effects_skip_derived_and_inert_knobs() -> None:
    """ZeRO's stage measured where data parallelism runs says nothing of a layout without it (the
    stage is inert there and stored at its default), and dp / gradient accumulation follow from the
    searched knobs, so neither carries an effect."""
    configs = list(space_for(BASE.family).bind(BASE, V100_16).configs())
    stage0 = [c for c in configs if c.dp > 1 and c.zero_stage == 0][:8]
    stage1 = [c for c in configs if c.dp > 1 and c.zero_stage == 1][:8]
    without_dp = next(c for c in configs if c.dp == 1)
    assert stage0 and stage1 and without_dp.zero_stage == 0
    got = fit_knob_effects([(c, math.log(0.5)) for c in stage0] + [(c, 0.0) for c in stage1], ridge=0.5)
    assert got.effects[("zero_stage", "0")] < 0.9 * got.effects[("zero_stage", "1")]
    assert got.factor(stage0[0]) < 0.9 * got.factor(stage1[0])
    assert not any(k in {"dp", "grad_accum"} for k, _ in got.effects)
    only_zero = KnobEffects({("zero_stage", "0"): 0.5})
    assert only_zero.factor(stage0[0]) == 0.5 and only_zero.factor(without_dp) == 1.0


def test_a_learning_study_measures_the_corrected_priors_pick(store: Store) -> None:
    truth = PlantedEvaluator(BASE, V100_16, PLANTED)
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100_16, trials=6, baselines=False, warm_start=False,
                                     mirror=False, study="picks", prior_seeds=1, learned_every=1), store,
                         evaluator=truth)
    assert runner.proposer.shortlist  # the first prior's best, re-ranked after each refit
    runner.run()
    # after the first (seeded) trial, each refit queued the corrected prior's best unmeasured pick
    prior = runner.learner.prior()
    ranked = sorted((c for c in runner.proposer.shortlist if prior(c).fits), key=lambda c: -prior(c).samples_per_s)
    assert truth.seen[-1] in ranked[:6]
