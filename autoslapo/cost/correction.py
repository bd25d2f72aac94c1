"""A small per-cluster correction of the cost model, fitted to measured trials. Pure.

The cost model's device and link figures (``DevicePerf``, ``ClusterSpec``) come from datasheets or
a profile; a real cluster reaches more or less. ``Correction`` holds seven multiplicative factors,
each a physical knob of the model, bounded to [1/4, 4]:

* ``compute``: the achieved GEMM rate (``gemm_eff``, or a measured GEMM curve's rates);
* ``memory_bw``: the memory bandwidth elementwise kernels reach (``hbm_gbps``, or a copy curve);
* ``intra_bw`` / ``inter_bw``: the bandwidth collectives reach inside a node (tensor parallelism,
  node-local data parallelism) and between nodes (``ClusterSpec.intra_node_gbps`` /
  ``inter_node_gbps``): one factor per link, since a cluster's NVLink and its network are off by
  different amounts and move different layouts;
* ``latency``: the per-op and per-collective-hop latencies (``op_latency_s``, ``coll_latency_s``);
* ``overhead``: the runtime's fixed cost a step and a micro-batch (``step_overhead_s``,
  ``microbatch_overhead_s``);
* ``activation``: resident bytes per activation byte the model counts (``activation_slack`` and
  ``heap_retention``).

``fit_correction`` fits them in log space to ``Observation`` s (a configuration with what was
measured): throughput residuals move the six speed factors; peak memory, and an ``oom`` *with
evidence* that the kernel or the allocator ran out where the model said it fits (or a run that
completed where it said it would not), move the activation factor. A ridge toward 1 (``prior_weight``
pseudo-observations) keeps few points from moving the factors far. ``Correction.apply`` gives the
corrected ``DevicePerf`` and ``Correction.apply_cluster`` the corrected links, for
``estimate(model, config, correction.apply_cluster(cluster), perf=correction.apply(perf))``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from autoslapo.cost.device import DevicePerf, device_perf
from autoslapo.cost.estimate import estimate, estimate_family_memory
from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec

#: Each factor stays within [1/BOUND, BOUND]: a cluster 4x off its preset is a wrong preset, not a correction.
BOUND = 4.0
SPEED_FACTORS = ("compute", "memory_bw", "intra_bw", "inter_bw", "latency", "overhead")
#: The fit keeps the most recent observations only (a refit after every trial stays cheap).
MAX_OBSERVATIONS = 64
# An out-of-memory run where the model predicted a fit says the prediction was at least this much
# too low (the run needed more than the device had): the hinge pushes the prediction above capacity.
_OOM_MARGIN = 1.02


@dataclass(frozen=True)
class Correction:
    """Multiplicative factors on a device's achievable figures (1.0 = the model as it is)."""

    compute: float = 1.0
    memory_bw: float = 1.0
    intra_bw: float = 1.0
    inter_bw: float = 1.0
    latency: float = 1.0
    overhead: float = 1.0
    activation: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not (1 / BOUND <= v <= BOUND):
                raise ConfigError(f"correction factor {f.name} must lie in [{1 / BOUND:g}, {BOUND:g}]: got {v!r}; "
                                  "refit the calibration or drop it")

    def is_identity(self) -> bool:
        return all(getattr(self, f.name) == 1.0 for f in fields(self))

    def to_dict(self) -> dict[str, float]:
        """The factors by name (JSON-safe); ``Correction.from_dict(c.to_dict()) == c``."""
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Correction:
        """Inverse of ``to_dict``; unknown keys are an error naming the valid ones.

        A calibration stored before the links had a factor each (one ``comm`` factor on both, and
        ``overhead`` on the latencies too) is read as that: ``comm`` on both links, ``overhead``
        also as ``latency``.
        """
        if "comm" in d:
            d = dict(d)
            comm = d.pop("comm")
            d.setdefault("intra_bw", comm)
            d.setdefault("inter_bw", comm)
            d.setdefault("latency", d.get("overhead", 1.0))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown correction factors {unknown}; valid factors are {sorted(known)}")
        return cls(**{k: float(v) for k, v in d.items()})

    def apply(self, perf: DevicePerf) -> DevicePerf:
        """``perf`` with the device factors applied (speeds multiplied, latencies and memory scaled);
        the link factors are the cluster's (``apply_cluster``)."""
        if self.is_identity():
            return perf
        lat, o = self.latency, self.overhead
        return replace(
            perf,
            gemm_eff=perf.gemm_eff * self.compute,
            gemm_curve=tuple((f, r * self.compute) for f, r in perf.gemm_curve),
            hbm_gbps=perf.hbm_gbps * self.memory_bw,
            mem_curve=tuple((b, r * self.memory_bw) for b, r in perf.mem_curve),
            op_latency_s=perf.op_latency_s * lat,
            coll_latency_s=perf.coll_latency_s * lat,
            step_overhead_s=perf.step_overhead_s * o,
            microbatch_overhead_s=perf.microbatch_overhead_s * o,
            activation_slack=perf.activation_slack * self.activation,
            heap_retention=perf.heap_retention * self.activation,
        )

    def apply_cluster(self, cluster: ClusterSpec) -> ClusterSpec:
        """``cluster`` with the link factors applied to its intra- and inter-node bandwidths."""
        if self.intra_bw == 1.0 and self.inter_bw == 1.0:
            return cluster
        return replace(cluster, intra_node_gbps=cluster.intra_node_gbps * self.intra_bw,
                       inter_node_gbps=cluster.inter_node_gbps * self.inter_bw)


@dataclass(frozen=True)
class Observation:
    """One measured trial: what ran (model, config, cluster) and what it gave.

    ``status``: ``complete`` or ``oom`` (others carry no information for the fit).
    ``samples_per_s`` / ``peak_memory_bytes``: the measurement of a complete trial (None if absent).
    ``oom_evidence``: for an ``oom``, whether the kernel or the allocator said so (an oom without
    evidence may be a kill by something else, and moves nothing).
    """

    model: ModelSpec
    config: ScheduleConfig
    cluster: ClusterSpec
    status: str
    samples_per_s: float | None = None
    peak_memory_bytes: int | None = None
    oom_evidence: bool = False


def _factor(x: float) -> float:
    return min(BOUND, max(1 / BOUND, math.exp(x)))


def _speed_correction(logs: Sequence[float], activation: float = 1.0) -> Correction:
    return Correction(**dict(zip(SPEED_FACTORS, (_factor(v) for v in logs), strict=True)), activation=activation)


def _fit_speed(obs: Sequence[Observation], base: DevicePerf, start: Correction, weight: float) -> dict[str, float]:
    from scipy.optimize import least_squares  # heavy; only a refit needs it

    speed = [o for o in obs if o.status == "complete" and o.samples_per_s and o.samples_per_s > 0]
    if not speed:
        return {k: getattr(start, k) for k in SPEED_FACTORS}
    n = len(SPEED_FACTORS)
    lo, hi = -math.log(BOUND), math.log(BOUND)
    ridge = math.sqrt(weight)

    def residuals(x: Any) -> list[float]:
        c = _speed_correction(x)
        perf = c.apply(base)
        r = [math.log(o.samples_per_s) - math.log(  # type: ignore[arg-type]
            estimate(o.model, o.config, c.apply_cluster(o.cluster), perf=perf, validate=False).samples_per_s)
            for o in speed]
        return r + [ridge * v for v in x]

    x0 = [min(hi, max(lo, math.log(getattr(start, k)))) for k in SPEED_FACTORS]
    # Tolerances of 1e-4 in log space (0.01 %) are far below any measurement's noise; a refit after
    # every trial starts from the last one and stops within a few Jacobians.
    sol = least_squares(residuals, x0, bounds=([lo] * n, [hi] * n), diff_step=1e-3, x_scale=1.0, max_nfev=30,
                        ftol=1e-4, xtol=1e-4, gtol=1e-4)
    return {k: _factor(v) for k, v in zip(SPEED_FACTORS, sol.x, strict=True)}


def _fit_activation(obs: Sequence[Observation], base: DevicePerf, start: Correction, weight: float) -> float:
    from scipy.optimize import minimize_scalar

    terms: list[tuple[str, int, int, int]] = []  # kind, other bytes, activation bytes at factor 1, target bytes
    for o in obs:
        m = estimate_family_memory(o.model, o.config, base)
        other, act = m.total - m.activations, m.activations
        cap = o.cluster.memory_bytes
        if o.status == "complete" and o.peak_memory_bytes:
            terms.append(("peak", other, act, int(o.peak_memory_bytes)))
        elif o.status == "complete" and m.total > cap:
            terms.append(("fits", other, act, cap))  # ran although predicted not to fit
        elif o.status == "oom" and o.oom_evidence and m.total <= cap:
            terms.append(("oom", other, act, int(cap * _OOM_MARGIN)))  # out of memory though predicted to fit
    if not terms:
        return start.activation

    def loss(x: float) -> float:
        a = math.exp(x)
        total = weight * x * x
        for kind, other, act, target in terms:
            r = math.log(max(other + a * act, 1)) - math.log(max(target, 1))
            if kind == "peak":
                total += r * r
            elif kind == "fits":
                total += max(0.0, r) ** 2
            else:
                total += max(0.0, -r) ** 2
        return total

    lo, hi = -math.log(BOUND), math.log(BOUND)
    sol = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    return _factor(float(sol.x))


def fit_correction(observations: Sequence[Observation], base: DevicePerf, *,
                   start: Correction | None = None, prior_weight: float = 0.5) -> Correction:
    """The correction that best explains ``observations`` on top of ``base`` (the uncorrected perf).

    Fitted in log space: the speed factors by bounded least squares of log throughput, the
    activation factor by a bounded 1-D fit of log peak memory plus hinges for ooms with evidence
    and runs that completed where the model said they would not fit. ``prior_weight``: the ridge
    toward 1, in observations (with none, the factors stay at 1). ``start``: where the search
    begins (the stored calibration). Only the last ``MAX_OBSERVATIONS`` observations count.
    Returns a ``Correction`` with every factor in [1/4, 4]. Raises ConfigError for a negative weight.
    """
    if prior_weight < 0:
        raise ConfigError(f"prior_weight must not be negative: got {prior_weight}; pass 0 or more")
    start = start or Correction()
    obs = list(observations)[-MAX_OBSERVATIONS:]
    speed = _fit_speed(obs, base, start, prior_weight)
    activation = _fit_activation(obs, base, start, prior_weight)
    return Correction(**speed, activation=activation)


def _as_correction(correction: Correction | dict[str, Any] | None) -> Correction | None:
    if correction is None or isinstance(correction, Correction):
        return correction
    return Correction.from_dict(correction)


def corrected_perf(cluster: ClusterSpec, correction: Correction | dict[str, Any] | None,
                   profile: dict[str, Any] | None = None) -> DevicePerf:
    """``device_perf(cluster, profile)`` with ``correction`` (a ``Correction`` or its dict) applied."""
    perf = device_perf(cluster, profile)
    c = _as_correction(correction)
    return perf if c is None else c.apply(perf)


def corrected_cluster(cluster: ClusterSpec, correction: Correction | dict[str, Any] | None) -> ClusterSpec:
    """``cluster`` with the link factors of ``correction`` (a ``Correction`` or its dict) applied."""
    c = _as_correction(correction)
    return cluster if c is None else c.apply_cluster(cluster)
