"""The proposer: fixed distributions, never a known configuration twice, infeasible told not run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import Invalid, get_space, space_from_dict
from tuner import Prediction, Proposer, SimEvaluator
from tuner.baselines import deepspeed_config, megatron_config
from tuner.evaluators import PerturbedSimEvaluator, cost_prior

TINY = ModelSpec.from_name("bert-tiny")
CPU4 = ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=4)
SMALL = space_from_dict({"name": "s", "knobs": {"tp": [1, 2, 4], "micro_batch": [1, 2, 4, 8], "zero_stage": [0, 1]}})


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["tpe", "random", "grid", "nsga2"]), st.integers(0, 1000))
def test_a_small_space_is_exhausted_without_repeats(sampler: str, seed: int) -> None:
    bound = SMALL.bind(TINY, CPU4)
    ev = SimEvaluator(TINY, CPU4)
    p = Proposer(bound, sampler=sampler, seed=seed, prior=cost_prior(TINY, CPU4))
    seen = []
    while (prop := p.propose()) is not None:
        seen.append(prop.config)
        p.complete(prop, ev.evaluate(prop.config))
    assert len(seen) == len(set(seen)) == len(bound.configs())


def test_local_refinement_proposes_unmeasured_neighbours_of_the_best() -> None:
    bound = SMALL.bind(TINY, CPU4)
    ev = SimEvaluator(TINY, CPU4)
    p = Proposer(bound, seed=0, prior=cost_prior(TINY, CPU4), local_every=2)
    seen, sources = [], []
    while (prop := p.propose()) is not None:
        if prop.source == "local":
            best = max((c for c, r in p.measured.items() if r.ok), key=lambda c: p.measured[c].samples_per_s)
            # every searched knob, the later ones the space does not name included (loss_kernel, ...)
            knobs = [k for k in bound.domains if k != "zero_stage" or 1 not in (best.dp, prop.config.dp)]
            diff = [k for k in knobs if getattr(prop.config, k) != getattr(best, k)]  # zero is 0 when dp=1
            assert 1 <= len(diff) <= 2 or (len(diff) == 0 and prop.config.zero_stage != best.zero_stage)
        seen.append(prop.config)
        sources.append(prop.source)
        p.complete(prop, ev.evaluate(prop.config))
    assert "local" in sources and len(seen) == len(set(seen)) == len(bound.configs())


def test_a_repeat_of_a_measured_point_is_redirected_to_its_best_predicted_neighbour() -> None:
    """TPE landing on a measured point gets that point's best-predicted unmeasured one-knob neighbour,
    and the repeat stays out of its history (told as failed, not as a second copy of the value)."""
    import optuna

    bound = SMALL.bind(TINY, CPU4)
    ev = SimEvaluator(TINY, CPU4)
    prior = cost_prior(TINY, CPU4)
    p = Proposer(bound, seed=0, prior=prior)
    first = p.propose()
    assert first is not None
    p.complete(first, ev.evaluate(first.config))
    point = p._encode(first.config)
    assert point is not None
    p.study.enqueue_trial(point)  # the sampler's next ask is the measured point again
    prop = p.propose()
    assert prop is not None and prop.source == "neighbour"
    diff = [k for k in bound.domains if getattr(prop.config, k) != getattr(first.config, k)]
    assert len(diff) == 1 and prop.config not in p.measured
    # the best-predicted of the launchable one-knob neighbours
    options = []
    for k, dom in bound.domains.items():
        for v in dom:
            c = bound.derive({**bound.params_of(first.config), k: v})
            if c != first.config and not isinstance(c, Invalid) and prior(c).fits:
                options.append(prior(c).samples_per_s)
    assert prior(prop.config).samples_per_s == max(options)
    states = [t.state for t in p.study.get_trials(deepcopy=False)]
    assert states.count(optuna.trial.TrialState.FAIL) == 1
    assert states.count(optuna.trial.TrialState.COMPLETE) == 1  # the first trial only: no repeat told


def test_random_and_grid_samplers_keep_their_repeats() -> None:
    for sampler in ("random", "grid"):
        assert not Proposer(SMALL.bind(TINY, CPU4), sampler=sampler, seed=0).redirect_repeats


def test_known_configs_are_never_proposed_again() -> None:
    bound = SMALL.bind(TINY, CPU4)
    first = Proposer(bound, seed=1)
    done = []
    for _ in range(6):
        prop = first.propose()
        assert prop is not None
        done.append(prop.config)
        first.complete(prop, SimEvaluator(TINY, CPU4).evaluate(prop.config))
    # a re-created sampler with the same seed repeats its first proposals: they must be skipped
    again = Proposer(bound, seed=1)
    for c in done:
        again.add_known(c, SimEvaluator(TINY, CPU4).evaluate(c))
    for _ in range(4):
        prop = again.propose()
        assert prop is not None and prop.config not in done
        again.complete(prop, TrialResult.failure("failed", "x"))


def test_infeasible_predictions_are_pruned_and_reported() -> None:
    bound = SMALL.bind(TINY, CPU4)
    pruned = []

    def prior(c):  # a prior that says only tp=1 fits
        return Prediction(c.tp == 1, 1.0 / c.micro_batch, 0, "" if c.tp == 1 else "too big")

    p = Proposer(bound, seed=0, prior=prior)
    p.on_pruned = lambda c, why: pruned.append((c, why))
    got = []
    while (prop := p.propose()) is not None:
        got.append(prop.config)
        p.complete(prop, SimEvaluator(TINY, CPU4).evaluate(prop.config))
    assert got and all(c.tp == 1 for c in got)
    assert all(c.tp != 1 and why == "too big" for c, why in pruned)
    assert p.ranking()[0].micro_batch == 1  # best predicted first


def test_distributions_never_change_between_asks() -> None:
    bound = get_space("bert").bind(ModelSpec.from_name("bert"), ClusterSpec(gpus=64))
    p = Proposer(bound, seed=0)
    for _ in range(20):
        prop = p.propose()
        assert prop is not None
        p.complete(prop, TrialResult.failure("oom", "x"))
    dists = [t.distributions for t in p.study.trials]
    assert all(d == dists[0] for d in dists)


def test_baseline_configs_follow_their_recipes() -> None:
    from store import open_store
    from tuner import StudyRunner, TuneOptions

    store = open_store("sqlite://")
    r = StudyRunner(TuneOptions(model=ModelSpec.from_name("llama-13b"), cluster=ClusterSpec(gpus=16, gpu_type="a100-40gb"),
                                trials=1, prior_seeds=0, warm_start=False), store)
    ctx = r.baseline_context()
    ds, mg = deepspeed_config(ctx), megatron_config(ctx)
    assert ds is not None and ds.tp == ds.pp == 1 and ds.dp == 16 and r.proposer.predict(ds).fits
    assert ds.zero_stage >= 1  # 13B does not fit replicated on 40 GB
    # Megatron's advice (tuner.baselines.megatron_candidates): the smallest TP that fits, here 8 (13B at
    # ZeRO 0 does not fit 40 GB at TP 4), and no recomputation, as it fits without
    assert mg is not None and mg.tp == 8 and mg.ckpt_ratio == 0.0 and mg.sequence_parallel
    assert r.proposer.predict(mg).fits
    if mg.pp > 1:  # the fewest stages that fit
        fewer = mg.with_(pp=mg.pp // 2, dp=mg.dp * 2) if (mg.pp // 2) and 40 % (mg.pp // 2) == 0 else None
        assert fewer is None or not r.proposer.predict(fewer).fits
    store.close()


@pytest.mark.slow
def test_baselines_pick_their_micro_batch_and_zero_stage_like_their_users() -> None:
    from store import open_store
    from tuner import StudyRunner, TuneOptions
    from tuner.baselines import deepspeed_candidates, megatron_candidates

    store = open_store("sqlite://")
    r = StudyRunner(TuneOptions(model=ModelSpec.from_name("bert"), cluster=ClusterSpec(gpus=64, gpu_type="a100-80gb"),
                                trials=1, prior_seeds=0, warm_start=False), store)
    speed = lambda c: r.proposer.predict(c).samples_per_s  # noqa: E731
    ctx = r.baseline_context()
    mg = megatron_config(ctx)
    assert mg is not None and mg.tp == 1 and mg.pp == 1 and mg.ckpt_ratio == 0.0  # BERT-large fits one A100
    # not micro-batch 1: the fastest micro-batch that fits under the recipe
    others = [mg.with_(micro_batch=mb, grad_accum=512 // (mb * mg.dp)) for mb in (1, 2, 4, 8, 16, 32, 64)
              if 512 % (mb * mg.dp) == 0]
    assert mg.micro_batch > 1
    assert speed(mg) >= max(speed(c) for c in others if r.proposer.predict(c).fits)
    cands = megatron_candidates(ctx)
    assert all(c.tp == 1 and c.pp == mg.pp and c.ckpt_ratio == 0.0 for c in cands)
    # DeepSpeed: one candidate per ZeRO stage, each with the largest micro-batch that fits; the fastest first
    ds = deepspeed_candidates(ctx)
    assert sorted(c.zero_stage for c in ds) == [0, 1, 2, 3]
    assert all(c.tp == c.pp == 1 and c.micro_batch == 8 for c in ds)  # 512 / 64 ranks: 8 fits at every stage
    assert deepspeed_config(ctx) == ds[0] and speed(ds[0]) == max(speed(c) for c in ds)
    out = r.run()
    assert out.baselines["megatron"]["config"]["micro_batch"] > 1
    assert out.baselines["megatron"]["speedup"] < 5  # was ~30x with micro-batch 1 and 64 accumulation steps
    store.close()


def test_perturbed_landscape_differs_from_the_prior_but_is_reproducible() -> None:
    model, cluster = ModelSpec.from_name("bert"), ClusterSpec(gpus=64)
    cfgs = get_space("bert").bind(model, cluster).configs()[:200]
    a, b = PerturbedSimEvaluator(model, cluster, seed=1), PerturbedSimEvaluator(model, cluster, seed=1)
    sim = SimEvaluator(model, cluster)
    va = [a.evaluate(c).samples_per_s for c in cfgs]
    assert va == [b.evaluate(c).samples_per_s for c in cfgs]
    vs = [sim.evaluate(c).samples_per_s for c in cfgs]
    assert sum(abs(x - y) > 0.01 * y for x, y in zip(va, vs, strict=True) if y) > 100
    vc = [PerturbedSimEvaluator(model, cluster, seed=2).evaluate(c).samples_per_s for c in cfgs]
    assert va != vc


@pytest.mark.parametrize("name", ["grid"])
def test_grid_sampler_uses_the_index_space(name: str) -> None:
    bound = SMALL.bind(TINY, CPU4)
    p = Proposer(bound, sampler=name, seed=0)
    prop = p.propose()
    assert prop is not None and prop.config in bound.configs()


def test_megatron_baseline_drops_sequence_parallelism_where_the_family_refuses_it() -> None:
    from store import open_store
    from tuner import StudyRunner, TuneOptions

    store = open_store("sqlite://")
    # an ALBERT too wide for one 40 GB device (3.2 B parameters in its shared layer), so the baseline takes TP
    model = ModelSpec.from_name("albert-xxlarge").with_overrides(hidden=16384, ffn=65536)
    r = StudyRunner(TuneOptions(model=model, cluster=ClusterSpec(gpus=16, gpu_type="a100-40gb"),
                                trials=1, prior_seeds=0, warm_start=False), store)
    mg = megatron_config(r.baseline_context())
    assert mg is not None and mg.tp == 2 and mg.pp == 1 and not mg.sequence_parallel  # ALBERT: no SP (and no stages: they do not shrink its one shared layer)
    store.close()


@pytest.mark.parametrize(("name", "gpus", "gpu_type"), [("t5-large", 16, "a100-80gb"), ("t5-3b", 8, "v100-16gb"),
                                                       ("t5-tiny", 2, "cpu")])
def test_megatron_baseline_of_t5_runs_without_sequence_parallelism_and_flash(name: str, gpus: int, gpu_type: str) -> None:
    """T5 refuses sequence parallelism (its cross-attention reads the whole encoder output) and flash: every
    Megatron-style candidate was invalid, and the baseline was stored as an out-of-memory that never was."""
    from autoslapo.report import baseline_label
    from store import open_store
    from tuner import StudyRunner, TuneOptions

    store = open_store("sqlite://")
    r = StudyRunner(TuneOptions(model=ModelSpec.from_name(name), cluster=ClusterSpec(gpus=gpus, gpu_type=gpu_type),
                                trials=1, prior_seeds=0, warm_start=False), store)
    mg = megatron_config(r.baseline_context())
    # t5-large fits one A100 (TP 1: flash refused where the device has it); t5-3b needs TP 4 on 16 GB (SP refused)
    assert mg is not None and mg.tp == {"t5-3b": 4}.get(name, 1) and not mg.sequence_parallel
    assert mg.attn_kernel == "sdpa" and r.proposer.predict(mg).fits
    store.close()
    assert baseline_label("megatron", None) == "Megatron-LM style (none fits)"  # said "(TP 8, ...)" on 2 ranks
    assert baseline_label("megatron", mg.to_dict()).startswith(f"Megatron-LM style (TP {mg.tp}")


def test_baselines_of_a_convolutional_family_leave_its_inapplicable_knobs_at_their_defaults() -> None:
    """A Megatron-style recipe on ResNet-50, without the attention kernel and sequence parallelism a
    convolutional family refuses (before, no candidate was valid and the report said the baseline ran out
    of memory); it fits one device, so no TP and no recomputation (Megatron's advice)."""
    from store import open_store
    from tuner import StudyRunner, TuneOptions

    store = open_store("sqlite://")
    r = StudyRunner(TuneOptions(model=ModelSpec.from_name("resnet-50"), cluster=ClusterSpec(gpus=8),
                                trials=1, prior_seeds=0, warm_start=False), store)
    ctx = r.baseline_context()
    mg, ds = megatron_config(ctx), deepspeed_config(ctx)
    assert mg is not None and mg.tp == 1 and mg.ckpt_ratio == 0.0 and r.proposer.predict(mg).fits
    assert mg.attn_kernel == "sdpa" and not mg.sequence_parallel  # the defaults
    assert ds is not None and ds.tp == 1 and ds.dp == 8
    store.close()
