"""The prior that learns: each measured trial refits the cluster's cost-model correction.

``PriorLearner`` holds the correction of one cluster (``autoslapo.cost.correction``) and the
observations it is fitted to: every measured trial stored on that cluster (by fingerprint, across
studies and models), then each trial the running study measures. After each one it refits, saves
the correction in the store under the cluster's fingerprint, and hands out the corrected prior;
the study gives it to its proposer for the trials that remain. The fit is the cost model's (pure);
this module decides what counts and when to refit.

The physical correction moves whole terms (compute, links, latencies, memory); what a cluster does
differently for one knob value (its fused kernel or ZeRO-3 slower than modelled, a pipeline
schedule faster) it cannot express. ``KnobEffects`` is that second layer: a multiplicative effect
per knob value, fitted to this model's residuals (log measured over log corrected prediction) by
ridge regression toward no effect, its ridge weighed by the evidence: one trial with a knob value
moves it little, many move it to the measured residual, and noisy ones less than clean ones. It is
the study's (one model on one cluster), not the cluster's, and is not stored: a resumed study
refits it from its trials.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOBS, ScheduleConfig
from autoslapo.cost.correction import Correction, Observation, fit_correction
from autoslapo.cost.device import device_perf, for_autoslapo_runtime
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from tuner.evaluators import cost_prior
from tuner.proposer import Prediction, Prior

if TYPE_CHECKING:
    from store import Store

#: Keys a real trial's result carries beside its measurement (``TrialResult.extra``).
PREDICTED_SAMPLES = "predicted_samples_per_s"
PREDICTED_MEMORY = "predicted_memory_bytes"
#: The knob effects' ridge, in observations, is the log residuals' noise variance over the effects'
#: prior variance, and neither is known before a study measures: trial-to-trial noise runs from ~1 % (a
#: GPU step timed over many steps) to ~25 % (ranks oversubscribing CPU cores: configurations of the
#: measured bert-tiny landscape that differ in one knob scatter by 0.21-0.28 in log), effects from 3 % to
#: 30 %, so the ratio from ~2^-10 to ~2^6. ``fit_knob_effects`` averages the fits over this grid, each
#: weighted by its evidence (the marginal likelihood of the residuals: MacKay 1992, "Bayesian
#: interpolation"; Rasmussen & Williams 2006, section 5.4): noisy trials move the effects little, clean
#: ones move them fast.
RIDGE_GRID = tuple(2.0 ** (k / 2) for k in range(-20, 13))
#: The physical correction the prior uses is replaced only when a factor moved by more than this
#: (relative): re-predicting a 20,000-configuration space takes seconds, and smaller moves do not
#: change its ranking.
REPREDICT_TOLERANCE = 0.01


def _knob_values(config: ScheduleConfig) -> list[tuple[str, str]]:
    """The searched knobs' values that act in ``config``. A derived knob (dp, gradient accumulation)
    follows from the others, and an inert one (ZeRO's stage without data parallelism, a pipeline
    schedule without a pipeline) changes nothing, so neither carries an effect: otherwise the
    default value of a knob that does nothing in one configuration would share the effect measured
    where it acts."""
    d = config.to_dict()
    return [(k.name, repr(d[k.name])) for k in KNOBS if not k.derived and not (k.inert and k.inert(d, 0))]


@dataclass(frozen=True)
class KnobEffects:
    """Multiplicative throughput effects per knob value, ``(knob, repr(value)) -> factor``.

    A value never measured has no effect (factor 1). Built by ``fit_knob_effects``.
    """

    effects: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.effects.items() if not (math.isfinite(v) and v > 0)}
        if bad:
            raise ConfigError(f"knob effects must be positive finite factors: got {bad}; refit them")

    def factor(self, config: ScheduleConfig) -> float:
        """The product of ``config``'s knob values' effects."""
        if not self.effects:
            return 1.0
        return math.exp(sum(math.log(self.effects.get(kv, 1.0)) for kv in _knob_values(config)))


def fit_knob_effects(residuals: Sequence[tuple[ScheduleConfig, float]], ridge: float | None = None) -> KnobEffects:
    """Ridge regression of log residuals on one-hot knob values (every knob of ``KNOBS``).

    Takes ``(config, log(measured / predicted))`` pairs. ``ridge`` (>= 0, in observations) fixes the
    ridge; None averages the fits over ``RIDGE_GRID``, each weighted by its evidence. Returns the
    ``KnobEffects`` (empty with no pairs; each effect within [1/e, e]). Raises ConfigError for a
    negative ridge.
    """
    if ridge is not None and ridge < 0:
        raise ConfigError(f"the knob-effect ridge must not be negative: got {ridge}; pass 0 or more")
    if not residuals:
        return KnobEffects()
    rows = [_knob_values(c) for c, _ in residuals]
    cols = sorted({kv for row in rows for kv in row})
    index = {kv: j for j, kv in enumerate(cols)}
    x = np.zeros((len(rows), len(cols)))
    for i, row in enumerate(rows):
        x[i, [index[kv] for kv in row]] = 1.0
    y = np.array([r for _, r in residuals], dtype=float)
    # In the singular vectors of X the ridge fit is a shrink per direction, for every ridge at once.
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    keep = s > 1e-9 * float(s.max(initial=0.0))
    u, s, vt = u[:, keep], s[keep], vt[keep]
    if not s.size:
        return KnobEffects()
    z, yy, s2 = u.T @ y, float(y @ y), s * s
    if ridge is not None:
        shrink = s / (s2 + max(ridge, 1e-9))
    else:
        # y ~ N(0, noise (I + X X^T / ridge)); with the noise profiled out the log evidence of a ridge is
        # -n/2 log(y^T (I + X X^T / ridge)^-1 y / n) - 1/2 log det(I + X X^T / ridge).
        n = len(residuals)
        grid = np.array(RIDGE_GRID)[:, None]
        q = yy - np.sum(z * z * s2 / (s2 + grid), axis=1)
        ll = -0.5 * n * np.log(np.maximum(q, 1e-18) / n) - 0.5 * np.sum(np.log1p(s2 / grid), axis=1)
        w = np.exp(ll - ll.max())
        shrink = (w / w.sum()) @ (s / (s2 + grid))
    beta = np.clip(vt.T @ (shrink * z), -1.0, 1.0)
    return KnobEffects({kv: float(math.exp(b)) for kv, b in zip(cols, beta, strict=True)})


def with_prediction(result: TrialResult, prediction: Prediction) -> TrialResult:
    """``result`` with the prior's prediction for its configuration in ``extra``."""
    return replace(result, extra={**result.extra, PREDICTED_SAMPLES: float(prediction.samples_per_s),
                                  PREDICTED_MEMORY: int(prediction.memory_bytes)})


def observation(model: ModelSpec, config: ScheduleConfig, cluster: ClusterSpec,
                result: TrialResult | dict[str, Any]) -> Observation | None:
    """What a measured trial tells the fit, or None when nothing (failed, timed out, pruned)."""
    r = result if isinstance(result, dict) else result.to_dict()
    status = r.get("status")
    extra = r.get("extra") or {}
    if status == "complete" and (r.get("samples_per_s") or 0) > 0:
        return Observation(model, config, cluster, "complete", float(r["samples_per_s"]),
                           int(r["peak_memory_bytes"]) if r.get("peak_memory_bytes") else None)
    if status == "oom":
        return Observation(model, config, cluster, "oom", oom_evidence=bool(extra.get("oom_evidence")))
    return None


class PriorLearner:
    """The correction of ``cluster`` and what it was fitted to; see the module docstring.

    ``store``: where calibrations live (None: nothing is read or saved). ``enabled``: refit after
    each observed trial (a study of real trials); when False the correction stays at identity.
    """

    def __init__(self, store: Store | None, model: ModelSpec, cluster: ClusterSpec, *, enabled: bool,
                 runtime_device: str | None = None, prior_weight: float = 0.5,
                 knob_effects: bool = True) -> None:
        self.store = store
        self.model = model
        self.cluster = cluster
        self.enabled = enabled
        self.runtime_device = runtime_device
        self.prior_weight = prior_weight
        self.fingerprint = cluster.fingerprint()
        # what the refit corrects: the stack the study's trials run (``cost_prior``)
        self.base = device_perf(cluster)
        if runtime_device is not None:
            self.base = for_autoslapo_runtime(self.base)
        self.knob_effects = knob_effects
        self.correction = Correction()
        self.effects = KnobEffects()
        self.observations: list[Observation] = []
        self.refits = 0
        if enabled and store is not None:
            self._load(store)
        self._applied = self.correction  # the correction the cached physical predictions use
        self._physics: dict[ScheduleConfig, Prediction] = {}
        self._physical_prior: Prior | None = None
        if enabled and self.knob_effects:
            self.effects = self._fit_effects()

    def _load(self, store: Store) -> None:
        saved = store.calibration(self.fingerprint)
        if saved is not None:
            try:
                self.correction = Correction.from_dict(saved["params"])
            except ConfigError:  # written by another version of the correction: refit from the trials
                self.correction = Correction()
        for study in store.list_studies():
            if study.cluster_fingerprint != self.fingerprint:
                continue
            try:
                model = ModelSpec.from_dict(study.model)
                cluster = ClusterSpec.from_dict(study.cluster)
            except (ConfigError, TypeError, ValueError):
                continue
            for t in store.trials(study.name):
                extra = t.result.get("extra") or {}
                if not (t.measured or PREDICTED_SAMPLES in extra):
                    continue
                obs = observation(model, ScheduleConfig.from_dict(t.config), cluster, t.result)
                if obs is not None:
                    self.observations.append(obs)

    def _physical(self, config: ScheduleConfig) -> Prediction:
        """The corrected cost model's prediction (cached until the correction moves)."""
        pred = self._physics.get(config)
        if pred is None:
            if self._physical_prior is None:
                self._physical_prior = cost_prior(
                    self.model, self.cluster, runtime_device=self.runtime_device,
                    correction=None if self._applied.is_identity() else self._applied)
            pred = self._physics[config] = self._physical_prior(config)
        return pred

    def _use(self, correction: Correction) -> None:
        """Predict with ``correction`` from now on, when it moved enough to change a ranking."""
        old, new = self._applied.to_dict(), correction.to_dict()
        if max(abs(math.log(new[k] / old[k])) for k in new) <= math.log1p(REPREDICT_TOLERANCE):
            return
        self._applied = correction
        self._physics.clear()
        self._physical_prior = None

    def _fit_effects(self) -> KnobEffects:
        pairs = []
        for o in self.observations:
            if o.model == self.model and o.status == "complete" and o.samples_per_s:
                pred = self._physical(o.config).samples_per_s
                if pred > 0:
                    pairs.append((o.config, math.log(o.samples_per_s / pred)))
        return fit_knob_effects(pairs)

    def prior(self) -> Prior:
        """The cost model with the current correction (and this model's knob effects), as the
        proposer's prior."""
        effects = self.effects

        def predict(config: ScheduleConfig) -> Prediction:
            pred = self._physical(config)
            f = effects.factor(config)
            return pred if f == 1.0 else replace(pred, samples_per_s=pred.samples_per_s * f)

        return predict

    def observe(self, config: ScheduleConfig, result: TrialResult) -> bool:
        """Add a measured trial; refit and save when it tells something. Returns True on a refit."""
        if not self.enabled:
            return False
        obs = observation(self.model, config, self.cluster, result)
        if obs is None:
            return False
        self.observations.append(obs)
        self.correction = fit_correction(self.observations, self.base, start=self.correction,
                                         prior_weight=self.prior_weight)
        self._use(self.correction)
        if self.knob_effects:
            self.effects = self._fit_effects()
        self.refits += 1
        if self.store is not None:
            self.store.save_calibration(self.fingerprint, self.correction.to_dict(), len(self.observations))
        return True
