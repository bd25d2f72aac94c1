"""Baselines every report carries, scored by the study's own evaluator.

* ``deepspeed``: out-of-the-box DeepSpeed. Pure data parallelism; the ZeRO stage its autotuner
  would settle on (the lowest stage at which the model fits, which is where its search starts and
  what it keeps unless a higher stage allows a larger micro-batch that is faster); the largest
  micro-batch that fits; no activation checkpointing unless nothing fits without it.
* ``megatron``: Megatron-LM style. TP 8 within a node (or the largest that divides the heads),
  the fewest pipeline stages that fit, full recomputation, sequence parallelism with TP,
  FlashAttention where the device has it, micro-batch 1.

"Fits" is the cost model's prediction, as it is for the autotuners those baselines stand for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.result import TrialResult

if TYPE_CHECKING:
    from tuner.study import StudyRunner, TuneOutcome


def _valid(runner: StudyRunner, **knobs: Any) -> ScheduleConfig | None:
    b = runner.bound
    gpus, gb = b.cluster.gpus, b.global_batch
    dp = gpus // (knobs["tp"] * knobs["pp"])
    if dp * knobs["tp"] * knobs["pp"] != gpus or gb % (knobs["micro_batch"] * dp):
        return None
    precision = b.fixed.get("precision", "bf16" if b.cluster.device.bf16 else "fp16")
    try:
        return ScheduleConfig(dp=dp, grad_accum=gb // (knobs["micro_batch"] * dp), precision=precision,
                              **knobs).validate(b.model, b.cluster)
    except ConfigError:
        return None


def _fits(runner: StudyRunner, c: ScheduleConfig) -> bool:
    return runner.proposer.predict(c).fits


def deepspeed_config(runner: StudyRunner) -> ScheduleConfig | None:
    """The DeepSpeed-style configuration (see the module docstring), or None if nothing fits."""
    gpus = runner.bound.cluster.gpus
    mbs = [2**i for i in range(12, -1, -1)]
    for ratio in (0.0, 1.0):
        best: tuple[float, ScheduleConfig] | None = None
        for stage in (0, 1, 2, 3):
            for mb in mbs:
                c = _valid(runner, tp=1, pp=1, micro_batch=mb, zero_stage=stage if gpus > 1 else 0,
                           ckpt_ratio=ratio, attn_kernel="sdpa")
                if c is not None and _fits(runner, c):
                    pred = runner.proposer.predict(c).samples_per_s
                    if best is None or pred > best[0] * 1.0001:
                        best = (pred, c)
                    break  # the largest micro-batch that fits at this stage
            if best is not None and stage >= 1 and best[1].zero_stage < stage:
                break  # a higher stage did not help: the autotuner stops climbing
        if best is not None:
            return best[1]
    return None


def megatron_config(runner: StudyRunner) -> ScheduleConfig | None:
    """The Megatron-style configuration (see the module docstring), or None if nothing fits."""
    b = runner.bound
    dev = b.cluster.device
    tps = [t for t in (8, 4, 2, 1) if t <= b.cluster.devices_per_node and b.model.heads % t == 0
           and b.model.kv_heads % t == 0 and b.cluster.gpus % t == 0]
    for tp in tps[:1]:
        for pp in range(1, b.model.layers + 1):
            c = _valid(runner, tp=tp, pp=pp, micro_batch=1, ckpt_ratio=1.0, zero_stage=0,
                       sequence_parallel=tp > 1, attn_kernel="flash" if dev.flash_attention else "sdpa")
            if c is not None and _fits(runner, c):
                return c
    return None


def score_baselines(runner: StudyRunner, outcome: TuneOutcome) -> dict[str, Any]:
    """Score both baselines with the study's evaluator; store them; return name -> summary.

    They go to a companion study ``<study>.baselines`` so the study itself holds exactly its
    budget of trials; each stored result carries the tuned best and the speedup in ``extra``.
    """
    out: dict[str, Any] = {}
    tuned = outcome.best_result.samples_per_s if outcome.best_result else 0.0
    store, name = runner.store, f"{runner.name}.baselines"
    # A resumed study reuses baselines already scored (a real baseline trial is expensive).
    earlier = {}
    if store.has_study(name):
        for t in store.trials(name):
            if t.status != "running" and "tp" in t.config:
                earlier[ScheduleConfig.from_dict(t.config)] = TrialResult.from_dict(
                    {**t.result, "extra": {k: v for k, v in t.result.get("extra", {}).items()
                                           if k not in ("baseline", "tuned_samples_per_s", "speedup")}})
    rows = []
    for i, (kind, pick) in enumerate((("deepspeed", deepspeed_config), ("megatron", megatron_config))):
        config = pick(runner)
        if config is None:
            result = TrialResult.failure("oom", f"no {kind}-style configuration fits", measured=False)
        else:
            result = (runner.proposer.measured.get(config) or earlier.get(config)
                      or runner.evaluator.evaluate(config))
        speedup = tuned / result.samples_per_s if result.status == "complete" and tuned else None
        out[kind] = {"config": config.to_dict() if config else None, "status": result.status,
                     "samples_per_s": result.samples_per_s, "speedup": speedup, "reason": result.reason}
        extra = {**result.extra, "baseline": kind, "tuned_samples_per_s": tuned, "speedup": speedup}
        stored = TrialResult.from_dict({**result.to_dict(), "extra": extra})
        rows.append((i, config.to_dict() if config else {"baseline": kind}, stored.to_dict()))
    o = runner.o
    if store.has_study(name) and not o.join:  # joined tuners share one companion study
        store.delete_study(name)
    store.create_study(name, model=o.model.to_dict(), cluster=o.cluster.to_dict(), space_name="baselines",
                       space_version="1", objective="samples_per_s", backend=o.backend,
                       model_signature=o.model.signature(), cluster_fingerprint=o.cluster.fingerprint(),
                       exist_ok=o.join)
    # Two identical baseline configs (tiny clusters) would share a hash: store distinct ones only.
    seen: set[str] = set()
    uniq = []
    for r in rows:
        key = str(sorted(r[1].items()))
        if key not in seen:
            seen.add(key)
            uniq.append(r)
    store.add_new_trials(name, [(config, result) for _, config, result in uniq])  # skips stored ones
    store.set_study_status(name, "complete")
    return out
