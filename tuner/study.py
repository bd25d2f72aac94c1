"""A study: the proposer picks, an evaluator scores (inline or through Ray), the store remembers.

Budget (documented choice): ``trials`` counts *launched* trials, i.e. distinct configurations
actually evaluated (statuses complete, oom, failed, timeout). Configurations the cost model
predicts cannot fit are not launched: they are stored as ``pruned`` with the reason and told to
the sampler as infeasible, but do not count. Points that break a rule (tp not dividing the heads,
a micro-batch that does not fill the batch) are not configurations at all and are never stored.
A study therefore ends with exactly ``trials`` launched trials, or with every configuration
predicted to fit when the space holds fewer, or earlier on ``timeout_s`` or ``patience``.

Resume: trials a killed tuner left ``running`` are marked ``failed`` (interrupted) and run again
first under their own numbers; finished trials are told to the sampler and never re-run (the
store refuses a second row for a configuration), so a resumed study also ends at its budget.

Repeats (``repeats``, real trials only): after the search the best few trials and the baselines
are measured again in interleaved rounds, and their stored throughput becomes the median
(``tuner/repeats.py``).

Sweep (``sweep``; auto for the plain ``SimEvaluator`` under inline dispatch): the cost model is the
evaluator, so every valid configuration is scored instead of sampled, and the best ``trials`` are
stored (``tuner/sweep.py``); ``sweep=False`` samples as above (the sampler is for real trials and
for the benchmarks' perturbed or replayed landscapes, which always sample unless told to sweep).
``timeout_s`` counts from the runner's construction (walking and ranking the space are part of the
search) and stops a sweep too, which then stores the best of what it scored; ``patience`` is refused
by a sweep (it has no trial order to be patient over).

Every finished trial is also mirrored (in batches) into an Optuna study of the same name in the
store's database, for ``optuna-dashboard`` (``tuner/mirror.py``); the sampler's own study stays in memory.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.errors import StorageError, StorageLost, UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from autoslapo.storage import BASELINES_SUFFIX
from search_spaces import BoundSpace, space_for
from tuner.baselines import BaselineContext
from tuner.evaluators import Evaluator, SimEvaluator, make_evaluator
from tuner.heartbeat import heartbeat
from tuner.learning import PriorLearner, with_prediction
from tuner.mirror import OptunaMirror
from tuner.options import Progress, TuneOptions, check_patience
from tuner.probe import MemoryProbe
from tuner.proposer import Prediction, Proposal, Proposer
from tuner.resume import resume_target, submitted_space
from tuner.sweep import Sweep, run_sweep
from tuner.walk import Tick

if TYPE_CHECKING:
    from store import Store, TrialRecord

LAUNCHED = ("complete", "oom", "failed", "timeout")
INTERRUPTED_PREFIX = "interrupted"


#: How many of the first prior's best configurations a learning study re-ranks after each refit.
LEARNED_SHORTLIST = 2000
#: ... and every this many trials it takes the shortlist anew from the whole corrected ranking.
LEARNED_REFRESH = 20


@dataclass
class TuneOutcome:
    """What a finished (or stopped) study gave."""

    study: str
    launched: int
    pruned: int
    best_config: ScheduleConfig | None
    best_result: TrialResult | None
    stop_reason: str
    elapsed_s: float
    counts: dict[str, int]
    baselines: dict[str, Any] = field(default_factory=dict)
    asks: int = 0
    sweep: dict[str, Any] | None = None  # a swept study's ``Sweep.summary`` (configurations scored, counts)


def default_study_name(model: ModelSpec, cluster: ClusterSpec, backend: str) -> str:
    """``<preset>-<gpus>x<gpu_type>-<backend>``: the name a study gets when none is given."""
    return f"{model.preset}-{cluster.gpus}x{cluster.gpu_type}-{backend}"


class StudyRunner:
    """Runs one study against a store. Use ``run()``; ``propose``/``complete`` serve the Ray searcher."""

    def __init__(self, options: TuneOptions, store: Store, *, evaluator: Evaluator | None = None,
                 progress: Callable[[Progress], None] | None = None,
                 opened: Callable[[str], None] | None = None) -> None:
        # ``--timeout`` counts from here: ranking the space is part of the search
        self.started = time.monotonic()
        self.deadline = None if options.timeout_s is None else self.started + options.timeout_s
        self.options = options
        self.store = store
        self.progress = progress
        name = options.study or default_study_name(options.model, options.cluster, options.backend)
        if options.resume and options.study is None:  # the default name's newest interrupted study (-2, -3 ...)
            name = resume_target(store, name, options.model.signature(), options.cluster.fingerprint())
        self.space = space = (options.space or (submitted_space(store, name) if options.resume else None)
                              or space_for(options.model.family))
        self.evaluator = evaluator or make_evaluator(options.backend, options.model, options.cluster,
                                                     steps=options.steps, timeout_s=options.trial_timeout_s)
        # Real trials run only what the runtime trains in (``runtime.check.RUNTIME_PRECISIONS``).
        from autoslapo.runtime.check import RUNTIME_PRECISIONS

        precisions = None if self.evaluator.instant else RUNTIME_PRECISIONS
        self.bound: BoundSpace = space.bind(options.model, options.cluster, options.global_batch, precisions)
        self.bound.check_layouts()  # before the study is created: bad input leaves the store as it was
        if options.dispatch == "ray" and not options.ray_address and not self.evaluator.instant:
            from tuner.dispatch import check_local_devices

            check_local_devices(options.cluster)  # the Ray started here runs its trials here
        auto = type(self.evaluator) is SimEvaluator and options.dispatch == "inline"
        self.sweeping = auto if options.sweep is None else options.sweep
        if self.sweeping and not self.evaluator.instant:
            raise UsageError(f"a sweep scores every configuration: it needs an estimating backend (sim), not "
                             f"{self.evaluator.name!r}; drop the sweep option to sample real trials")
        check_patience(options.patience, self.sweeping)
        self.sweep: Sweep | None = None
        self.name = self._open_study(name)
        if opened is not None:
            opened(self.name)  # the CLI names it if the run is interrupted
        store.raise_budget(self.name, options.trials)  # the study's own budget: raised, never lowered
        # Real trials teach the prior (the cluster's calibration, read from and saved to the store).
        learns = options.learn_prior if options.learn_prior is not None else not self.evaluator.instant
        self.learner = PriorLearner(store, options.model, options.cluster, enabled=learns,
                                    runtime_device=self._runtime_device())
        self.proposer = Proposer(self.bound, sampler=options.sampler, seed=options.seed,
                                 prior=self.learner.prior(), concurrency=options.max_concurrent)
        self._predicted: dict[ScheduleConfig, Prediction] = {}  # the prior's prediction when proposed
        self.proposer.on_pruned = self._record_pruned
        self._pending_pruned: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._full = False  # the store said the (shared) budget is used up
        self._numbers: dict[str, int] = {}  # config hash -> stored trial number (retries)
        self._started: set[int] = set()  # trial numbers written as running
        self.counts: dict[str, int] = {}
        self.launched = 0
        self.pruned = 0
        self.best = 0.0
        self.best_config: ScheduleConfig | None = None
        self.best_result: TrialResult | None = None
        self._since_best = 0
        self.prober = MemoryProbe(options.cluster.memory_bytes)  # probes only once prepared (learning)
        self.mirror: OptunaMirror | None = None
        if options.mirror:
            self.mirror = OptunaMirror(store, self.name, self.bound, multi=self.proposer.multi,
                                       every=options.mirror_every, own_only=options.join,
                                       retried_prefix=INTERRUPTED_PREFIX)
        try:
            self._load()
        except BaseException:  # Ctrl-C while ranking the space: stopped, not ``created``; --resume starts it
            if not options.join:
                with contextlib.suppress(StorageError):
                    store.set_study_status(self.name, "stopped")
            raise

    def baseline_context(self) -> BaselineContext:
        """What the baselines read from this study: bound space, prior, evaluator, measured results."""
        return BaselineContext(self.bound, self.proposer.predict, self.evaluator.evaluate, self.proposer.measured)

    def _runtime_device(self) -> str | None:
        if self.options.backend == "sim" or self.evaluator.name not in ("local", "ray"):
            return None
        return "cpu" if self.options.cluster.gpu_type == "cpu" else "cuda"

    # --- study lifecycle -------------------------------------------------------------------
    def _open_study(self, name: str) -> str:
        o = self.options
        if name.endswith(BASELINES_SUFFIX):
            raise UsageError(f"study names ending in {BASELINES_SUFFIX!r} are the tuner's own (a study's baselines): "
                             f"got {name!r}; tune, resume or join {name.removesuffix(BASELINES_SUFFIX)!r} instead")
        sig, fp = o.model.signature(), o.cluster.fingerprint()
        if o.resume:
            rec = self.store.get_study(name)  # StorageError listing known studies if absent
            if (rec.model_signature, rec.cluster_fingerprint) != (sig, fp):
                raise UsageError(f"--resume needs the same model and cluster as the study: {name!r} tuned "
                                 f"{rec.model_name} on {ClusterSpec.from_dict(rec.cluster).described_as()}; pass "
                                 "the same MODEL, --gpus, --gpu-type, --gpus-per-node and link flags")
            return name
        if o.study is None and self.store.has_study(name):
            i = 2
            while self.store.has_study(f"{name}-{i}"):
                i += 1
            name = f"{name}-{i}"
        self.store.create_study(
            name, model=o.model.to_dict(), cluster=o.cluster.to_dict(), space_name=self.space.name,
            space_version=self.space.version, objective="samples_per_s", backend=o.backend,
            model_signature=sig, cluster_fingerprint=fp, exist_ok=o.join,
        )
        return name

    def _load(self) -> None:
        """Bring the sampler up to date with the stored trials (resume) or similar studies (warm)."""
        if not self.options.join:  # joined tuners' running trials belong to tuners still alive
            self.store.mark_stale_running(self.name)
        retries: list[tuple[ScheduleConfig, int]] = []
        for t in self.store.trials(self.name):
            config = ScheduleConfig.from_dict(t.config)
            if t.status == "running":  # another tuner's, in flight: never proposed here
                self.proposer.pending.add(config)
                continue
            if t.status == "failed" and t.reason.startswith(INTERRUPTED_PREFIX):
                retries.append((config, t.number))
                continue
            result = TrialResult.from_dict(t.result) if t.result else TrialResult.failure(t.status, t.reason)  # type: ignore[arg-type]
            self.proposer.add_known(config, result, own=True)
            self._count(config, result)
        for config, number in retries:
            self._numbers[config.config_hash()] = number
        self.proposer.enqueue([c for c, _ in retries], "retry")
        if self.launched == 0 and not self.options.resume and self.options.warm_start:
            from tuner.resume import warm_start
            warm_start(self.store, self.name, self.proposer, self.options.model, self.options.cluster)
        if self.options.resume and self.mirror is not None:
            self.mirror.sync()  # catch up what a killed tuner had not mirrored yet
        k = self.options.prior_seeds if self.options.prior_seeds is not None else min(10, max(3, self.options.trials // 10))
        if self.sweeping:
            return  # a sweep ranks every configuration itself (tuner/sweep.py): nothing to seed
        if k or self.learner.enabled:
            self.note(f"ranking the space by the cost model (up to {self.bound.size:,} points; once)")
            if not self.proposer.rank(tick=self.tick("ranking the space by the cost model"), deadline=self.deadline):
                return  # --timeout passed while ranking: ``run`` stops at once, by timeout
        if k:
            self.proposer.enqueue(self.proposer.ranking()[:k], "prior")
        if self.learner.enabled and self.options.learned_every:
            self.proposer.shortlist = self.proposer.ranking()[:LEARNED_SHORTLIST]
        if self.learner.enabled:  # a study that learns also probes just over capacity (tuner/probe.py)
            self.prober.prepare(self.proposer)

    def _count(self, config: ScheduleConfig, result: TrialResult) -> None:
        self.counts[result.status] = self.counts.get(result.status, 0) + 1
        if result.status == "pruned":
            self.pruned += 1
            return
        self.launched += 1
        if result.status == "complete" and result.samples_per_s > self.best:
            self.best, self.best_config, self.best_result = result.samples_per_s, config, result
            self._since_best = 0
        else:
            self._since_best += 1

    # --- store writes ----------------------------------------------------------------------
    # Trial numbers come from the store (``claim_trial``/``add_new_trials``), never from a local
    # counter, so tuners sharing a study (``join``) never collide and never pass the budget.
    def _record_pruned(self, config: ScheduleConfig, reason: str) -> None:
        result = TrialResult.failure("pruned", reason, measured=False)
        self._pending_pruned.append((config.to_dict(), result.to_dict()))
        self._count(config, result)

    def flush(self) -> None:
        """Write the buffered ``pruned`` rows in one transaction (they are cheap to re-derive)."""
        if self._pending_pruned:
            self.store.add_new_trials(self.name, self._pending_pruned)
            self._pending_pruned = []

    def _taken_elsewhere(self, proposal: Proposal, existing: TrialRecord) -> None:
        """Another tuner of the study has this config: learn its result, or leave it to them."""
        if existing.status == "running":
            self.proposer.release(proposal)
            self.proposer.pending.add(proposal.config)  # in flight elsewhere: never propose it here
            return
        result = (TrialResult.from_dict(existing.result) if existing.result.get("status")
                  else TrialResult.failure(existing.status, existing.reason))  # type: ignore[arg-type]
        self.proposer.complete(proposal, result)

    # --- the loop's two halves (also used by the Ray searcher) ------------------------------
    def propose(self) -> tuple[Proposal, int] | None:
        """The next proposal and its trial number, written as ``running`` (unless instant)."""
        from store import DuplicateTrial

        while True:
            p = self.prober.pick(self.proposer, self.launched) or self.proposer.propose()
            self.flush()
            if p is None:
                return None
            was = self.store.find_trial(self.name, p.config.to_dict()) if p.source == "probe" else None
            if was is not None and was.status == "pruned":  # the probe restarts its pruned row
                self._numbers[p.config.config_hash()] = was.number
                self.pruned, self.counts["pruned"] = self.pruned - 1, self.counts["pruned"] - 1
            self._predicted[p.config] = self.proposer.predict(p.config)
            key = p.config.config_hash()
            retry = self._numbers.get(key)
            if retry is None and self.evaluator.instant and self.options.dispatch != "ray":
                return p, -1  # stored once, with its result, by ``complete``
            try:
                if retry is not None:
                    rec: TrialRecord | None = self.store.start_trial(self.name, retry, p.config.to_dict(),
                                                                     restart=True)
                else:
                    rec = self.store.claim_trial(self.name, p.config.to_dict(), budget=self.options.trials)
            except DuplicateTrial as dup:
                self._numbers.pop(key, None)
                self._taken_elsewhere(p, dup.existing)
                continue
            if rec is None:  # the study's budget is used up (by the tuners sharing it)
                self.proposer.release(p)
                self._full = True
                return None
            self._started.add(rec.number)
            return p, rec.number

    def complete(self, proposal: Proposal, number: int, result: TrialResult) -> None:
        """Store a finished trial, tell the sampler, refit the prior (real trials), report progress."""
        predicted = self._predicted.pop(proposal.config, None)
        if not self.evaluator.instant and predicted is not None:
            result = with_prediction(result, predicted)
        if number in self._started:
            self.store.finish_trial(self.name, number, result.to_dict())
            self._started.discard(number)
        else:  # instant trials are written once, when they finish
            from store import DuplicateTrial

            try:
                rec = self.store.claim_trial(self.name, proposal.config.to_dict(), budget=self.options.trials,
                                             result=result.to_dict())
            except DuplicateTrial as dup:
                self._taken_elsewhere(proposal, dup.existing)
                return
            if rec is None:
                self.proposer.release(proposal)
                self._full = True
                return
            number = rec.number
        self._numbers.pop(proposal.config.config_hash(), None)
        self.proposer.complete(proposal, result)
        self._count(proposal.config, result)
        self.prober.observe(proposal, result)
        if self.learner.observe(proposal.config, result):
            self.proposer.set_prior(self.learner.prior())
            every = self.options.learned_every
            if every and self.launched % LEARNED_REFRESH == 0:
                # the corrected prior may rank configurations far down the first ranking at the top
                self.proposer.shortlist = self.proposer.ranking()[:LEARNED_SHORTLIST]
            if every and self.launched % every == 0 and not self.proposer.has_queued("prior", "learned"):
                self.proposer.seed_best("learned")
        if self.mirror is not None:
            self.mirror.note(number)
        if self.progress is not None:
            self.progress(Progress(self.launched, self.options.trials, self.best, dict(self.counts),
                                   f"#{number} {result.status}"))

    def should_stop(self, started: float) -> str | None:
        """Why the study stops now, or None to go on."""
        if self.launched >= self.options.trials or self._full:
            return "budget"
        if self.options.timeout_s is not None and time.monotonic() - started >= self.options.timeout_s:
            return "timeout"
        if self.options.patience is not None and self.best > 0 and self._since_best >= self.options.patience:
            return "patience"
        return None

    # --- running ---------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """Show ``text`` on the progress line: what the phases after the search (baselines, repeats) run."""
        if self.progress is not None:
            self.progress(Progress(self.launched, self.options.trials, self.best, dict(self.counts), text))

    def tick(self, what: str) -> Tick:
        """A ``tick(done, total, unit)`` that shows ``what: done of total unit`` on the progress line."""
        def show(done: int, total: int, unit: str) -> None:
            if self.progress is not None:
                self.progress(Progress(self.launched, self.options.trials, self.best, dict(self.counts),
                                       f"{what}: {done:,} of {total:,} {unit}", done=done, of=total))
        return show

    def run(self) -> TuneOutcome:
        """Run the study to its budget (or a stop) and score the baselines; returns the outcome."""
        started = self.started
        # a resumed study that ended complete has its baselines and repeats (one stopped may not)
        done = self.options.resume and self.store.get_study(self.name).status == "complete"
        self.store.set_study_status(self.name, "running")
        before = len(self.store.trials(self.name)) if done else -1
        try:
            stop = run_sweep(self) if self.sweeping else self.should_stop(started)
            if stop is None:
                if self.options.dispatch == "ray":
                    from tuner.dispatch import run_with_ray

                    stop = run_with_ray(self, started)
                else:
                    stop = self._run_inline(started)
            self.flush()
        except StorageLost:
            raise
        except StorageError as err:
            raise StorageLost(f"{err}; the study {self.name!r} stopped mid-run and keeps every trial stored; "
                              "rerun with --resume once the database answers") from None
        if self.mirror is not None:
            self.mirror.sync()
        outcome = TuneOutcome(self.name, self.launched, self.pruned, self.best_config, self.best_result,
                              stop, time.monotonic() - started, dict(self.counts), asks=self.proposer.asks,
                              sweep=self.sweep.summary(self.launched) if self.sweep else None)
        added = not done or len(self.store.trials(self.name)) != before  # else: nothing to re-measure
        if self.options.baselines:
            from tuner.baselines import score_baselines

            outcome.baselines = score_baselines(self, outcome, measure=added)  # re-measures the finalists with them
        elif self.options.repeats and added:
            from tuner.repeats import remeasure

            remeasure(self, outcome)
        self.store.set_study_status(self.name, "complete" if stop in ("budget", "exhausted", "swept") else "stopped")
        return outcome

    def _run_inline(self, started: float) -> str:
        while True:
            stop = self.should_stop(started)
            if stop:
                return stop
            nxt = self.propose()
            if nxt is None:
                return "budget" if self._full else "exhausted"
            proposal, number = nxt
            self.complete(proposal, number, self.evaluator.evaluate(proposal.config))


def tune(options: TuneOptions, store: Store, *, evaluator: Evaluator | None = None,
         progress: Callable[[Progress], None] | None = None,
         opened: Callable[[str], None] | None = None) -> TuneOutcome:
    """Run (or resume) a study; returns its outcome. Raises UsageError/StorageError for bad input (exit
    code 2); StorageLost (exit code 1) when the store fails once the study is running (what is stored
    stays; ``resume=True`` continues). ``opened(name)``: called once the study is created or found."""
    runner = StudyRunner(options, store, evaluator=evaluator, progress=progress, opened=opened)
    try:
        with heartbeat(store, runner.name):  # a live tuner's study reads running; a killed one's, silent
            return runner.run()
    except BaseException as err:  # Ctrl-C, a closed pipe, an error: stopped; its trials in flight are re-run by --resume
        if not options.join and not isinstance(err, StorageLost):  # (tuners that share it go on)
            with contextlib.suppress(StorageError):
                store.set_study_status(runner.name, "stopped")
                store.mark_stale_running(runner.name)
        raise
