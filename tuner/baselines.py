"""Baselines every report carries, scored by the study's own evaluator.

* ``deepspeed``: out-of-the-box DeepSpeed. Pure data parallelism; for each ZeRO stage 0-3 the
  largest micro-batch that fits; no activation checkpointing unless nothing fits without it. Like
  DeepSpeed's autotuner, the stages are then compared and the fastest kept.
* ``megatron``: Megatron-LM style, as its authors advise (Narayanan et al. 2021, "Efficient
  Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", section 3): the smallest
  model-parallel layout at which something fits (takeaway #2), tensor parallelism first up to a node
  (takeaway #1), then pipeline stages; no recomputation unless nothing fits without it there
  (section 3.5); ZeRO 0, sequence parallelism with TP, FlashAttention where the device has it; the
  micro-batch (and, with a pipeline, the schedule) a Megatron user would settle on (takeaway #3):
  the fastest of those that fit. See ``megatron_candidates``.

"Fits" is the cost model's prediction, as it is for the autotuners those baselines stand for.
Candidates are ranked by the cost model; the best ``CANDIDATES`` of each are scored by the
study's evaluator (an autotuner measures them), reusing any result the study already has, and
the fastest measured one is the baseline.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import autoslapo.layout as layout
from autoslapo.config import KNOBS, ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.result import TrialResult
from autoslapo.storage import baseline_rows, baseline_study
from search_spaces import BoundSpace
from tuner.learning import with_prediction
from tuner.proposer import Prediction

if TYPE_CHECKING:
    from store import Store
    from tuner.study import StudyRunner, TuneOutcome

#: Baseline candidates (best predicted first) scored by the evaluator; the fastest is the baseline.
CANDIDATES = 3


@dataclass(frozen=True)
class BaselineContext:
    """What the baselines need from a study: its bound space, its prior, its evaluator and what it measured."""

    bound: BoundSpace
    predict: Callable[[ScheduleConfig], Prediction]
    evaluate: Callable[[ScheduleConfig], TrialResult]
    measured: Mapping[ScheduleConfig, TrialResult]
    #: what the recipes tried: how many were valid, and the rule broken at the smallest micro-batch
    tried: Tried = field(default_factory=lambda: Tried())


@dataclass
class Tried:
    """The configurations a recipe built (``_valid``): ``valid`` of them could run here; ``rule``:
    the rule the one with the smallest micro-batch broke (``(micro_batch, message)``), None if none broke one."""

    valid: int = 0
    rule: tuple[int, str] | None = None

    def reason(self, kind: str) -> str | None:
        """Why no ``kind``-style configuration exists, when none was valid (a rule, not memory)."""
        if self.valid or self.rule is None:
            return None
        return f"no {kind}-style configuration is valid here: {self.rule[1]}"


def _valid(ctx: BaselineContext, **knobs: Any) -> ScheduleConfig | None:
    """The configuration with ``knobs`` set, the layout derived and every other knob as the study fixes
    it (else its declared default), or None when it cannot run here. A recipe's knobs the model's
    family cannot use (``layout.inapplicable_knobs``: attention, sequence parallelism and kernels on a
    convolutional family) stay at their defaults, as its user would leave them."""
    b = ctx.bound
    skip = layout.inapplicable_knobs(b.model, KNOBS)
    knobs = {k: v for k, v in knobs.items() if k not in skip}
    try:
        dp = layout.data_parallel(b.cluster.gpus, knobs["tp"], knobs["pp"])
        ga = layout.grad_accum_for(b.global_batch, knobs["micro_batch"], dp)
        precision = b.fixed.get("precision", layout.default_precision(b.cluster.device.bf16))
        config = ScheduleConfig(precision=precision, dp=dp, grad_accum=ga, **knobs).validate(b.model, b.cluster)
    except ConfigError as exc:
        mb = int(knobs["micro_batch"])
        if ctx.tried.rule is None or mb < ctx.tried.rule[0]:  # the least the recipe could ask of the batch
            ctx.tried.rule = (mb, str(exc))
        return None
    ctx.tried.valid += 1
    return config


def _ranked(ctx: BaselineContext, configs: list[ScheduleConfig]) -> list[ScheduleConfig]:
    """Distinct configurations, best predicted throughput first."""
    uniq = list(dict.fromkeys(configs))
    return sorted(uniq, key=lambda c: -ctx.predict(c).samples_per_s)


def _micro_batches(ctx: BaselineContext) -> list[int]:
    return [2**i for i in range(12, -1, -1) if 2**i <= ctx.bound.global_batch]


def deepspeed_candidates(ctx: BaselineContext) -> list[ScheduleConfig]:
    """DeepSpeed-style candidates (one per ZeRO stage), best predicted first; empty if nothing fits."""
    gpus = ctx.bound.cluster.gpus
    for ratio in (0.0, 1.0):
        found: list[ScheduleConfig] = []
        for stage in ((0, 1, 2, 3) if gpus > 1 else (0,)):
            for mb in _micro_batches(ctx):
                c = _valid(ctx, tp=1, pp=1, micro_batch=mb, zero_stage=stage, ckpt_ratio=ratio,
                           attn_kernel="sdpa")
                if c is not None and ctx.predict(c).fits:
                    found.append(c)
                    break  # the largest micro-batch that fits at this stage
        if found:
            return _ranked(ctx, found)
    return []


def megatron_layouts(ctx: BaselineContext) -> list[tuple[int, int]]:
    """The (tp, pp) layouts the Megatron-style baseline tries, in order: tp ascending over 1, 2, 4, 8
    (those that can shard the model and divide a node, so no group straddles two) at pp 1, then, at
    the largest such tp, pp ascending. So t x p, the model-parallel size, only grows, and pp only once tp cannot."""
    b = ctx.bound
    node = b.cluster.devices_per_node
    tps = [t for t in layout.tp_degrees(b.model, b.cluster) if t in (1, 2, 4, 8) and node % t == 0]
    if not tps:
        return []
    top = tps[-1]
    pps = [p for p in range(2, layout.max_chunks(b.model) + 1) if b.cluster.gpus % (top * p) == 0]
    return [(t, 1) for t in tps] + [(top, p) for p in pps]


def _megatron_fitting(ctx: BaselineContext, tp: int, pp: int, ckpt_ratio: float) -> list[ScheduleConfig]:
    """Every Megatron-style configuration at (tp, pp) with ``ckpt_ratio`` that is predicted to fit:
    one per micro-batch and pipeline schedule (1F1B and GPipe with stages), each with sequence
    parallelism and flash attention where the model takes them (the first of those that is valid)."""
    b = ctx.bound
    # sequence parallelism and flash attention where the model takes them (not ALBERT's SP, not T5's:
    # its cross-attention reads the whole encoder output; no flash for T5)
    sps = (True, False) if tp > 1 and b.model.sequence_parallel_ok else (False,)
    attns = ("flash", "sdpa") if b.cluster.device.flash_attention and layout.user_knob_ok(
        "attn_kernel", "flash", b.model) else ("sdpa",)
    found = []
    for schedule in (("1f1b", "gpipe") if pp > 1 else ("1f1b",)):
        for mb in _micro_batches(ctx):
            # Megatron fuses bias + GeLU by default (``--bias-gelu-fusion``; off only with
            # ``--no-bias-gelu-fusion``), where the MLP has them
            c = next((c for sp, attn, fuse in itertools.product(sps, attns, (True, False)) if (c := _valid(
                ctx, tp=tp, pp=pp, micro_batch=mb, ckpt_ratio=ckpt_ratio, zero_stage=0, sequence_parallel=sp,
                attn_kernel=attn, norm_kernel="fused",  # Megatron's fused RMSNorm (Apex / TE)
                fuse_bias_gelu=fuse, pipeline_schedule=schedule)) is not None), None)
            if c is not None and ctx.predict(c).fits:
                found.append(c)
    return found


def megatron_candidates(ctx: BaselineContext) -> list[ScheduleConfig]:
    """Megatron-style candidates (micro-batch x pipeline schedule), best predicted first; empty if none fits.

    The rule is Megatron-LM's own advice (Narayanan et al. 2021, "Efficient Large-Scale Language Model
    Training on GPU Clusters Using Megatron-LM", SC'21, section 3):

    * takeaway #1: tensor model parallelism up to degree g on g-GPU servers, then pipeline model
      parallelism across servers: the layouts ``megatron_layouts`` lists, tp 1, 2, 4, 8 (at most a
      node, dividing the heads) at pp 1, then the largest of them with pp 2, 3, 4, ...;
    * takeaway #2: the total model-parallel size M = t x p just large enough that the model's
      parameters and intermediate metadata fit in GPU memory, data parallelism scaling out: the
      first layout at which any configuration is predicted to fit wins, with dp = gpus / M;
    * section 3.5: activation recomputation (Megatron's ``--checkpoint-activations``, now
      ``--recompute-granularity full``) is optional, trading extra compute for memory: at that layout,
      every configuration without it (``ckpt_ratio`` 0) that fits is a candidate; only when none fits
      there are the candidates those with every layer recomputed (``ckpt_ratio`` 1.0). A layout where
      nothing fits either way is passed over for the next one, so recomputation never stands in for a
      smaller model-parallel size, nor a larger one for recomputation;
    * takeaway #3: the micro-batch depends on the model, p, d and the batch: every one that fits
      (and, with stages, 1F1B or GPipe), ranked by predicted throughput (``_ranked``).

    As Megatron runs: ZeRO 0, its fused norm and bias + GeLU, sequence parallelism with TP where the model takes it,
    flash attention where the device and model have it (else sdpa). Cost: at most 13 micro-batches x
    2 schedules x 2 recomputation settings predictions a layout, over at most 4 + (divisors of the
    GPUs) layouts, and the search stops at the first that fits (a model that fits one GPU: 13).
    """
    for tp, pp in megatron_layouts(ctx):
        for ratio in (0.0, 1.0):  # recompute only where nothing fits without it
            found = _megatron_fitting(ctx, tp, pp, ratio)
            if found:
                return _ranked(ctx, found)
    return []


def deepspeed_config(ctx: BaselineContext) -> ScheduleConfig | None:
    """The DeepSpeed-style configuration the cost model ranks first, or None if nothing fits."""
    found = deepspeed_candidates(ctx)
    return found[0] if found else None


def megatron_config(ctx: BaselineContext) -> ScheduleConfig | None:
    """The Megatron-style configuration the cost model ranks first, or None if nothing fits."""
    found = megatron_candidates(ctx)
    return found[0] if found else None


_PER_RUN_KEYS = ("baseline", "baselines", "tuned_samples_per_s", "speedup", "speedup_ci95")  # written with each pick


Span = tuple[datetime, datetime]  # when a baseline was measured: its row's start and end


def stored_picks(store: Store, study: str) -> dict[str, tuple[ScheduleConfig | None, TrialResult, dict[str, Any],
                                                               Span | None]]:
    """The baselines an earlier run of ``study`` picked and measured, by kind (``deepspeed``, ``megatron``):
    each one's configuration (None when none fitted), its result without the per-run keys, the
    extra it was stored with (speed-up and its interval), and when it was measured."""
    out: dict[str, tuple[ScheduleConfig | None, TrialResult, dict[str, Any], Span | None]] = {}
    for kind, t in baseline_rows(store, study):  # a row both baselines picked is listed for each
        extra = t.result.get("extra") or {}
        if t.status == "running" or not extra.get("baseline"):
            continue
        config = ScheduleConfig.from_dict(t.config) if "tp" in t.config else None
        result = TrialResult.from_dict({**t.result, "extra": {k: v for k, v in extra.items() if k not in _PER_RUN_KEYS}})
        out[kind] = (config, result, extra, (t.started_at, t.ended_at) if t.started_at and t.ended_at else None)
    return out


def _summary(config: ScheduleConfig | None, result: TrialResult, speedup: float | None,
             ci: dict[str, Any] | None) -> dict[str, Any]:
    return {"config": config.to_dict() if config else None, "status": result.status,
            "samples_per_s": result.samples_per_s, "speedup": speedup, "reason": result.reason, "speedup_ci95": ci}


def score_baselines(runner: StudyRunner, outcome: TuneOutcome, *, measure: bool = True) -> dict[str, Any]:
    """Score both baselines with the study's evaluator; store them; return name -> summary.

    They go to a companion study ``<study>.baselines`` so the study itself holds exactly its
    budget of trials; each stored result carries the tuned best and the speedup in ``extra``.
    With repeats (real trials, ``TuneOptions.repeats``) the study's finalists and the baselines
    are first re-measured in interleaved rounds (``tuner.repeats.remeasure``) and each speedup
    gets its 95% interval (``speedup_ci95``, in the summary, the baseline's and the best's ``extra``).
    """
    from store import utcnow  # the store (SQLAlchemy) is imported when used, not with the tuner
    from tuner.repeats import record_speedups, remeasure, speedup_interval

    out: dict[str, Any] = {}
    store = runner.store
    # A resumed study keeps the baselines an earlier run picked and measured (a real baseline trial is
    # expensive, and re-picking among the candidates let the baseline drift from resume to resume);
    # when the resumed run added no trial (``measure`` False), its stored summaries are the answer.
    stored = stored_picks(store, runner.name)
    kinds = ("deepspeed", "megatron")
    if not measure and all(k in stored for k in kinds):
        return {k: _summary(stored[k][0], stored[k][1], stored[k][2].get("speedup"),
                            (stored[k][2].get("speedup_ci95") or {}).get(k)) for k in kinds}
    ctx = runner.baseline_context()
    picked: list[tuple[str, ScheduleConfig | None, TrialResult]] = []
    # when each pick was measured (its row's duration): kept from the earlier run, or the study's row
    spans = {k: v[3] for k, v in stored.items()}
    # what this call measured: a candidate both baselines rank (a ResNet on one device) is measured once
    # and both share that measurement, as they share its stored row
    here: dict[ScheduleConfig, tuple[TrialResult, Span | None]] = {}
    for kind, pick in (("deepspeed", deepspeed_candidates), ("megatron", megatron_candidates)):
        if kind in stored:
            picked.append((kind, stored[kind][0], stored[kind][1]))
            continue
        config: ScheduleConfig | None = None
        ctx.tried.valid, ctx.tried.rule = 0, None
        candidates = pick(ctx)[:CANDIDATES]
        invalid = ctx.tried.reason(kind)  # none could run here (a batch rule): not out of memory
        result = (TrialResult.failure("failed", invalid, measured=False) if invalid is not None else
                  TrialResult.failure("oom", f"no {kind}-style configuration fits", measured=False,
                                      oom_evidence="cost-model prediction"))
        for i, cand in enumerate(candidates, 1):
            r = ctx.measured.get(cand)
            if r is None and cand in here:
                r, span = here[cand]
            elif r is None:
                runner.note(f"scoring the {kind}-style baseline: candidate {i} of {CANDIDATES}")
                start = utcnow()
                r = ctx.evaluate(cand)
                span = (start, utcnow())
                if not runner.evaluator.instant:  # the prior's prediction beside the measurement, as a trial's
                    r = with_prediction(r, ctx.predict(cand))
                here[cand] = (r, span)
            else:
                row = store.find_trial(runner.name, cand.to_dict())
                span = (row.started_at, row.ended_at) if row is not None and row.started_at and row.ended_at else None
            if config is None or (r.status == "complete" and (result.status != "complete"
                                                              or r.samples_per_s > result.samples_per_s)):
                config, result, spans[kind] = cand, r, span
        picked.append((kind, config, result))
    if not runner.options.join:  # stored as picked: a study stopped while they are re-measured keeps them
        _store_companion(runner, [(i, c.to_dict() if c else {"baseline": k}, TrialResult.from_dict(
            {**r.to_dict(), "extra": {**r.extra, "baseline": k}}).to_dict()) for i, (k, c, r) in enumerate(picked)],
            [spans.get(k) for k, _, _ in picked])
    picked = remeasure(runner, outcome, picked)
    tuned = outcome.best_result.samples_per_s if outcome.best_result else 0.0
    rows, intervals = [], {}
    for i, (kind, config, result) in enumerate(picked):
        speedup = tuned / result.samples_per_s if result.status == "complete" and tuned else None
        ci = speedup_interval(outcome.best_result, result, repeats=runner.options.repeats, seed=runner.options.seed)
        if ci is not None:
            intervals[kind] = ci
        out[kind] = _summary(config, result, speedup, ci)
        extra = {**result.extra, "baseline": kind, "tuned_samples_per_s": tuned, "speedup": speedup,
                 **({"speedup_ci95": {kind: ci}} if ci is not None else {})}
        kept = TrialResult.from_dict({**result.to_dict(), "extra": extra})
        rows.append((i, config.to_dict() if config else {"baseline": kind}, kept.to_dict()))
    record_speedups(runner, outcome, intervals)
    _store_companion(runner, rows, [spans.get(k) for k, _, _ in picked])
    return out


def _store_companion(runner: StudyRunner, rows: list[tuple[int, dict[str, Any], dict[str, Any]]],
                     spans: list[Span | None]) -> None:
    """(Re)write the study's companion ``<study>.baselines`` with ``rows`` (joined tuners add to it);
    ``spans``: when each was measured, by position (None: now)."""
    o, store, name = runner.options, runner.store, baseline_study(runner.name)
    if store.has_study(name) and not o.join:  # joined tuners share one companion study
        store.delete_study(name)
    store.create_study(name, model=o.model.to_dict(), cluster=o.cluster.to_dict(), space_name="baselines",
                       space_version="1", objective="samples_per_s", backend=o.backend,
                       model_signature=o.model.signature(), cluster_fingerprint=o.cluster.fingerprint(),
                       exist_ok=o.join)
    # Both baselines may pick one configuration (a ResNet on one device: no model parallelism, no ZeRO
    # without data parallelism, no recomputation), which a study holds once: its row names every kind
    # that picked it (``extra["baselines"]``, read back by ``stored_picks``) and each one's interval.
    seen: dict[str, dict[str, Any]] = {}
    uniq = []
    for (i, cfg, res), span in zip(rows, spans, strict=True):
        key = str(sorted(cfg.items()))
        extra = res.get("extra") or {}
        if key in seen:
            kept = seen[key]
            kept["baselines"] = [*kept.get("baselines", [kept["baseline"]]), extra.get("baseline")]
            if ci := {**(kept.get("speedup_ci95") or {}), **(extra.get("speedup_ci95") or {})}:
                kept["speedup_ci95"] = ci
            continue
        res = {**res, "extra": dict(extra)}
        seen[key] = res["extra"]
        uniq.append(((i, cfg, res), span))
    store.add_new_trials(name, [(cfg, res) for (_, cfg, res), _ in uniq], times=[span for _, span in uniq])  # skips stored ones
    store.set_study_status(name, "complete")
