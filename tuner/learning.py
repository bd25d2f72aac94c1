"""The prior that learns: each measured trial refits the cluster's cost-model correction.

``PriorLearner`` holds the correction of one cluster (``autoslapo.cost.correction``) and the
observations it is fitted to: every measured trial stored on that cluster (by fingerprint, across
studies and models), then each trial the running study measures. After each one it refits, saves
the correction in the store under the cluster's fingerprint, and hands out the corrected prior;
the study gives it to its proposer for the trials that remain. The fit is the cost model's (pure);
this module decides what counts and when to refit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost.correction import Correction, Observation, fit_correction
from autoslapo.cost.device import device_perf
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
                 runtime_device: str | None = None, prior_weight: float = 0.5) -> None:
        self.store = store
        self.model = model
        self.cluster = cluster
        self.enabled = enabled
        self.runtime_device = runtime_device
        self.prior_weight = prior_weight
        self.fingerprint = cluster.fingerprint()
        self.base = device_perf(cluster)
        self.correction = Correction()
        self.observations: list[Observation] = []
        self.refits = 0
        if enabled and store is not None:
            self._load(store)

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

    def prior(self) -> Prior:
        """The cost model with the current correction, as the proposer's prior."""
        return cost_prior(self.model, self.cluster, runtime_device=self.runtime_device,
                          correction=None if self.correction.is_identity() else self.correction)

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
        self.refits += 1
        if self.store is not None:
            self.store.save_calibration(self.fingerprint, self.correction.to_dict(), len(self.observations))
        return True
