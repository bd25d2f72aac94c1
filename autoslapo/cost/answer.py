"""What ``autoslapo estimate`` and ``POST /v1/estimate`` answer: the best schedule on a cluster, with a
stored calibration applied when there is one, as one JSON document. Pure.

Both the command (``--json``, and its summary) and the service build the document here, so a local
and a remote estimate of the same request are the same JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoslapo.cost.correction import Correction, corrected_cluster, corrected_perf
from autoslapo.cost.search import best_config

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.cost.estimate import Estimate
    from autoslapo.models.spec import ModelSpec


def calibrated_best(model: ModelSpec, cluster: ClusterSpec, correction: Correction | dict[str, Any] | None, *,
                    global_batch: int | None = None, profile: dict[str, Any] | None = None,
                    **fixed: Any) -> Estimate:
    """``best_config`` on ``cluster`` with a calibration (a ``Correction``, its dict, or None for the
    uncalibrated model) applied to the device and its links; ``fixed`` pins knobs."""
    return best_config(model, corrected_cluster(cluster, correction), global_batch=global_batch, profile=profile,
                       perf=corrected_perf(cluster, correction, profile), **fixed)


def estimate_document(model: ModelSpec, cluster: ClusterSpec, est: Estimate, *, profile: str | None = None,
                      calibration: dict[str, Any] | None = None, study: str | None = None) -> dict[str, Any]:
    """The estimate's JSON: its figures, config and breakdowns, the model, the cluster, the profile's
    source, how many configurations were searched, and the calibration used (``{"study", "params",
    "n_trials"}``; None when the model was not calibrated)."""
    d = est.to_dict()
    d.update(model=model.to_dict(), num_params=model.num_params(), cluster=cluster.to_dict(), profile=profile or None,
             searched=est.breakdown.get("searched"),
             calibration=None if calibration is None else {"study": study, "params": calibration["params"],
                                                           "n_trials": calibration["n_trials"]})
    return d
