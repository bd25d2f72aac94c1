"""The sim backend's sweep: every valid configuration scored, the best stored, the counts kept, resume."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import best_config
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import space_from_dict
from store import Store
from tuner import PerturbedSimEvaluator, SimEvaluator, StudyRunner, TuneOptions, tune
from tuner.evaluators import cost_prior
from tuner.sweep import SUMMARY_KEY, sweep_space

BASE = ModelSpec.from_name("bert-base")
V100_4 = ClusterSpec(gpus=4, gpu_type="v100-16gb")
GPT = ModelSpec.from_name("gpt2-large")  # on V100_4 some of its configurations do not fit
# The knobs ``best_config`` enumerates, over the same values, the rest fixed at what it uses.
SPACE = space_from_dict({
    "name": "as-best-config",
    "knobs": {"tp": "auto", "pp": "auto", "micro_batch": "auto", "ckpt_ratio": [0.0, 0.25, 0.5, 0.75, 1.0],
              "zero_stage": [0, 1, 2, 3], "attn_kernel": ["eager", "sdpa", "flash"],
              "sequence_parallel": [False, True]},
    "fixed": {"fuse_bias_gelu": False, "compile_layers": False, "pipeline_schedule": "1f1b"},
})
SMALL = space_from_dict({"name": "small", "knobs": {"tp": [1, 2], "micro_batch": [1, 2, 4, 8, 16, 32]},
                         "fixed": {"attn_kernel": "sdpa"}})


def _opts(**kw: object) -> TuneOptions:
    return TuneOptions(**{"model": BASE, "cluster": V100_4, "baselines": False, **kw})  # type: ignore[arg-type]


def test_every_valid_config_is_scored_and_the_counts_add_up(store: Store) -> None:
    configs = SPACE.bind(GPT, V100_4).configs()
    out = tune(_opts(model=GPT, space=SPACE, trials=30, study="s"), store)
    s = out.sweep
    assert s is not None and out.stop_reason == "swept"
    assert s["scored"] == len(configs) == sum(s["counts"].values())
    prior = cost_prior(GPT, V100_4)
    fits = sum(prior(c).fits for c in configs)
    assert s["counts"]["complete"] == fits and s["counts"]["pruned"] == len(configs) - fits > 0
    rows = store.trials("s")
    assert s["stored"] == out.launched == len(rows) == 30 and all(t.status == "complete" for t in rows)
    assert out.counts == s["counts"] and out.pruned == s["counts"]["pruned"]
    # the counts stay with the study: on the optimum's row
    assert rows[0].result["extra"][SUMMARY_KEY]["counts"] == s["counts"]


def test_the_stored_best_is_the_cost_models_optimum_over_the_space(store: Store) -> None:
    bound = SPACE.bind(GPT, V100_4)
    out = tune(_opts(model=GPT, space=SPACE, trials=10, study="b"), store)
    expected = best_config(GPT, V100_4, global_batch=bound.global_batch, fuse_bias_gelu=False,
                           compile_layers=False, pipeline_schedule="1f1b")
    rows = sorted(store.trials("b"), key=lambda t: -(t.samples_per_s or 0.0))
    assert rows[0].samples_per_s == pytest.approx(expected.samples_per_s, rel=1e-12)
    assert out.best_result is not None and out.best_result.samples_per_s == pytest.approx(expected.samples_per_s)
    # the stored ones are the best ten of the whole space, fastest first in trial-number order
    sim = SimEvaluator(GPT, V100_4)
    every = sorted((r.samples_per_s for r in map(sim.evaluate, bound.configs()) if r.status == "complete"),
                   reverse=True)
    assert [t.samples_per_s for t in sorted(rows, key=lambda t: t.number)] == pytest.approx(every[:10])


def test_resume_ends_with_the_same_stored_trials(store: Store) -> None:
    tune(_opts(space=SMALL, trials=4, study="r"), store)
    first = {t.number: (t.config_hash, t.ended_at) for t in store.trials("r")}
    out = tune(_opts(space=SMALL, trials=4, study="r", resume=True), store)
    assert {t.number: (t.config_hash, t.ended_at) for t in store.trials("r")} == first
    assert out.launched == 4 and out.sweep is not None and out.sweep["stored"] == 4
    # a larger budget adds the next best, and a study killed before its one write ends the same
    tune(_opts(space=SMALL, trials=6, study="r", resume=True), store)
    StudyRunner(_opts(space=SMALL, trials=6, study="fresh"), store)  # created, nothing stored yet
    tune(_opts(space=SMALL, trials=6, study="fresh", resume=True), store)
    assert sorted(t.config_hash for t in store.trials("r")) == sorted(t.config_hash for t in store.trials("fresh"))
    assert all(first[n][0] == store.get_trial("r", n).config_hash for n in first)  # type: ignore[union-attr]


def test_a_budget_larger_than_the_space_stores_every_fitting_config(store: Store) -> None:
    out = tune(_opts(space=SMALL, trials=500, study="all"), store)
    assert out.sweep is not None
    assert out.launched == out.sweep["counts"]["complete"] == len(store.trials("all"))


@dataclass
class Shifted:
    """The cost model with every throughput scaled per configuration: not the prior any more."""

    inner: SimEvaluator
    name: str = "shifted"
    instant: bool = True

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        r = self.inner.evaluate(config)
        if r.status != "complete":
            return r
        factor = 1.0 + (int(config.config_hash()[:4], 16) % 7) / 10
        return TrialResult.from_dict({**r.to_dict(), "samples_per_s": r.samples_per_s * factor})


def test_the_exact_shortcut_is_checked_against_the_evaluator() -> None:
    configs = SMALL.bind(BASE, V100_4).configs()
    prior, sim = cost_prior(BASE, V100_4), SimEvaluator(BASE, V100_4)
    fast = sweep_space(configs, prior, sim.evaluate, keep=5, exact=True)
    full = sweep_space(configs, prior, sim.evaluate, keep=5, exact=False)
    assert fast.exact and not full.exact
    assert fast.counts == full.counts and [c for c, _ in fast.best] == [c for c, _ in full.best]
    shifted = Shifted(sim)
    trusted = sweep_space(configs, prior, shifted.evaluate, keep=5, exact=True)
    truth = sorted((shifted.evaluate(c).samples_per_s for c in configs if prior(c).fits), reverse=True)
    assert not trusted.exact and [r.samples_per_s for _, r in trusted.best] == pytest.approx(truth[:5])
    with pytest.raises(UsageError, match="keeps a positive number"):
        sweep_space(configs, prior, sim.evaluate, keep=0)


def test_only_the_plain_cost_model_sweeps_unless_told(store: Store) -> None:
    perturbed = PerturbedSimEvaluator(BASE, V100_4, seed=1)
    out = tune(_opts(space=SMALL, trials=3, study="p"), store, evaluator=perturbed)
    assert out.sweep is None and out.launched == 3  # the benchmarks' landscapes test the sampler
    out = tune(_opts(space=SMALL, trials=3, study="p2", sweep=True), store, evaluator=perturbed)
    configs = SMALL.bind(BASE, V100_4).configs()
    truth = max(perturbed.evaluate(c).samples_per_s for c in configs if cost_prior(BASE, V100_4)(c).fits)
    assert out.sweep is not None and out.best_result is not None
    assert out.best_result.samples_per_s == pytest.approx(truth)
    out = tune(_opts(space=SMALL, trials=3, study="s3", sweep=False), store)
    assert out.sweep is None and out.stop_reason == "budget"
    with pytest.raises(UsageError, match="needs an estimating backend"):
        tune(_opts(backend="local", cluster=ClusterSpec(gpus=2, gpu_type="cpu", gpus_per_node=2),
                   model=ModelSpec.from_name("bert-tiny"), trials=2, sweep=True), store)
    with pytest.raises(UsageError, match="sweep must be"):
        _opts(sweep="yes")
