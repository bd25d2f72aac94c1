"""The Megatron-style baseline follows Megatron-LM's own advice (Narayanan et al. 2021, section 3):
the smallest model-parallel layout that fits, tensor parallelism first up to a node, then pipeline
stages; recomputation only where nothing fits without it. Before, it always took TP 8 (or the largest
TP the heads allow) and full recomputation, even for a model that fits one GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import autoslapo.layout as layout
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from store import Store, open_store
from tuner import StudyRunner, TuneOptions
from tuner.baselines import BaselineContext, megatron_candidates, megatron_config, megatron_layouts
from tuner.proposer import Prediction


@pytest.fixture
def mem_store() -> Iterator[Store]:
    s = open_store("sqlite://")
    try:
        yield s
    finally:
        s.close()


def _runner(store: Store, name: str, gpus: int, gpu_type: str, model: ModelSpec | None = None,
            **cluster: int) -> StudyRunner:
    return StudyRunner(TuneOptions(model=model or ModelSpec.from_name(name),
                                   cluster=ClusterSpec(gpus=gpus, gpu_type=gpu_type, **cluster),
                                   trials=1, prior_seeds=0, warm_start=False), store)


def _counting(ctx: BaselineContext) -> tuple[BaselineContext, Callable[[], int]]:
    """``ctx`` whose predictions are counted (distinct configurations, as the proposer caches them)."""
    seen: set[ScheduleConfig] = set()

    def predict(c: ScheduleConfig) -> Prediction:
        seen.add(c)
        return ctx.predict(c)
    return BaselineContext(ctx.bound, predict, ctx.evaluate, ctx.measured), lambda: len(seen)


def _fits(r: StudyRunner, mg: ScheduleConfig, *, tp: int | None = None, pp: int | None = None, micro_batch: int = 1,
          ckpt_ratio: float | None = None, sequence_parallel: bool | None = None,
          pipeline_schedule: str | None = None) -> bool:
    """Whether ``mg`` with these knobs changed (dp and accumulation following) is valid and predicted to fit."""
    tp, pp = tp or mg.tp, pp or mg.pp
    try:
        dp = layout.data_parallel(r.options.cluster.gpus, tp, pp)
        c = mg.with_(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch,
                     grad_accum=layout.grad_accum_for(r.bound.global_batch, micro_batch, dp),
                     ckpt_ratio=mg.ckpt_ratio if ckpt_ratio is None else ckpt_ratio,
                     sequence_parallel=mg.sequence_parallel if sequence_parallel is None else sequence_parallel,
                     pipeline_schedule=pipeline_schedule or mg.pipeline_schedule)
        c = c.validate(r.options.model, r.options.cluster)
    except ConfigError:
        return False
    return r.proposer.predict(c).fits


@pytest.mark.parametrize("name", ["bert-base", "bert-large"])
def test_megatron_baseline_of_a_model_that_fits_one_gpu_is_data_parallel_without_recomputation(
        mem_store: Store, name: str) -> None:
    """A model that fits one A100 needs no model parallelism (takeaway #2) and no recomputation (3.5):
    before, TP 8 (TP 4 for bert-base's 12 heads) with every layer recomputed, a strawman."""
    r = _runner(mem_store, name, 8, "a100-80gb")
    ctx, predictions = _counting(r.baseline_context())
    cands = megatron_candidates(ctx)
    assert cands and all((c.tp, c.pp, c.dp, c.ckpt_ratio) == (1, 1, 8, 0.0) for c in cands)
    mg = cands[0]
    # otherwise as Megatron runs: ZeRO 0, flash attention, its fused norm; the fastest micro-batch that fits
    assert mg.zero_stage == 0 and mg.attn_kernel == "flash" and not mg.sequence_parallel
    assert mg.fuse_bias_gelu  # Megatron's --bias-gelu-fusion, on by default
    assert r.proposer.predict(mg).fits
    assert all(r.proposer.predict(mg).samples_per_s >= r.proposer.predict(c).samples_per_s for c in cands)
    assert predictions() <= 13  # one layout, no recomputation: a prediction a micro-batch at most


@pytest.mark.parametrize(("name", "gpus", "gpu_type", "tp"), [
    ("llama-7b", 64, "a100-80gb", 2), ("llama-13b", 8, "a100-80gb", 4), ("opt-13b", 64, "h100-80gb", 4),
    ("t5-3b", 8, "v100-16gb", 4)])
def test_megatron_baseline_takes_the_smallest_tensor_parallel_degree_that_fits(
        mem_store: Store, name: str, gpus: int, gpu_type: str, tp: int) -> None:
    """Models too big for one GPU get just enough TP (takeaway #2), not always TP 8; smaller TP does
    not fit, even with every layer recomputed, at any micro-batch."""
    r = _runner(mem_store, name, gpus, gpu_type)
    mg = megatron_config(r.baseline_context())
    assert mg is not None and (mg.tp, mg.pp, mg.ckpt_ratio) == (tp, 1, 0.0)
    assert mg.dp == gpus // tp and r.proposer.predict(mg).fits
    assert _fits(r, mg, micro_batch=mg.micro_batch)  # the helper below sees what fits
    for smaller in (t for t in (1, 2, 4) if t < tp):
        assert not any(_fits(r, mg, tp=smaller, micro_batch=1, ckpt_ratio=ratio, sequence_parallel=sp)
                       for ratio in (0.0, 1.0) for sp in ((False, True) if smaller > 1 else (False,)))


def test_megatron_baseline_does_not_recompute_where_it_fits_without(mem_store: Store) -> None:
    """LLaMA-13B on 40 GB A100s needs TP 8; at TP 8 it fits without recomputation (micro-batch 2),
    which Megatron's advice prefers over recomputing to fit a larger micro-batch (before: full)."""
    r = _runner(mem_store, "llama-13b", 16, "a100-40gb")
    cands = megatron_candidates(r.baseline_context())
    assert cands and all((c.tp, c.pp, c.ckpt_ratio) == (8, 1, 0.0) and c.sequence_parallel for c in cands)
    assert not _fits(r, cands[0], tp=4, micro_batch=1, ckpt_ratio=1.0)


@pytest.mark.parametrize(("name", "gpus", "gpu_type", "tp", "pp"), [
    ("llama-13b", 16, "v100-16gb", 8, 2),  # TP 8 fills the node, then two stages, and still must recompute
    ("gpt2-xl", 8, "v100-16gb", 1, 2),  # 25 heads: no TP in (2, 4, 8) divides them, so stages at TP 1
    ("llama-70b", 64, "a100-40gb", 8, 4)])
def test_megatron_baseline_recomputes_only_where_nothing_fits_without_it(
        mem_store: Store, name: str, gpus: int, gpu_type: str, tp: int, pp: int) -> None:
    r = _runner(mem_store, name, gpus, gpu_type)
    cands = megatron_candidates(r.baseline_context())
    assert cands and all((c.tp, c.pp, c.ckpt_ratio) == (tp, pp, 1.0) for c in cands)
    mg = cands[0]
    assert r.proposer.predict(mg).fits and _fits(r, mg, micro_batch=mg.micro_batch)
    # at this layout nothing fits without recomputation, at any micro-batch, either schedule
    assert not any(_fits(r, mg, micro_batch=mb, ckpt_ratio=0.0, pipeline_schedule=s)
                   for mb in (1, 2, 4) for s in ("1f1b", "gpipe"))
    # and at a smaller model-parallel size nothing fits even recomputing every layer
    assert not _fits(r, mg, pp=pp // 2, micro_batch=1)


def test_megatron_layouts_fill_tensor_parallelism_within_a_node_before_pipeline_stages(mem_store: Store) -> None:
    """Takeaway #1's order: t x p ascending, pp only once tp is a node's (or the heads' largest divisor)."""
    from tuner.baselines import megatron_layouts

    r = _runner(mem_store, "bert", 64, "a100-80gb")
    assert megatron_layouts(r.baseline_context()) == [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8)]
    r = _runner(mem_store, "bert", 16, "a100-80gb", gpus_per_node=4)  # TP stays within a node of four
    assert megatron_layouts(r.baseline_context()) == [(1, 1), (2, 1), (4, 1), (4, 2), (4, 4)]
    r = _runner(mem_store, "gpt2-xl", 8, "v100-16gb")  # 25 heads: TP 1 only
    assert megatron_layouts(r.baseline_context()) == [(1, 1), (1, 2), (1, 4), (1, 8)]


def test_megatron_baseline_makes_a_bounded_number_of_predictions(mem_store: Store) -> None:
    """The baselines run on every tune: LLaMA-70B on 256 A100s walks five layouts (TP 1, 2, 4, 8,
    then TP 8 x PP 2, which fits); at most 13 micro-batches x 2 schedules x 2 recomputation settings a layout."""
    r = _runner(mem_store, "llama-70b", 256, "a100-80gb")
    ctx, predictions = _counting(r.baseline_context())
    mg = megatron_config(ctx)
    assert mg is not None and (mg.tp, mg.pp) == (8, 2) and r.proposer.predict(mg).fits
    assert predictions() <= 4 * 13 * 2 + 13 * 2 * 2


def test_a_configuration_both_baselines_pick_is_measured_once_stored_once_and_read_back_for_both(
        tmp_path: Path) -> None:
    """A ResNet on one device gets one configuration from both baselines (no model parallelism, no
    ZeRO without data parallelism, no recomputation where it fits). A study holds a configuration
    once: the companion dropped the second kind (a resumed study then re-measured it, the report
    missed it), and the second baseline measured it again, so the first run's two speed-ups differed
    and a resume served the first measurement for both."""
    import dataclasses
    from collections import Counter

    from autoslapo.cost import estimate
    from autoslapo.result import TrialResult
    from tuner import tune
    from tuner.baselines import deepspeed_config, stored_picks

    model, cluster = ModelSpec.from_name("resnet-50"), ClusterSpec(gpus=1, gpu_type="a100-80gb")
    calls: Counter[ScheduleConfig] = Counter()

    class Drifting:  # a real trial's evaluator, whose every repeat of a configuration reads 10 % faster
        name, instant = "drifting", False

        def evaluate(self, config: ScheduleConfig) -> TrialResult:
            calls[config] += 1
            r = estimate(model, config, cluster).to_trial_result()
            return dataclasses.replace(r, samples_per_s=r.samples_per_s * (1 + 0.1 * (calls[config] - 1)),
                                       measured=True)

    with open_store(f"sqlite:///{tmp_path / 'b.db'}") as store:
        r = _runner(store, "resnet-50", 1, "a100-80gb")
        ctx = r.baseline_context()
        assert deepspeed_config(ctx) == megatron_config(ctx) is not None  # the premise
        opts = TuneOptions(model=model, cluster=cluster, trials=3, prior_seeds=0, warm_start=False, study="one")
        first = tune(opts, store, evaluator=Drifting()).baselines
        assert max(calls.values()) == 1  # nothing measured twice
        assert first["deepspeed"]["samples_per_s"] == first["megatron"]["samples_per_s"]
        assert first["deepspeed"]["speedup"] == first["megatron"]["speedup"]
        rows = store.trials("one.baselines")
        assert len(rows) == 1 and rows[0].result["extra"]["baselines"] == ["deepspeed", "megatron"]
        picks = stored_picks(store, "one")
        assert set(picks) == {"deepspeed", "megatron"} and picks["deepspeed"][0] == picks["megatron"][0]
        again = tune(dataclasses.replace(opts, resume=True), store, evaluator=Drifting()).baselines
        assert {k: v["samples_per_s"] for k, v in again.items()} == {k: v["samples_per_s"] for k, v in first.items()}


def test_megatron_layouts_take_only_tensor_parallel_degrees_that_divide_a_node(mem_store: Store) -> None:
    # on 6-GPU nodes a TP 4 group (ranks 4-7) straddles two nodes, priced at NVLink's rate: refused
    r = _runner(mem_store, "llama-13b", 24, "a100-40gb", gpus_per_node=6)
    tps = {tp for tp, _ in megatron_layouts(r.baseline_context())}
    assert tps and all(6 % tp == 0 for tp in tps), tps
