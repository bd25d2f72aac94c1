"""Evaluators: how a trial of one configuration is scored.

* ``SimEvaluator``: the cost model on the described cluster (no devices; instant).
* ``LocalEvaluator``: the real trial runtime on this machine's ranks (gloo on CPU, nccl on GPU).
* ``ReplayEvaluator``: a stored landscape (configuration -> result) read back, for benchmarks.
* ``PerturbedSimEvaluator``: the cost model with its parameters perturbed and noise added, a
  landscape where the search's prior (the unperturbed model) is not the truth.

Each returns a ``TrialResult``; a failure is data (status and reason), never an exception.
``cost_prior`` turns the unperturbed cost model into the ``Prior`` the proposer filters with.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOBS, ScheduleConfig
from autoslapo.errors import UsageError
from autoslapo.models.modcache import ensure_entry, read_entry
from autoslapo.models.spec import USER_FAMILY, ModelSpec
from autoslapo.result import TrialResult
from tuner.proposer import Prediction, Prior

if TYPE_CHECKING:
    from autoslapo.cost.correction import Correction

BACKENDS: tuple[str, ...] = ("sim", "local", "ray")


class Evaluator(Protocol):
    """Scores one configuration. ``instant``: cheap enough to run inline with one store write."""

    name: str
    instant: bool

    def evaluate(self, config: ScheduleConfig) -> TrialResult: ...


def cost_prior(model: ModelSpec, cluster: ClusterSpec, *, runtime_device: str | None = None,
               correction: Correction | None = None) -> Prior:
    """The cost model as a prior: predicted fit and throughput of a configuration.

    With ``runtime_device`` ("cpu" or "cuda") a configuration the real runtime refuses on that
    device (``check_runnable``: fp16, flash without CUDA, fewer micro-batches than stages...) is
    predicted not to fit either, so a real study never spends a trial on it, and the memory is
    autoslapo's runtime's (``for_autoslapo_runtime``: fp32 weights under autocast, transformers'
    modules), which the real trial runs, not the published stack a GPU preset describes.
    ``correction``: the cluster's calibration (``autoslapo.cost.correction``), applied to the
    device's figures.
    """
    from autoslapo.cost import estimate
    from autoslapo.cost.correction import corrected_cluster, corrected_perf
    from autoslapo.cost.device import for_autoslapo_runtime

    perf = corrected_perf(cluster, correction)
    if runtime_device is not None:
        perf = for_autoslapo_runtime(perf)
    links = corrected_cluster(cluster, correction)  # the memory capacity stays the cluster's
    check: Callable[..., None] | None = None
    if runtime_device is not None:
        from autoslapo.runtime import check_runnable

        check = check_runnable

    def predict(config: ScheduleConfig) -> Prediction:
        if check is not None:
            try:
                check(model, config, device=runtime_device)
            except UsageError as err:
                return Prediction(False, 0.0, 0, f"the runtime cannot run it: {err}")
        e = estimate(model, config, links, perf=perf, validate=False)
        reason = "" if e.fits else (
            f"predicted {e.memory_per_device_bytes / 2**30:.1f} GiB per device exceeds "
            f"{e.memory_capacity_bytes / 2**30:.1f} GiB")
        return Prediction(e.fits, e.samples_per_s, e.memory_per_device_bytes, reason)

    return predict


@dataclass
class SimEvaluator:
    """The cost model's estimate of the configuration on ``cluster`` (``measured=False``)."""

    model: ModelSpec
    cluster: ClusterSpec
    name: str = "sim"
    instant: bool = True

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        from autoslapo.cost import estimate

        return estimate(self.model, config, self.cluster).to_trial_result()


@dataclass
class LocalEvaluator:
    """The real trial runtime: ``world_size`` local ranks build the model and time ``steps`` steps."""

    model: ModelSpec
    cluster: ClusterSpec
    steps: int = 4
    timeout_s: float = 300.0
    name: str = "local"
    instant: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A model file travels with the evaluator (Ray pickles it to other nodes), so a node whose
        # cache lacks the file writes it before its ranks load it by digest.
        self._module_file: tuple[str, str, bytes] | None = None
        if self.model.family == USER_FAMILY:
            digest, name = str(self.model.extra["digest"]), f"{self.model.extra['module']}.py"
            self._module_file = (digest, name, read_entry(digest, name))

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        if self._module_file is not None:
            ensure_entry(*self._module_file)
        try:
            from autoslapo.runtime import run_trial
        except ImportError as err:  # the runtime is an optional piece of a partial install
            return TrialResult.failure("failed", f"the trial runtime is unavailable: {err}", host=socket.gethostname())
        device = "cpu" if self.cluster.gpu_type == "cpu" else "cuda"
        # ``steps`` are the timed steps (``--steps``); warm-up steps come on top of them.
        opts: dict[str, Any] = {"warmup": 1, **self.options}
        try:
            return run_trial(self.model, config, steps=self.steps + opts["warmup"], timeout_s=self.timeout_s,
                             device=device, **opts)
        except Exception as err:  # a trial that cannot run is data, not a crash
            return TrialResult.failure("failed", f"{type(err).__name__}: {err}", host=socket.gethostname())


@dataclass
class ReplayEvaluator:
    """A measured landscape read back: configuration hash -> stored result."""

    table: Mapping[str, TrialResult]
    name: str = "replay"
    instant: bool = True

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        r = self.table.get(config.config_hash())
        if r is None:
            return TrialResult.failure("failed", "not in the measured landscape", measured=True)
        return r


# Cost-model parameters a perturbed landscape scales, with the spread of each factor: the device's
# achieved compute rate, link bandwidths, and the memory capacity the model believes in.
_PERTURB = {"peak_tflops": 0.3, "intra_node_gbps": 0.5, "inter_node_gbps": 0.5, "memory_bytes": 0.1}


@dataclass
class PerturbedSimEvaluator:
    """The cost model with perturbed parameters, per-knob effects and noise, drawn from ``seed``.

    The truth differs from the search's prior in three ways: device and link figures scaled by
    up to +-30-50%; a hidden multiplicative effect per knob value (e.g. the fused kernel or ZeRO-3
    being slower or faster than modelled, up to +-``knob_effect``, 15% by default); and per-trial noise of
    ``noise`` (relative standard deviation, fixed per configuration so a replay agrees).
    """

    model: ModelSpec
    cluster: ClusterSpec
    seed: int = 0
    noise: float = 0.03
    knob_effect: float = 0.15
    name: str = "perturbed-sim"
    instant: bool = True

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        scaled = {k: getattr(self.cluster, k) * (1.0 + rng.uniform(-s, s)) for k, s in _PERTURB.items()}
        scaled["memory_bytes"] = int(scaled["memory_bytes"])
        self._truth = replace(self.cluster, **scaled)
        self._effects: dict[tuple[str, str], float] = {}
        self._rng_seed = rng.randrange(2**31)

    def _effect(self, knob: str, value: Any) -> float:
        key = (knob, repr(value))
        if key not in self._effects:
            r = random.Random(f"{self._rng_seed}:{knob}:{value!r}")
            self._effects[key] = 1.0 + r.uniform(-self.knob_effect, self.knob_effect)
        return self._effects[key]

    def evaluate(self, config: ScheduleConfig) -> TrialResult:
        from autoslapo.cost import estimate

        r = estimate(self.model, config, self._truth, validate=False).to_trial_result()
        if r.status != "complete":  # the simulated device ran out of memory: as certain as an allocator's error
            return replace(r, extra={**r.extra, "oom_evidence": "simulated device memory"})
        factor = 1.0
        for knob in KNOBS:
            if knob.effect:
                factor *= self._effect(knob.name, getattr(config, knob.name))
        # Seeded by the digest's first 16 hex digits, as the benchmarks' landscapes were drawn.
        noise = random.Random(f"{self._rng_seed}:{config.config_hash()[:16]}").gauss(1.0, self.noise)
        factor *= max(0.5, noise)
        return replace(r, samples_per_s=r.samples_per_s * factor, tokens_per_s=r.tokens_per_s * factor,
                       tflops_per_device=r.tflops_per_device * factor,
                       hw_tflops_per_device=r.hw_tflops_per_device * factor,
                       step_time_s=r.step_time_s / factor, extra={})


def make_evaluator(backend: str, model: ModelSpec, cluster: ClusterSpec, *, steps: int = 4,
                   timeout_s: float = 300.0) -> Evaluator:
    """The evaluator for ``--backend`` (``ray`` runs the local runtime inside Ray workers).

    Raises UsageError listing the valid backends.
    """
    if backend == "sim":
        return SimEvaluator(model, cluster)
    if backend in ("local", "ray"):
        return LocalEvaluator(model, cluster, steps=steps, timeout_s=timeout_s, name=backend)
    raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}: got {backend!r}")
