"""The Optuna mirror: a study's finished trials, once each, in an Optuna study of the same name."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import space_for, space_from_dict
from store import Store, open_store
from tuner import SimEvaluator, StudyRunner, TuneOptions
from tuner.mirror import NUMBER_ATTR, OptunaMirror, mirrored_numbers

BERT = ModelSpec.from_name("bert")
A100_64 = ClusterSpec(gpus=64, gpu_type="a100-80gb")


@dataclass
class SomeOOM:
    """The cost model, except that every third configuration with ZeRO 0 runs out of memory."""

    inner: SimEvaluator
    name: str = "sim"
    instant: bool = True

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        if config.zero_stage == 0 and config.micro_batch % 3 != 1:
            return TrialResult.failure("oom", "CUDA out of memory (test)")
        return self.inner.evaluate(config)


def test_mirror_holds_exactly_the_studys_finished_trials(store: Store) -> None:
    # The first knob set's landscape, where 40 trials meet SomeOOM's failures.
    space = space_for("bert").pin({"ckpt_granularity": "full", "loss_kernel": "eager"})
    opts = TuneOptions(model=BERT, cluster=A100_64, trials=40, baselines=False, mirror_every=7, space=space)
    runner = StudyRunner(opts, store, evaluator=SomeOOM(SimEvaluator(BERT, A100_64)))
    runner.run()
    rows = {t.number: t for t in store.trials(runner.name)}
    study = optuna.load_study(study_name=runner.name, storage=store.url)  # what optuna-dashboard opens
    trials = study.get_trials(deepcopy=False)
    assert mirrored_numbers(trials) == sorted(rows)  # every finished trial, once
    assert {t.status for t in rows.values()} >= {"complete", "oom"}
    for ot in trials:
        rec = rows[ot.user_attrs[NUMBER_ATTR]]
        assert ot.user_attrs["status"] == rec.status
        assert ot.params == runner.bound.params_of(ScheduleConfig.from_dict(rec.config))
        if rec.status == "complete":
            assert ot.state == optuna.trial.TrialState.COMPLETE
            assert ot.values == [pytest.approx(rec.samples_per_s)]
        else:
            want = optuna.trial.TrialState.PRUNED if rec.status == "pruned" else optuna.trial.TrialState.FAIL
            assert ot.state == want and ot.values is None
    assert study.best_value == pytest.approx(max(t.samples_per_s or 0 for t in rows.values()))
    # idempotent: syncing again, or from a fresh mirror on the same database, adds nothing
    assert runner.mirror is not None and runner.mirror.sync() == 0
    assert OptunaMirror(store, runner.name, runner.bound).sync() == 0
    assert len(optuna.load_study(study_name=runner.name, storage=store.optuna_storage()).trials) == len(rows)


def test_mirror_is_written_in_batches(store: Store) -> None:
    # sampled, one trial at a time (a sweep stores its trials in one write)
    # 8 devices: the prior ranks the whole space first, and the batches, not the space, are the point
    opts = TuneOptions(model=BERT, cluster=ClusterSpec(gpus=8, gpu_type="a100-80gb"), trials=12, baselines=False,
                       mirror_every=5, sweep=False)
    runner = StudyRunner(opts, store)
    seen: list[int] = []
    orig = runner.mirror.sync  # type: ignore[union-attr]

    def counting() -> int:
        n = orig()
        seen.append(n)
        return n

    runner.mirror.sync = counting  # type: ignore[union-attr,method-assign]
    runner.run()
    assert seen == [5, 5, 2]  # two batches during the search, the rest at the end


@pytest.mark.slow
def test_in_memory_store_runs_without_a_mirror() -> None:
    store = open_store("sqlite://")
    try:
        runner = StudyRunner(TuneOptions(model=BERT, cluster=A100_64, trials=5, baselines=False), store)
        out = runner.run()
        assert out.launched == 5
        assert runner.mirror is not None and runner.mirror.disabled is not None
    finally:
        store.close()


@pytest.mark.slow
def test_a_study_resumed_over_another_space_is_still_mirrored(store: Store) -> None:
    # A study searched over a small space, then resumed over the family's (a new space version,
    # other pins): Optuna refuses other choices for a param it has, so the mirror keeps its first
    # distributions and leaves out a value outside them; every trial is mirrored, the search ends.
    small = space_from_dict({"name": "small", "version": "1", "knobs": {"tp": [1, 2], "micro_batch": [2, 4]},
                             "fixed": {"pp": 1, "zero_stage": 1}})
    first = TuneOptions(model=BERT, cluster=A100_64, trials=6, baselines=False, space=small, sampler="tpe",
                        sweep=False, study="moved")
    StudyRunner(first, store).run()
    wide = TuneOptions(model=BERT, cluster=A100_64, trials=20, baselines=False, sampler="tpe", sweep=False,
                       study="moved", resume=True)
    runner = StudyRunner(wide, store)
    runner.run()
    rows = {t.number: t for t in store.trials("moved")}
    trials = optuna.load_study(study_name="moved", storage=store.url).get_trials(deepcopy=False)
    assert mirrored_numbers(trials) == sorted(rows) and len(rows) == 20
    for ot in trials:
        full = runner.bound.params_of(ScheduleConfig.from_dict(rows[ot.user_attrs[NUMBER_ATTR]].config))
        assert ot.params.items() <= full.items()  # what it keeps is the trial's own
        for knob, choices in (("tp", (1, 2)), ("micro_batch", (2, 4))):
            if knob in ot.distributions:
                assert ot.distributions[knob].choices == choices  # type: ignore[attr-defined]
    assert any("micro_batch" not in ot.params or "tp" not in ot.params for ot in trials)  # left out
