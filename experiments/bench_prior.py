"""Does the prior that learns rank the configurations not yet run better as measurements arrive?

(a) The measured bert-tiny landscape (every configuration run for real on 4 CPU ranks,
    ``experiments/data/landscape_bert-tiny_4cpu.csv``), replayed as real trials: after 0, 3, 5 and
    10 measured trials, the Spearman rank correlation between the prior's predicted throughput and
    the measured throughput over the complete configurations not yet run. Trials are picked as the
    tuner picks them (a study with learning on), and at random (``--seeds`` fixed seeds: the same
    refit, random picks), once with the whole learner (the cluster's physical correction and this
    model's knob effects, ``tuner.learning``) and once with the physical correction alone. The prior
    without learning is the 0-trial figure, unchanged.
(b) ``--perturbed``: trials to within 2% of the optimum on bench_tuner.py's perturbed landscapes
    (``--landscapes``, GPT-13B by default; ``--perturbed-seeds``), with and without learning, at
    most ``--cap`` trials.

Usage: python experiments/bench_prior.py [--seeds 5] [--perturbed] [--out experiments/results/bench_prior.txt]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_tuner import LANDSCAPES, Memo, measured_landscape, trials_to_reach
from measure_landscape import SPACE as LANDSCAPE_SPACE
from scipy.stats import spearmanr

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import space_from_dict
from store import open_store
from tuner import PerturbedSimEvaluator, ReplayEvaluator, StudyRunner, TuneOptions
from tuner.learning import PriorLearner

CHECKPOINTS = (0, 3, 5, 10)


@dataclass
class AsReal:
    """A replayed landscape presented as the real trial runtime (so the study learns from it)."""

    inner: object
    name: str = "local"
    instant: bool = False

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        return self.inner.evaluate(config)  # type: ignore[attr-defined]


def _spearman(predict: object, truth: dict[ScheduleConfig, float], done: set[ScheduleConfig]) -> float:
    rest = [c for c in truth if c not in done]
    pred = [predict(c).samples_per_s for c in rest]  # type: ignore[operator]
    return float(spearmanr(pred, [truth[c] for c in rest]).statistic)


def tuner_picks(model: ModelSpec, cluster: ClusterSpec, table: dict[str, TrialResult],
                truth: dict[ScheduleConfig, float], seed: int = 0) -> tuple[list[float], list[str]]:
    """Spearman after each checkpoint with the trials a learning study (``seed``) picks."""
    store = open_store("sqlite://")
    runner = StudyRunner(TuneOptions(model=model, cluster=cluster, backend="local", trials=max(CHECKPOINTS),
                                     seed=seed, baselines=False, warm_start=False, mirror=False, study="p",
                                     space=space_from_dict(LANDSCAPE_SPACE)),
                         store, evaluator=AsReal(ReplayEvaluator(table)))  # type: ignore[arg-type]
    rhos = [_spearman(runner.proposer.predict, truth, set())]
    factors = ["identity (no stored calibration)"]
    while runner.launched < max(CHECKPOINTS):
        nxt = runner.propose()
        if nxt is None:
            break
        proposal, number = nxt
        runner.complete(proposal, number, runner.evaluator.evaluate(proposal.config))
        if runner.launched in CHECKPOINTS:
            done = set(runner.proposer.measured)
            rhos.append(_spearman(runner.proposer.predict, truth, done))
            factors.append(", ".join(f"{k} {v:.2f}" for k, v in runner.learner.correction.to_dict().items()))
    store.close()
    return rhos, factors


def random_picks(model: ModelSpec, cluster: ClusterSpec, table: dict[str, TrialResult],
                 truth: dict[ScheduleConfig, float], seed: int, knob_effects: bool = True) -> list[float]:
    """Spearman after each checkpoint with random trials (the learner refitted after each)."""
    learner = PriorLearner(None, model, cluster, enabled=True, runtime_device="cpu", knob_effects=knob_effects)
    order = random.Random(seed).sample(sorted(truth, key=lambda c: c.config_hash()), max(CHECKPOINTS))
    rhos = [_spearman(learner.prior(), truth, set())]
    for i, c in enumerate(order, 1):
        learner.observe(c, table[c.config_hash()])
        if i in CHECKPOINTS:
            rhos.append(_spearman(learner.prior(), truth, set(order[:i])))
    return rhos


def noise_floor(truth: dict[ScheduleConfig, float]) -> str:
    """How noisy the landscape is: pairs that differ only in full recomputation of every layer (which
    can only add work) and were measured faster with it."""
    by_rest = {replace(c, ckpt_ratio=0.0): v for c, v in truth.items() if c.ckpt_ratio == 1.0}
    pairs = [(v, by_rest[c]) for c, v in truth.items() if c.ckpt_ratio == 0.0 and c in by_rest]
    faster = [with_ckpt / without - 1 for without, with_ckpt in pairs if with_ckpt > without]
    return (f"landscape noise: {len(faster)} of {len(pairs)} pairs that differ only in recomputing every layer "
            f"(more work) were measured faster with it, by up to {max(faster, default=0.0):.0%} (2 timed steps a "
            "configuration, 4 ranks on 2 cores)")


def perturbed(seed: int, cap: int, modes: tuple[bool, ...] = (True, False),
              landscape: str = "gpt-13b/64xA100-80GB") -> dict[bool, int | None]:
    """Trials studies need to reach within 2% of the perturbed landscape's optimum, with learning
    (True) and without (False); the landscape is evaluated once and shared by both."""
    model, cluster = LANDSCAPES[landscape]
    truth = Memo(PerturbedSimEvaluator(model, cluster, seed=seed))
    out: dict[bool, int | None] = {}
    optimum = 0.0
    for learn in modes:
        store = open_store("sqlite://")
        runner = StudyRunner(TuneOptions(model=model, cluster=cluster, trials=cap, seed=seed, baselines=False,
                                         warm_start=False, mirror=False, study="g", learn_prior=learn),
                             store, evaluator=truth)  # type: ignore[arg-type]
        if not optimum:
            optimum = max(r.samples_per_s if (r := truth.evaluate(c)).status == "complete" else 0.0
                          for c in runner.bound.configs())
        curve: list[float] = []
        started = time.monotonic()
        while runner.should_stop(started) is None and runner.best < 0.98 * optimum:
            nxt = runner.propose()
            if nxt is None:
                break
            proposal, number = nxt
            r = runner.evaluator.evaluate(proposal.config)
            runner.complete(proposal, number, r)
            curve.append(r.samples_per_s if r.status == "complete" else 0.0)
        store.close()
        out[learn] = trials_to_reach(curve, 0.98 * optimum)
    return out


def _median(reached: list[int], unreached: int, cap: int) -> str:
    """The median of trials to the target over all seeds, an unreached seed counting as more than ``cap``."""
    values = [float(x) for x in reached] + [float("inf")] * unreached
    if not values:
        return "n/a"
    lo, hi = sorted(values)[(len(values) - 1) // 2], sorted(values)[len(values) // 2]
    if hi == float("inf"):
        return f"> {cap}" if lo == float("inf") else f"between {lo:g} and > {cap}"
    return f"{(lo + hi) / 2:g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", type=Path, default=Path("experiments/data/landscape_bert-tiny_4cpu.csv"))
    ap.add_argument("--seeds", type=int, default=5, help="random-pick seeds on the measured landscape")
    ap.add_argument("--perturbed", action="store_true", help="also run the perturbed landscapes")
    ap.add_argument("--landscapes", default="gpt-13b/64xA100-80GB",
                    help=f"comma-separated perturbed landscapes, of {', '.join(LANDSCAPES)}")
    ap.add_argument("--perturbed-seeds", default="2,4")
    ap.add_argument("--skip-measured", action="store_true", help="only the perturbed landscapes")
    ap.add_argument("--cap", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/bench_prior.txt"))
    args = ap.parse_args()
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    if not args.skip_measured:
        model, cluster, table = measured_landscape(args.measured)
        truth: dict[ScheduleConfig, float] = {}
        bound = space_from_dict(LANDSCAPE_SPACE).bind(model, cluster)
        for c in bound.configs():
            r = table.get(c.config_hash())
            if r is not None and r.status == "complete" and r.samples_per_s:
                truth[c] = r.samples_per_s
        log(f"# bench_prior: {args.measured.name}, {len(truth)} complete measured configurations; Spearman rank "
            f"correlation of the prior's predicted throughput with the measured one over the configurations not yet run")
        log(f"{'picks':<22} " + " ".join(f"{'after ' + str(n):>9}" for n in CHECKPOINTS))
        tuned = [tuner_picks(model, cluster, table, truth, s) for s in range(args.seeds)]
        for s, (rs, _) in enumerate(tuned):
            log(f"{f'tuner (seed {s})':<22} " + " ".join(f"{r:>9.3f}" for r in rs))
        med = [statistics.median(col) for col in zip(*(rs for rs, _ in tuned), strict=True)]
        log(f"{f'tuner (median of {args.seeds})':<22} " + " ".join(f"{r:>9.3f}" for r in med))
        factors = tuned[0][1]
        per_seed = [random_picks(model, cluster, table, truth, s) for s in range(args.seeds)]
        for s, rs in enumerate(per_seed):
            log(f"{f'random (seed {s})':<22} " + " ".join(f"{r:>9.3f}" for r in rs))
        med = [statistics.median(col) for col in zip(*per_seed, strict=True)]
        log(f"{f'random (median of {args.seeds})':<22} " + " ".join(f"{r:>9.3f}" for r in med))
        physical = [random_picks(model, cluster, table, truth, s, knob_effects=False) for s in range(args.seeds)]
        med = [statistics.median(col) for col in zip(*physical, strict=True)]
        log(f"{'random, physical only':<22} " + " ".join(f"{r:>9.3f}" for r in med) + f"  (median of {args.seeds}; "
            "no knob effects)")
        log(noise_floor(truth))
        log("correction after the tuner's picks (seed 0): " + " | ".join(f"{n}: {f}" for n, f in zip(CHECKPOINTS, factors,
                                                                                               strict=False)))
    for name in (x for x in args.landscapes.split(",") if x) if args.perturbed else ():
        model, cluster = LANDSCAPES[name]
        log("")
        log(f"# perturbed {model.preset} on {cluster.gpus} x {cluster.gpu_type.upper()}: trials to within 2% of the "
            f"optimum (cap {args.cap})")
        got_all: list[dict[bool, int | None]] = []
        for s in (int(x) for x in args.perturbed_seeds.split(",") if x):
            t0 = time.monotonic()
            got = perturbed(s, args.cap, landscape=name)
            got_all.append(got)
            plain, learned = got[False], got[True]
            log(f"seed {s}: without learning {plain or f'>{args.cap}'}, with learning {learned or f'>{args.cap}'} "
                f"({time.monotonic() - t0:.0f}s)")
            args.out.write_text("\n".join(lines) + "\n")  # each seed survives an interruption
        for learn, label in ((True, "with learning"), (False, "without")):
            reached = sorted(g[learn] for g in got_all if g[learn] is not None)  # type: ignore[type-var]
            unreached = len(got_all) - len(reached)
            log(f"# {label}: {len(reached)}/{len(got_all)} within {args.cap}, trials {reached}"
                + (f" and {unreached} > {args.cap}" if unreached else "") + f"; median {_median(reached, unreached, args.cap)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
