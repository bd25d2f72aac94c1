"""Probing configurations the prior predicts just over device memory (a learning study's memory check).

A configuration the cost model predicts over capacity is pruned and never run, so nothing a study
measures can tell the memory term it was wrong: if the optimum is predicted 7 % over capacity but
really fits, a study never finds it. The memory prediction has a known error band: on this
project's real trials (``python experiments/validate_cost_model.py --local-only --reuse``, 18
configurations on CPU ranks, ``experiments/results/cost_model_local_measurements.json``) the
predicted peak is within 10.8 % of the measured one (mean 2.8 %; over-predicted by up to 8.5 %,
under by up to 10.8 %), and the learned activation factor is fitted from few points.

``MemoryProbe`` therefore lets a study that learns (real trials) run, now and then, the
configuration the prior ranks best of all when its only fault is a predicted memory within that
band above capacity. Bounded: at most one probe every ``every`` launched trials, only when the
probe is predicted faster than every configuration predicted to fit, and none after a probe runs
out of memory with evidence (the allocator's or the kernel's word). A probe's outcome is an
ordinary trial: a completed one is stored and taught to the learner like any other (its measured
peak, or the "fits" hinge without one, lowers the activation factor where the model over-predicted),
an out-of-memory one is stored as ``oom``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoslapo.config import ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.result import TrialResult
from tuner.proposer import Proposal, Proposer

#: The memory model's error band (relative), measured as the module docstring says.
MEMORY_BAND = 0.108
#: At most one probe every this many launched trials.
PROBE_EVERY = 10
#: How many of the over-capacity configurations the first prior ranks best are kept as candidates
#: (wider than the band by half, since the learned activation factor moves predictions).
PROBE_POOL = 500


@dataclass
class MemoryProbe:
    """Picks and bounds the probes of one study; see the module docstring.

    ``capacity_bytes``: the device memory the prior prunes against. Nothing is probed until
    ``prepare`` has picked the candidates (a study that learns calls it). ``band``: how far above it a
    prediction may be (relative, in (0, 1)). ``every``: launched trials between two probes (>= 1).
    """

    capacity_bytes: int
    band: float = MEMORY_BAND
    every: int = PROBE_EVERY
    pool: list[ScheduleConfig] = field(default_factory=list)
    probes: list[tuple[ScheduleConfig, str]] = field(default_factory=list)  # (config, outcome status)
    stopped: str = ""  # why probing ended ("" while it goes on)
    _last: int = 0  # launched trials at the last probe (or at the start)

    def __post_init__(self) -> None:
        if not (0 < self.band < 1):
            raise UsageError(f"the memory probe's band must lie in (0, 1) of capacity: got {self.band!r}")
        if not isinstance(self.every, int) or self.every < 1:
            raise UsageError(f"the memory probe runs at most once every N >= 1 trials: got every={self.every!r}")
        if self.capacity_bytes < 0:
            raise UsageError(f"the memory probe needs the device capacity in bytes: got {self.capacity_bytes!r}")

    def _within(self, memory_bytes: int, widen: float = 1.0) -> bool:
        return self.capacity_bytes < memory_bytes <= self.capacity_bytes * (1 + self.band * widen)

    def prepare(self, proposer: Proposer) -> MemoryProbe:
        """Keep the first prior's best over-capacity candidates (the predictions are the ranking's,
        already computed), and stop if a stored trial shows a probe ran out of memory; returns itself."""
        for c, r in proposer.measured.items():  # a resumed study: a probe of an earlier run ran out of memory
            if r.status == "oom" and r.extra.get("oom_evidence") and not proposer.predict(c).fits:
                self.stopped = f"a probe predicted over capacity ran out of memory: {r.reason}"
        near = [(c, p) for c in proposer.bound.configs()
                if not (p := proposer.predict(c)).fits and self._within(p.memory_bytes, widen=1.5)]
        near.sort(key=lambda cp: -cp[1].samples_per_s)
        self.pool = [c for c, _ in near[:PROBE_POOL]]
        return self

    def pick(self, proposer: Proposer, launched: int) -> Proposal | None:
        """A probe to run now, or None (not due, stopped, or no candidate beats the fitting best)."""
        if self.stopped or not self.pool or launched - self._last < self.every:
            return None
        fitting_best = proposer.best_predicted()
        best: tuple[float, ScheduleConfig] | None = None
        for c in self.pool:
            p = proposer.predict(c)
            if p.fits or not self._within(p.memory_bytes) or not proposer.probeable(c):
                continue
            if p.samples_per_s > fitting_best and (best is None or p.samples_per_s > best[0]):
                best = (p.samples_per_s, c)
        if best is None:
            return None
        self._last = launched
        return proposer.hand_out_probe(best[1])

    def observe(self, proposal: Proposal, result: TrialResult) -> None:
        """Record a probe's outcome (other proposals are ignored); an out-of-memory one with
        evidence ends probing."""
        if proposal.source != "probe":
            return
        self.probes.append((proposal.config, result.status))
        if result.status == "oom" and result.extra.get("oom_evidence"):
            self.stopped = f"a probe predicted over capacity ran out of memory: {result.reason}"
