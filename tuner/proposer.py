"""The Optuna side of a study: ask for points, turn them into configurations, tell outcomes.

The sampler always sees the same distributions (one per knob of the bound space: an index for
ordered knobs, so TPE/GP/CMA-ES see their order; a categorical otherwise). A proposal is only
handed out when it is a valid configuration that the prior (the cost model) predicts fits and
that this study has not measured yet; everything else is told to the sampler at once:

* an invalid point (rule broken)        -> value 0, infeasible; never a trial;
* a predicted-infeasible configuration  -> value 0, infeasible; recorded as ``pruned``;
* a configuration already measured      -> its measured value again; never re-run. A model-based
  sampler (TPE, GP, CMA-ES) that lands on one is instead handed its best-predicted unmeasured
  neighbour (one knob away, else two), and the repeat is dropped from its history (told as
  failed): telling it the known value again would add a copy of the incumbent to the "good"
  group, which draws the next asks to the same point (on the 103,740-configuration LLaMA-70B
  landscape 598 of 1,048 asks in 150 trials were such repeats, and each ask costs time linear in
  the history, so a 2,000-trial study took over an hour).

Infeasibility reaches the samplers that understand it as a trial constraint (``set_constraint``:
TPE, GP, NSGA-II); the others see the worst value. Optuna is imported lazily (it pulls in SQLAlchemy).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from autoslapo.config import ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.result import TrialResult
from search_spaces import ORDINAL, BoundSpace, Invalid
from tuner.walk import Tick, paced, valid_configs

if TYPE_CHECKING:
    import optuna

SAMPLERS: tuple[str, ...] = ("tpe", "random", "grid", "cmaes", "gp", "nsga2")
#: A sampler that keeps proposing known or infeasible points this many times in a row gets the
#: next unmeasured configuration of the prior's ranking instead (so a converged TPE cannot spin).
MAX_FUTILE_ASKS = 32
_VIOLATION = "autoslapo_violation"


@dataclass(frozen=True)
class Prediction:
    """What the prior says about a configuration before it runs."""

    fits: bool
    samples_per_s: float
    memory_bytes: int = 0
    reason: str = ""


Prior = Callable[[ScheduleConfig], Prediction]


@dataclass
class Proposal:
    """A configuration to run, and the Optuna trial to tell its outcome to."""

    config: ScheduleConfig
    trial: optuna.trial.Trial
    source: str  # "sampler", "neighbour", "prior", "warm", "fallback", "learned", "local", "probe"


def _values_of(result: TrialResult, multi: bool) -> list[float]:
    ok = result.status == "complete"
    thr = float(result.samples_per_s) if ok else 0.0
    if not multi:
        return [thr]
    mem_gib = result.peak_memory_bytes / 2**30 if ok and result.peak_memory_bytes else 1e6
    return [thr, mem_gib]


def _tell(study: optuna.Study, trial: optuna.trial.Trial, values: list[float] | None, state: Any) -> None:
    try:
        study.tell(trial, values, state=state)
    except RuntimeError as err:
        # GridSampler calls study.stop() once every grid point was visited, which raises outside
        # optimize(); the trial is stored before that (Optuna's tell finishes in a finally).
        if "Study.stop" not in str(err):
            raise


def make_sampler(name: str, seed: int, bound: BoundSpace, concurrency: int = 1) -> optuna.samplers.BaseSampler:
    """The Optuna sampler called ``name``, seeded. Raises UsageError listing the valid names."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10,
                                          constant_liar=concurrency > 1)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {k: list(range(len(v))) if k in ORDINAL else list(v) for k, v in bound.domains.items()}
        return optuna.samplers.GridSampler(grid, seed=seed)
    if name == "cmaes":
        try:
            import cmaes  # noqa: F401 - Optuna's CMA-ES sampler needs it at its first ask
        except ImportError:
            raise UsageError("--sampler cmaes needs the cmaes package: pip install cmaes, or use gp/tpe") from None
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=10, warn_independent_sampling=False)
    if name == "gp":
        try:
            import scipy  # noqa: F401 - Optuna's GP sampler needs scipy and torch
        except ImportError:
            raise UsageError("--sampler gp needs scipy: pip install scipy, or use tpe/random/grid/nsga2") from None
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=20)
    raise UsageError(f"--sampler must be one of {', '.join(SAMPLERS)}: got {name!r}")


class Proposer:
    """Asks an in-memory Optuna study for configurations of ``bound``; see the module docstring.

    ``prior`` predicts fit and throughput (None: everything is assumed to fit). ``seeds`` are
    tried first, in order (the prior's best predictions, warm-start configurations).
    ``multi_objective`` maximises throughput and minimises peak memory (NSGA-II's use).
    """

    def __init__(self, bound: BoundSpace, *, sampler: str = "tpe", seed: int = 0, prior: Prior | None = None,
                 multi_objective: bool = False, concurrency: int = 1, local_every: int | None = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.bound = bound
        self.prior = prior
        self.multi = multi_objective or sampler == "nsga2"
        self._dists: dict[str, optuna.distributions.BaseDistribution] = {
            k: optuna.distributions.IntDistribution(0, len(v) - 1) if k in ORDINAL
            else optuna.distributions.CategoricalDistribution(list(v))
            for k, v in bound.domains.items()
        }
        directions: list[Literal["minimize", "maximize"]] = ["maximize", "minimize"] if self.multi else ["maximize"]
        self.study = optuna.create_study(directions=directions,
                                         sampler=make_sampler(sampler, seed, bound, concurrency))
        # Keyed by the (frozen, hashable) config itself: equal configs have equal config_hash(),
        # and hashing the dataclass is ~100x cheaper than the JSON digest in the hot loop.
        self.measured: dict[ScheduleConfig, TrialResult] = {}  # this study's outcomes
        self.pruned: dict[ScheduleConfig, str] = {}  # predicted not to fit, with the reason
        self.pending: set[ScheduleConfig] = set()  # handed out, not told yet
        self._predictions: dict[ScheduleConfig, Prediction] = {}
        self._ranking: list[ScheduleConfig] | None = None
        # Where a learning study's re-seeding looks (None: the whole ranking). Re-predicting a whole
        # space after every refit costs seconds; the corrected best lies among the first prior's best.
        self.shortlist: list[ScheduleConfig] | None = None
        self._short_ranking: list[ScheduleConfig] | None = None
        self._queue: list[tuple[ScheduleConfig, str]] = []
        self.asks = 0
        # Opt-in: every ``local_every``-th proposal refines the incumbent with an unmeasured one-knob
        # (else two-knob) neighbour of the best configuration so far. Off by default: on the
        # perturbed landscapes of experiments/bench_tuner.py it did not beat TPE alone reliably.
        self.local_every = local_every or 0
        # Samplers that model where good points are: a repeat of a measured point is redirected to
        # its neighbourhood (see the module docstring); grid and random keep their own semantics.
        self.redirect_repeats = sampler in ("tpe", "gp", "cmaes")
        self._rng = random.Random(seed)
        self._proposed = 0
        self.on_pruned: Callable[[ScheduleConfig, str], None] | None = None

    # --- points <-> configurations ---------------------------------------------------------
    def _decode(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {k: self.bound.domains[k][int(v)] if k in ORDINAL else v for k, v in params.items()}

    def _encode(self, config: ScheduleConfig) -> dict[str, Any] | None:
        point = self.bound.params_of(config)
        if point is None:
            return None
        return {k: self.bound.domains[k].index(v) if k in ORDINAL else v for k, v in point.items()}

    def predict(self, config: ScheduleConfig) -> Prediction:
        """The prior's prediction for ``config`` (cached by hash)."""
        if config not in self._predictions:
            self._predictions[config] = self.prior(config) if self.prior else Prediction(True, 0.0)
        return self._predictions[config]

    def set_prior(self, prior: Prior | None) -> None:
        """Use ``prior`` from now on (a refitted calibration): predictions and ranking are recomputed.

        Configurations already pruned stay pruned (their rows are stored); the prior's seeds still
        queued are replaced by as many of the new ranking's best unlaunched configurations.
        """
        self.prior = prior
        self._predictions.clear()
        self._ranking = None
        self._short_ranking = None
        seeds = sum(1 for _, source in self._queue if source == "prior")
        if seeds:
            self._queue = [(c, s) for c, s in self._queue if s != "prior"]
            queued = {c for c, _ in self._queue}
            fresh = [c for c in self._reseed_ranking() if self._launchable(c) and c not in queued][:seeds]
            self._queue.extend((c, "prior") for c in fresh)

    def has_queued(self, *sources: str) -> bool:
        """Whether a configuration queued by one of ``sources`` is still waiting to be proposed."""
        return any(s in sources for _, s in self._queue)

    def seed_best(self, source: str) -> ScheduleConfig | None:
        """Queue the prior's best configuration not yet measured, handed out or queued (None: none left).

        A study that learns calls it after a refit, so the corrected prior's pick is measured next.
        """
        queued = {c for c, _ in self._queue}
        for c in self._reseed_ranking():
            if self._launchable(c) and c not in queued:
                self._queue.append((c, source))
                return c
        return None

    def best_predicted(self) -> float:
        """The prior's best predicted throughput among configurations predicted to fit (0 if none)."""
        ranked = self._reseed_ranking()
        return self.predict(ranked[0]).samples_per_s if ranked else 0.0

    def probeable(self, config: ScheduleConfig) -> bool:
        """Whether ``config`` may be probed: expressible, not measured and not handed out (a pruned
        configuration may: a probe runs it although the prior predicts it does not fit)."""
        return config not in self.measured and config not in self.pending and self._encode(config) is not None

    def hand_out_probe(self, config: ScheduleConfig) -> Proposal:
        """Hand out ``config`` as a ``probe`` without the prior's fit check (``tuner.probe``)."""
        self.pruned.pop(config, None)
        return self._hand_out(config, self._ask_fixed(config), "probe")

    def _reseed_ranking(self) -> list[ScheduleConfig]:
        """The shortlist ranked by the current prior (the whole ranking without a shortlist)."""
        if self.shortlist is None:
            return self.ranking()
        if self._short_ranking is None:
            fits = [(c, self.predict(c)) for c in self.shortlist]
            self._short_ranking = [c for c, p in sorted(((c, p) for c, p in fits if p.fits),
                                                        key=lambda cp: -cp[1].samples_per_s)]
        return self._short_ranking

    def ranking(self) -> list[ScheduleConfig]:
        """Every valid configuration predicted to fit, best predicted first (computed once)."""
        self.rank()
        assert self._ranking is not None
        return self._ranking

    def rank(self, *, tick: Tick | None = None, deadline: float | None = None) -> bool:
        """Compute ``ranking()`` unless it is known; ``tick(done, total, unit)`` as the space is walked
        and predicted (``tuner/walk.py``). False (nothing kept) when ``time.monotonic()`` passes ``deadline`` first."""
        if self._ranking is not None:
            return True
        configs = valid_configs(self.bound, deadline=deadline, tick=tick)
        if configs is None:
            return False
        fits: list[tuple[ScheduleConfig, Prediction]] = []
        for i, c in enumerate(configs, 1):
            p = self.predict(c)
            if p.fits:
                fits.append((c, p))
            if not paced(i, len(configs), "configurations", deadline=deadline, tick=tick):
                return False
        fits.sort(key=lambda cp: -cp[1].samples_per_s)
        self._ranking = [c for c, _ in fits]
        return True

    # --- knowledge -------------------------------------------------------------------------
    def enqueue(self, configs: Iterable[ScheduleConfig], source: str) -> int:
        """Try these configurations first (in order); returns how many the space can express."""
        n = 0
        for c in configs:
            if self._encode(c) is not None:
                self._queue.append((c, source))
                n += 1
        return n

    def _tell(self, trial: optuna.trial.Trial, result: TrialResult | None, violation: float) -> None:
        import optuna

        trial.set_constraint(_VIOLATION, violation)
        values = _values_of(result, self.multi) if result is not None else ([0.0, 1e6] if self.multi else [0.0])
        _tell(self.study, trial, values, optuna.trial.TrialState.COMPLETE)

    def add_known(self, config: ScheduleConfig, result: TrialResult, *, own: bool = True) -> None:
        """Tell the sampler an outcome measured before (a resumed study's or a warm start's trial).

        ``own``: the trial belongs to this study, so it is never run again.
        """
        import optuna

        h = config
        point = self._encode(config)
        if own:
            if result.status == "pruned":
                self.pruned[h] = result.reason
            else:
                self.measured[h] = result
        if point is None:
            return
        violation = 0.0 if result.status == "complete" else 1.0
        values = _values_of(result, self.multi)
        self.study.add_trial(optuna.trial.create_trial(
            params=point, distributions=self._dists, values=values, constraints={_VIOLATION: violation}))

    @property
    def feasible_total(self) -> int:
        """Distinct configurations predicted to fit (computes the ranking)."""
        return len(self.ranking())

    def exhausted(self) -> bool:
        """True when every configuration predicted to fit was measured or handed out."""
        done = len(self.measured.keys() | self.pending)
        return done >= self.feasible_total

    # --- asking ----------------------------------------------------------------------------
    def _launchable(self, config: ScheduleConfig) -> bool:
        h = config
        return h not in self.measured and h not in self.pending and h not in self.pruned

    def _check_prior(self, config: ScheduleConfig) -> str | None:
        """None if the prior predicts ``config`` fits; else records it as pruned and returns why."""
        pred = self.predict(config)
        if pred.fits:
            return None
        reason = pred.reason or "predicted not to fit in device memory"
        self.pruned[config] = reason
        if self.on_pruned is not None:
            self.on_pruned(config, reason)
        return reason

    def _ask_fixed(self, config: ScheduleConfig) -> optuna.trial.Trial:
        point = self._encode(config)
        assert point is not None  # enqueue() only keeps expressible configs
        self.study.enqueue_trial(point, skip_if_exists=False)
        trial = self.study.ask(self._dists)
        return trial

    def _neighbour(self) -> ScheduleConfig | None:
        """An unmeasured, feasible configuration one knob (else two) away from the best measured one."""
        done = [(r.samples_per_s, c) for c, r in self.measured.items() if r.status == "complete"]
        if not done:
            return None
        return self._neighbour_of(max(done, key=lambda vc: vc[0])[1])

    def _neighbour_of(self, config: ScheduleConfig) -> ScheduleConfig | None:
        """The launchable configuration one knob away from ``config`` that the prior predicts fits and
        ranks best; failing that, a random launchable one two knobs away (e.g. a deeper pipeline needs
        ZeRO <= 1 at the same time); None if neither exists."""
        point = self.bound.params_of(config)
        if point is None:
            return None
        moves = [(k, v) for k, dom in self.bound.domains.items() for v in dom if v != point[k]]
        self._rng.shuffle(moves)
        best: tuple[float, ScheduleConfig] | None = None
        for k, v in moves:
            cand = self.bound.derive({**point, k: v})
            if isinstance(cand, ScheduleConfig) and self._launchable(cand):
                pred = self.predict(cand)
                if pred.fits and (best is None or pred.samples_per_s > best[0]):
                    best = (pred.samples_per_s, cand)
        if best is not None:
            return best[1]
        # No one-knob move left: try pairs (e.g. deeper pipelines need ZeRO <= 1 at the same time).
        pairs = [(a, b) for i, a in enumerate(moves) for b in moves[i + 1:] if a[0] != b[0]]
        self._rng.shuffle(pairs)
        for (k1, v1), (k2, v2) in pairs:
            cand = self.bound.derive({**point, k1: v1, k2: v2})
            if isinstance(cand, ScheduleConfig) and self._launchable(cand) and self.predict(cand).fits:
                return cand
        return None

    def propose(self) -> Proposal | None:
        """The next configuration to run, or None when no unmeasured feasible one is left."""
        import optuna

        self._proposed += 1
        while self._queue:
            config, source = self._queue.pop(0)
            if self._launchable(config) and self._check_prior(config) is None:
                return self._hand_out(config, self._ask_fixed(config), source)
        if self.local_every and self._proposed % self.local_every == 0:
            cand = self._neighbour()
            if cand is not None:
                return self._hand_out(cand, self._ask_fixed(cand), "local")
        futile = 0
        while futile < MAX_FUTILE_ASKS:
            trial = self.study.ask(self._dists)
            self.asks += 1
            derived = self.bound.derive(self._decode(trial.params))
            if isinstance(derived, Invalid):
                self._tell(trial, None, 1.0)
                futile += 1
                continue
            h = derived
            if self.redirect_repeats and (h in self.measured or h in self.pending):
                cand = self._neighbour_of(h)
                if cand is not None:
                    _tell(self.study, trial, None, optuna.trial.TrialState.FAIL)  # out of the history
                    return self._hand_out(cand, self._ask_fixed(cand), "neighbour")
            if h in self.measured:
                r = self.measured[h]
                self._tell(trial, r, 0.0 if r.status == "complete" else 1.0)
                futile += 1
                continue
            if h in self.pruned or h in self.pending or self._check_prior(derived) is not None:
                self._tell(trial, None, 1.0)
                futile += 1
                continue
            return self._hand_out(derived, trial, "sampler")
        for config in self.ranking():
            if self._launchable(config):
                return self._hand_out(config, self._ask_fixed(config), "fallback")
        return None

    def _hand_out(self, config: ScheduleConfig, trial: optuna.trial.Trial, source: str) -> Proposal:
        self.pending.add(config)
        return Proposal(config, trial, source)

    def complete(self, proposal: Proposal, result: TrialResult) -> None:
        """Tell the sampler what a proposal gave; it is then never proposed again."""
        h = proposal.config
        self.pending.discard(h)
        self.measured[h] = result
        self._tell(proposal.trial, result, 0.0 if result.status == "complete" else 1.0)

    def release(self, proposal: Proposal) -> None:
        """Give a proposal back unrun (it may be proposed again)."""
        import optuna

        self.pending.discard(proposal.config)
        _tell(self.study, proposal.trial, None, optuna.trial.TrialState.FAIL)


def best_of(results: Mapping[str, TrialResult]) -> float:
    """The best complete throughput among ``results`` (0 when none completed)."""
    vals = [r.samples_per_s for r in results.values() if r.status == "complete"]
    return max(vals) if vals else 0.0
