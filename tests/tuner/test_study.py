"""End-to-end simulated studies: budget, pruning, deduplication, resume, warm start, samplers.

They test the sampler's path, so they ask for it (``sweep=False``): a plain sim study otherwise
scores its whole space (tests/tuner/test_sweep.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import space_from_dict
from store import Store
from tuner import SimEvaluator, StudyRunner, TuneOptions, tune
from tuner.evaluators import cost_prior

BERT = ModelSpec.from_name("bert")
A100_64 = ClusterSpec(gpus=64, gpu_type="a100-80gb")
TINY = ModelSpec.from_name("bert-tiny")
CPU4 = ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)
# A mid-sized case for the slower paths (fewer configurations to rank than BERT-large on 64).
BASE = ModelSpec.from_name("bert-base")
V100_16 = ClusterSpec(gpus=16, gpu_type="v100-32gb")


def _launched(store: Store, study: str) -> list:
    return [t for t in store.trials(study) if t.status != "pruned"]


@pytest.mark.slow
def test_sim_tune_ends_with_exactly_the_budget_of_distinct_trials(store: Store) -> None:
    # 16 devices (two nodes): a smaller space to rank than 64's, the same baselines' shapes
    cluster = ClusterSpec(gpus=16, gpu_type="a100-80gb")
    out = tune(TuneOptions(model=BERT, cluster=cluster, trials=25, baselines=True, sweep=False), store)
    launched = _launched(store, out.study)
    assert out.launched == len(launched) == 25 and out.stop_reason == "budget"
    assert len({t.config_hash for t in launched}) == 25
    assert all(ScheduleConfig.from_dict(t.config).validate(BERT, cluster) for t in launched)
    best = max(t.samples_per_s or 0 for t in launched)
    assert out.best_result is not None and out.best_result.samples_per_s == pytest.approx(best)
    b = out.baselines
    assert set(b) == {"deepspeed", "megatron"}
    assert b["deepspeed"]["config"]["tp"] == 1 and b["deepspeed"]["config"]["dp"] == 16
    # Megatron-style: BERT-large fits one A100, so data parallelism without recomputation (Megatron's advice)
    assert b["megatron"]["config"]["tp"] == 1 and b["megatron"]["config"]["ckpt_ratio"] == 0.0
    for v in b.values():
        assert v["speedup"] == pytest.approx(best / v["samples_per_s"])
    stored = store.trials(f"{out.study}.baselines")
    assert {t.result["extra"]["baseline"] for t in stored} == {"deepspeed", "megatron"}


def test_prior_top_prediction_is_tried_first(store: Store) -> None:
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100_16, trials=5, baselines=False, sweep=False), store)
    top = runner.proposer.ranking()[0]
    runner.run()
    first = store.trials(runner.name)[0]
    assert first.config_hash == store.find_trial(runner.name, top.to_dict()).config_hash  # type: ignore[union-attr]


def test_predicted_oom_is_pruned_and_not_counted(store: Store) -> None:
    llama = ModelSpec.from_name("gpt2-xl")
    cluster = ClusterSpec(gpus=16, gpu_type="v100-16gb")
    out = tune(TuneOptions(model=llama, cluster=cluster, trials=15, baselines=False, seed=3, sweep=False), store)
    rows = store.trials(out.study)
    pruned = [t for t in rows if t.status == "pruned"]
    assert out.launched == len(rows) - len(pruned) == 15
    assert out.pruned == len(pruned) and all("GiB" in t.reason for t in pruned)
    prior = cost_prior(llama, cluster)
    for t in rows:
        assert prior(ScheduleConfig.from_dict(t.config)).fits == (t.status != "pruned")
    assert len({t.config_hash for t in rows}) == len(rows)


def test_small_space_ends_with_every_feasible_config(store: Store) -> None:
    space = space_from_dict({"name": "small", "knobs": {"tp": [1, 2], "micro_batch": [1, 2, 4]},
                             "fixed": {"attn_kernel": "sdpa"}})
    out = tune(TuneOptions(model=TINY, cluster=CPU4, trials=50, space=space, baselines=False, sweep=False), store)
    feasible = space.bind(TINY, CPU4).configs()
    assert out.stop_reason == "exhausted"
    assert out.launched == len(feasible) == len(_launched(store, out.study))


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid", "cmaes", "nsga2", "gp"])
def test_every_sampler_runs_distinct_valid_trials(store: Store, sampler: str) -> None:
    if sampler == "cmaes":
        pytest.importorskip("cmaes")
    if sampler == "gp":
        pytest.importorskip("scipy")
    out = tune(TuneOptions(model=TINY, cluster=CPU4, trials=12, sampler=sampler, baselines=False,
                           prior_seeds=0, sweep=False), store)
    launched = _launched(store, out.study)
    assert len(launched) == len({t.config_hash for t in launched}) == 12
    for t in launched:
        ScheduleConfig.from_dict(t.config).validate(TINY, CPU4)


@pytest.mark.slow
def test_patience_and_timeout_stop_early(store: Store) -> None:
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=500, patience=5, baselines=False,
                           study="p", sweep=False), store)
    assert out.stop_reason == "patience" and out.launched < 500
    t0 = time.monotonic()
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=100000, timeout_s=1.0, baselines=False,
                           study="t", warm_start=False, sweep=False), store)
    assert out.stop_reason == "timeout" and time.monotonic() - t0 < 30


@dataclass
class SlowSim:
    """A real cost-model evaluator that is not instant (so trials are written as running first)."""

    inner: SimEvaluator
    name: str = "slow-sim"
    instant: bool = False

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        return self.inner.evaluate(config)


@dataclass
class CountingSim(SlowSim):
    """SlowSim that counts what it is asked to evaluate."""

    asked: list[ScheduleConfig] | None = None

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        self.asked = [*(self.asked or []), config]
        return self.inner.evaluate(config)


@pytest.mark.slow
def test_a_resumed_study_keeps_its_baselines_and_at_its_budget_measures_nothing(store: Store) -> None:
    shown: list[str] = []

    def run(trials: int, resume: bool) -> tuple[object, list[ScheduleConfig]]:
        sim = CountingSim(SimEvaluator(BASE, V100_16))
        out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=trials, study="b", resume=resume, sweep=False),
                   store, evaluator=sim, progress=lambda p: shown.append(p.last))
        return out, sim.asked or []

    def companion() -> dict[str, object]:
        return {t.result["extra"]["baseline"]: t.config for t in store.trials("b.baselines")}

    first, _ = run(4, False)
    picked = companion()
    # the phase after the search says what it runs (it was silent for minutes with real trials)
    assert any(s.startswith("scoring the deepspeed-style baseline: candidate 1 of 3") for s in shown), shown
    assert set(picked) == {"deepspeed", "megatron"}
    # at its budget: no trial, no baseline candidate evaluated again, the stored answer returned
    again, asked = run(4, True)
    assert asked == [] and again.baselines == first.baselines  # type: ignore[attr-defined]
    # with more budget: only the new trials are evaluated; the baselines stay the ones picked first
    more, asked = run(6, True)
    assert len(asked) == 2 and companion() == picked
    assert set(more.baselines) == {"deepspeed", "megatron"}  # type: ignore[attr-defined]


@dataclass
class InterruptedSim(SlowSim):
    """SlowSim whose user presses Ctrl-C during its third evaluation."""

    calls: int = 0

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        self.calls += 1
        if self.calls == 3:
            raise KeyboardInterrupt
        return self.inner.evaluate(config)


def test_a_study_stopped_by_its_user_is_stopped_not_running(store: Store) -> None:
    opts = TuneOptions(model=BASE, cluster=V100_16, trials=6, study="i", baselines=False, sweep=False)
    with pytest.raises(KeyboardInterrupt):
        tune(opts, store, evaluator=InterruptedSim(SimEvaluator(BASE, V100_16)))
    assert store.get_study("i").status == "stopped"
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=6, study="i", resume=True, baselines=False,
                           sweep=False), store)
    assert out.stop_reason == "budget" and store.get_study("i").status == "complete"


def test_ctrl_c_while_the_space_is_ranked_leaves_the_study_stopped_not_created(store: Store) -> None:
    def press_ctrl_c(p: object) -> None:  # the user gives up while the prior ranks the space
        if "ranking the space" in str(getattr(p, "last", "")):
            raise KeyboardInterrupt

    opts = TuneOptions(model=BASE, cluster=V100_16, trials=6, study="k", baselines=False, sweep=False)
    with pytest.raises(KeyboardInterrupt):
        tune(opts, store, evaluator=SlowSim(SimEvaluator(BASE, V100_16)), progress=press_ctrl_c)
    assert store.get_study("k").status == "stopped"  # was "created", empty, like a study never begun
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=6, study="k", resume=True, baselines=False,
                           sweep=False), store)
    assert out.stop_reason == "budget" and store.get_study("k").status == "complete"


def test_a_running_study_is_marked_alive_while_its_tuner_runs(store: Store) -> None:
    from tuner.heartbeat import heartbeat

    opts = TuneOptions(model=BASE, cluster=V100_16, trials=2, study="h", baselines=False, sweep=False)
    tune(opts, store)
    store.set_study_status("h", "running")
    first = store.get_study("h").updated_at
    with heartbeat(store, "h", every_s=0.05):
        time.sleep(0.5)
    beat = store.get_study("h").updated_at
    assert beat > first and store.get_study("h").status == "running"
    store.set_study_status("h", "stopped")  # stopped meanwhile (a cancel, another tuner): never revived
    with heartbeat(store, "h", every_s=0.05):
        time.sleep(0.3)
    assert store.get_study("h").status == "stopped"


@pytest.mark.slow
def test_resume_retries_interrupted_trials_and_keeps_finished_ones(store: Store) -> None:
    opts = TuneOptions(model=BASE, cluster=V100_16, trials=8, study="r", baselines=False)
    tune(opts, store, evaluator=SlowSim(SimEvaluator(BASE, V100_16)))
    finished = {t.number: t for t in store.trials("r")}
    # a tuner killed mid-trial leaves a running row behind
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100_16, trials=20, study="r", resume=True,
                                     baselines=False), store, evaluator=SlowSim(SimEvaluator(BASE, V100_16)))
    p, number = runner.propose()  # type: ignore[misc]
    assert store.get_trial("r", number).status == "running"  # type: ignore[union-attr]
    del runner
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=20, study="r", resume=True, baselines=False),
               store, evaluator=SlowSim(SimEvaluator(BASE, V100_16)))
    rows = _launched(store, "r")
    assert out.launched == len(rows) == 20 and len({t.config_hash for t in rows}) == 20
    retried = store.get_trial("r", number)
    assert retried is not None and retried.status == "complete"
    assert retried.config_hash == store.find_trial("r", p.config.to_dict()).config_hash  # type: ignore[union-attr]
    for n, t in finished.items():  # finished trials were kept, not re-run
        again = store.get_trial("r", n)
        assert again is not None and again.ended_at == t.ended_at
    # resuming a finished study runs nothing more
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=20, study="r", resume=True, baselines=False), store)
    assert out.launched == 20 and len(_launched(store, "r")) == 20


@pytest.mark.slow
def test_warm_start_from_a_nearby_gpu_count(store: Store) -> None:
    tune(TuneOptions(model=BASE, cluster=ClusterSpec(gpus=8, gpu_type="v100-32gb"), trials=10, study="w8", baselines=False, sweep=False), store)
    runner = StudyRunner(TuneOptions(model=BASE, cluster=V100_16, trials=5, study="w16", baselines=False, sweep=False),
                         store)
    sources = [s for _, s in runner.proposer._queue]
    assert sources[0] == "warm" and "prior" in sources
    runner.run()
    assert len(_launched(store, "w16")) == 5


def test_missing_optional_sampler_dependency_is_a_usage_error(store: Store) -> None:
    import importlib.util

    from autoslapo.errors import UsageError

    for sampler, module in (("cmaes", "cmaes"), ("gp", "scipy")):
        if importlib.util.find_spec(module) is None:
            with pytest.raises(UsageError, match=f"needs {module}|needs the {module}"):
                tune(TuneOptions(model=TINY, cluster=CPU4, trials=2, sampler=sampler, baselines=False), store)


def test_resume_refuses_another_cluster(store: Store) -> None:
    tune(TuneOptions(model=BASE, cluster=V100_16, trials=2, study="x", baselines=False), store)
    from autoslapo.errors import UsageError

    with pytest.raises(UsageError, match="same model and cluster"):
        tune(TuneOptions(model=BASE, cluster=ClusterSpec(gpus=8, gpu_type="v100-32gb"), trials=2, study="x", resume=True), store)


@pytest.mark.slow
def test_a_store_failing_mid_study_is_a_runtime_failure_and_keeps_what_is_stored(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoslapo.errors import StorageError, StorageLost

    first = tune(TuneOptions(model=BERT, cluster=A100_64, trials=10, baselines=False, sweep=False), store)
    kept = {t.number: t.config_hash for t in store.trials(first.study)}
    calls = {"n": 0}
    real = Store.claim_trial

    def flaky(self: Store, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] > 5:
            raise StorageError("cannot add trials in sqlite:///x.db: disk I/O error")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "claim_trial", flaky)
    with pytest.raises(StorageLost, match=r"disk I/O error; the study .* stopped mid-run.*--resume") as caught:
        tune(TuneOptions(model=BERT, cluster=A100_64, trials=400, baselines=False, study="second", sweep=False),
             store)
    assert caught.value.exit_code == 1 and "\n" not in str(caught.value)
    assert {t.number: t.config_hash for t in store.trials(first.study)} == kept
    monkeypatch.setattr(Store, "claim_trial", real)
    assert len([t for t in store.trials("second") if t.status == "complete"]) == 5  # stored before it
