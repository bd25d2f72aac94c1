"""Probing just over capacity: a study that learns runs, now and then, the prior's best configuration
when its only fault is a predicted memory within the model's error band above the device's; a
probe that fits is found, one that runs out of memory ends probing, a study that does not learn never probes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from store import Store
from tuner import StudyRunner, TuneOptions
from tuner.probe import MEMORY_BAND, MemoryProbe

BASE = ModelSpec.from_name("bert-base")
V100 = ClusterSpec(gpus=16, gpu_type="v100-32gb")


@dataclass
class DeviceMemoryTruth:
    """The cost model as a real trial on a device whose memory differs from what the prior believes."""

    model: ModelSpec
    cluster: ClusterSpec  # the truth: its memory_bytes is the real capacity
    name: str = "truth"
    instant: bool = False
    seen: list[ScheduleConfig] = field(default_factory=list)

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        self.seen.append(config)
        e = estimate(self.model, config, self.cluster, validate=False)
        if not e.fits:
            return TrialResult.failure("oom", "CUDA out of memory", measured=True, oom_evidence="allocator")
        return TrialResult(status="complete", samples_per_s=e.samples_per_s, tokens_per_s=e.tokens_per_s,
                           peak_memory_bytes=e.memory_per_device_bytes, step_time_s=e.step_time_s, measured=True)


def _squeezed(store: Store) -> tuple[ClusterSpec, ScheduleConfig]:
    """A cluster whose memory sits 5 % under the model's unconstrained best configuration (so the
    prior prunes its own favourite), and that configuration."""
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100, trials=1, baselines=False, warm_start=False,
                                     mirror=False, study="scan", learn_prior=False), store)
    best = max(runner.bound.configs(), key=lambda c: runner.proposer.predict(c).samples_per_s)
    memory = runner.proposer.predict(best).memory_bytes
    return replace(V100, memory_bytes=int(memory / 1.05)), best


def _study(store: Store, believed: ClusterSpec, truth: ClusterSpec, *, trials: int = 25,
           learn: bool | None = None, name: str = "probe") -> tuple[StudyRunner, DeviceMemoryTruth]:
    evaluator = DeviceMemoryTruth(BASE, truth)
    runner = StudyRunner(TuneOptions(model=BASE, cluster=believed, trials=trials, baselines=False, warm_start=False,
                                     mirror=False, study=name, learn_prior=learn), store, evaluator=evaluator)
    return runner, evaluator


@pytest.mark.slow
def test_a_probe_finds_the_optimum_the_prior_prunes(store: Store) -> None:
    believed, favourite = _squeezed(store)
    truth = replace(believed, memory_bytes=int(believed.memory_bytes * 1.12))  # the device really has 12 % more
    runner, evaluator = _study(store, believed, truth)
    assert not runner.proposer.predict(favourite).fits
    runner.run()
    assert runner.prober.probes and all(status == "complete" for _, status in runner.prober.probes)
    assert not runner.prober.stopped
    # the best trial is one the prior predicts over capacity: without the probe it was never run
    assert runner.best_config in {c for c, _ in runner.prober.probes}
    assert not runner.proposer.predict(runner.best_config).fits
    stored = store.find_trial("probe", runner.best_config.to_dict())
    assert stored is not None and stored.status == "complete"
    # the budget counts the probe as a launched trial, and no trial runs twice
    assert len(evaluator.seen) == len(set(evaluator.seen)) == runner.launched == 25
    # bounded: at most one probe every PROBE_EVERY launched trials
    assert len(runner.prober.probes) <= 25 // runner.prober.every


@pytest.mark.slow
def test_a_probe_that_runs_out_of_memory_ends_probing(store: Store) -> None:
    believed, _ = _squeezed(store)
    runner, _ = _study(store, believed, believed)  # the device has exactly what the prior believes
    runner.run()
    assert [status for _, status in runner.prober.probes] == ["oom"]  # and none after it
    assert "ran out of memory" in runner.prober.stopped
    probed = store.find_trial("probe", runner.prober.probes[0][0].to_dict())
    assert probed is not None and probed.status == "oom"
    resumed = StudyRunner(TuneOptions(model=BASE, cluster=believed, trials=30, baselines=False, warm_start=False,
                                      mirror=False, study="probe", resume=True), store,
                          evaluator=DeviceMemoryTruth(BASE, believed))
    assert "ran out of memory" in resumed.prober.stopped  # a resumed study does not probe again
    resumed.run()
    assert not resumed.prober.probes


@pytest.mark.slow
def test_no_probe_beyond_the_band_nor_in_a_study_that_does_not_learn(store: Store) -> None:
    believed, favourite = _squeezed(store)
    far = replace(believed, memory_bytes=int(believed.memory_bytes / (1 + MEMORY_BAND)))  # favourite > band over
    truth = replace(believed, memory_bytes=believed.memory_bytes * 2)
    runner, evaluator = _study(store, far, truth, trials=12)
    assert runner.prober.pool and all(runner.prober._within(runner.proposer.predict(c).memory_bytes, 1.5)
                                      for c in runner.prober.pool)
    runner.run()
    assert all(runner.proposer.predict(c).memory_bytes <= far.memory_bytes * (1 + MEMORY_BAND)
               for c, _ in runner.prober.probes)
    assert favourite not in evaluator.seen
    plain, seen = _study(store, believed, truth, trials=12, learn=False, name="plain")
    plain.run()
    assert not plain.prober.pool and not plain.prober.probes and favourite not in seen.seen


@pytest.mark.parametrize("kwargs", [{"band": 0.0}, {"band": 1.5}, {"every": 0}, {"capacity_bytes": -1}])
def test_probe_settings_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError, match="probe"):
        MemoryProbe(**{"capacity_bytes": 2**30, **kwargs})  # type: ignore[arg-type]
