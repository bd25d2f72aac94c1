"""What ``autoslapo estimate`` and ``POST /v1/estimate`` answer: the best schedules on a cluster, with a
stored calibration applied when there is one, as one JSON document. Pure.

Both the command (``--json``, and its summary) and the service build the document here, so a local
and a remote estimate of the same request are the same JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from autoslapo.config import describe
from autoslapo.cost.correction import Correction, corrected_cluster, corrected_perf
from autoslapo.cost.device import device_perf, for_autoslapo_runtime
from autoslapo.cost.search import best_configs
from autoslapo.errors import ConfigError
from autoslapo.layout import default_precision, rank_layers

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost.estimate import Estimate
    from autoslapo.models.spec import ModelSpec


#: The most schedules an estimate lists (``--top``).
MAX_TOP = 100


def calibrated_ranking(model: ModelSpec, cluster: ClusterSpec, correction: Correction | dict[str, Any] | None, *,
                       top: int = 1, global_batch: int | None = None, profile: dict[str, Any] | None = None,
                       refusal: Callable[[ScheduleConfig], str] | None = None,
                       precisions: Collection[str] | None = None, **fixed: Any) -> list[Estimate]:
    """The ``top`` best schedules (``best_configs``, fastest first) on ``cluster`` with a calibration (a
    ``Correction``, its dict, or None for the uncalibrated model) applied to the device and its links;
    ``fixed`` pins knobs.

    ``refusal`` (with ``precisions``, the ones it trains in): the cluster is a study's whose trials ran
    on autoslapo's own runtime (``local``, ``ray``), which is also the stack its calibration corrected,
    and ``refusal(config)`` says why that runtime cannot run ``config`` (``runtime.check.runtime_limits``
    gives both; the cost model stays pure). The estimate is then of that runtime
    (``for_autoslapo_runtime``: its memory), over the schedules it can run (fp16 with its loss
    scaling on a device without bf16; a micro-batch a pipeline stage at least), not of the published stack a GPU
    preset describes.

    Raises: ConfigError for a ``top`` outside 1..``MAX_TOP`` (and as ``best_config`` does)."""
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP:
        raise ConfigError(f"top must be a whole number of schedules from 1 to {MAX_TOP}: got {top!r}; e.g. --top 5")
    perf = corrected_perf(cluster, correction, profile)
    if refusal is not None:
        perf = for_autoslapo_runtime(perf)
        if fixed.get("precision") is None:  # bf16 where the device has it, else what the runtime trains in
            fixed["precision"] = default_precision(cluster.device.bf16, precisions)
    return best_configs(model, corrected_cluster(cluster, correction), top, global_batch=global_batch,
                        profile=profile, perf=perf, refusal=refusal, **fixed)


def estimate_batch(given: int | None, study_batch: int | None, pins: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The global batch an estimate ranks at, and where it came from: ``given`` (``--global-batch``)
    as it is (None: each schedule its own), else the ``cluster_from`` study's (``study_batch``,
    ``"study"``) unless a ``grad_accum`` pin fixes the batch another way."""
    if given is None and study_batch is not None and "grad_accum" not in pins:
        return study_batch, "study"
    return given, None


@contextmanager
def study_batch_named(batch: int | None, batch_from: str | None, study: str | None,
                      override: str = "--global-batch N") -> Iterator[None]:
    """Within it, a ConfigError (no schedule at ``batch``) also says, when ``batch_from`` is ``"study"``
    (``estimate_batch``), that the batch is ``study``'s and that ``override`` overrides it."""
    try:
        yield
    except ConfigError as err:
        if batch_from != "study":
            raise
        raise ConfigError(f"{err} (global batch {batch} is {study}'s, which its trials ran at; "
                          f"{override} overrides it)") from None


def estimate_document(model: ModelSpec, cluster: ClusterSpec, ranked: list[Estimate], *, profile: str | None = None,
                      calibration: dict[str, Any] | None = None, study: str | None = None,
                      pinned: Iterable[str] = (), real_trials: bool = False,
                      global_batch_from: str | None = None) -> dict[str, Any]:
    """The estimate's JSON: the best schedule's figures, config and breakdowns, the model, the
    cluster, the profile's source, how many configurations were searched, the calibration used
    (``{"study", "params", "n_trials"}``; None when the model was not calibrated) and, when
    ``ranked`` holds more than the best, ``top``: each of them (the best first) as rank, figures,
    config and its one-line description; ``pinned``: the knobs the caller fixed (the search chose
    the others); ``stage_layers``: the layers each pipeline rank runs (None without a pipeline);
    ``runtime``: the software stack estimated (``DevicePerf.runtime``: ``megatron``, the published runs'
    stack a GPU preset describes, or autoslapo's own, ``autoslapo`` on CPU ranks and ``autoslapo-gpu``
    for the cluster of a study of real trials, ``real_trials`` as ``calibrated_ranking``'s);
    ``global_batch``: the best schedule's (micro_batch x grad_accum x dp), ``global_batch_from``: where
    the ranking's fixed batch came from, as given: ``study`` for the ``cluster_from`` study's
    (``autoslapo.storage.trials_global_batch``), None when the request fixed it or nothing did (each schedule its own)."""
    est = ranked[0]
    perf = device_perf(cluster)
    d = est.to_dict()
    c = est.config
    # the layers (an encoder-decoder's blocks) each pipeline rank runs; unequal where the chunks are
    stages = ([len(r) for r in rank_layers(model.blocks if model.encoder_decoder else model.layers, c.pp,
                                           c.virtual_stages)] if c.pp > 1 else None)
    d.update(model=model.to_dict(), num_params=model.num_params(), cluster=cluster.to_dict(), profile=profile or None,
             searched=est.breakdown.get("searched"), pinned=sorted(pinned), stage_layers=stages,
             global_batch=c.global_batch, global_batch_from=global_batch_from,
             runtime=(for_autoslapo_runtime(perf) if real_trials else perf).runtime,
             calibration=None if calibration is None else {"study": study, "params": calibration["params"],
                                                           "n_trials": calibration["n_trials"]})
    if len(ranked) > 1:
        d["top"] = [{"rank": i, "samples_per_s": e.samples_per_s, "tokens_per_s": e.tokens_per_s,
                     "step_time_s": e.step_time_s, "memory_per_device_bytes": e.memory_per_device_bytes,
                     "config": e.config.to_dict(), "schedule": describe(e.config.to_dict(), model.family)}
                    for i, e in enumerate(ranked, 1)]
    return d
