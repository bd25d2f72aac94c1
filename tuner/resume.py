"""Warm start: a new study begins from what the store knows about the same model and cluster.

Resume itself lives in ``StudyRunner._load`` (the store is the study's memory); this module finds
*other* studies worth starting from: same model shape and device type, with the same GPU count
or a nearby one (half or double); and, for a resumed study that was submitted to the service with
its own space, that space (``submitted_space``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from search_spaces import Invalid, SearchSpace, space_from_dict

if TYPE_CHECKING:
    from store import Store
    from tuner.proposer import Proposer

WARM_TOP = 5


def _rescale(config: ScheduleConfig, proposer: Proposer) -> ScheduleConfig | None:
    """The same tp/pp/micro-batch/knobs on this study's cluster (dp and accumulation re-derived)."""
    point = {k: getattr(config, k) for k in proposer.bound.domains}
    derived = proposer.bound.derive(point)
    if isinstance(derived, Invalid):
        return None
    try:
        return replace(derived)
    except ConfigError:
        return None


def warm_start(store: Store, study: str, proposer: Proposer, model: ModelSpec, cluster: ClusterSpec) -> int:
    """Seed ``proposer`` from earlier studies; returns how many earlier trials were used.

    Same cluster (fingerprint): every finished trial is told to the sampler as prior knowledge,
    and the best few are enqueued to be re-measured first. Nearby GPU count: the best few,
    rescaled to this cluster, are enqueued first (their throughputs do not transfer).
    """
    sig, fp = model.signature(), cluster.fingerprint()
    nearby = {cluster.gpus // 2, cluster.gpus * 2} - {0}
    used = 0
    top: list[tuple[float, ScheduleConfig]] = []
    for rec in store.list_studies():
        if rec.name == study or rec.model_signature != sig or rec.gpu_type != cluster.gpu_type:
            continue
        same = rec.cluster_fingerprint == fp
        if not same and rec.gpus not in nearby:
            continue
        for t in store.trials(rec.name):
            if t.status == "running" or t.status == "pruned":
                continue
            try:
                config = ScheduleConfig.from_dict(t.config)
            except ConfigError:
                continue
            if same:
                proposer.add_known(config, TrialResult.from_dict(t.result), own=False)
                used += 1
                if t.status == "complete" and t.samples_per_s:
                    top.append((t.samples_per_s, config))
            elif t.status == "complete" and t.samples_per_s:
                mapped = _rescale(config, proposer)
                if mapped is not None:
                    top.append((t.samples_per_s / rec.gpus, mapped))
                    used += 1
    top.sort(key=lambda x: -x[0])
    seen: set[str] = set()
    firsts = []
    for _, c in top:
        if c.config_hash() not in seen:
            seen.add(c.config_hash())
            firsts.append(c)
        if len(firsts) >= WARM_TOP:
            break
    proposer.enqueue(firsts, "warm")
    return used


def submitted_space(store: Store, study: str) -> SearchSpace | None:
    """The inline space ``study`` was submitted with to the service (its job's request, in this
    store), so a study sent with its own space goes on over it when resumed here; None otherwise."""
    job = store.jobs.get(study)
    if job is None or not job.request.get("space"):
        return None
    return space_from_dict(job.request["space"], source=f"the space study {study!r} was submitted with")


def resume_target(store: Store, name: str, model_signature: str, cluster_fingerprint: str) -> str:
    """The study ``--resume`` without ``--study`` continues: of the default name ``name`` and the
    ``name-2``, ``name-3`` ... that later tunes took, the newest of the same model and cluster that is
    not complete and has no live tuner (stopped, failed, or running with a tuner silent for long:
    another tuner's running study is never taken over), else the newest of them; ``name`` itself
    when none is stored."""
    from autoslapo.storage import silent_for

    ours = [rec for rec in store.list_studies()  # oldest first
            if (rec.name == name or (rec.name.startswith(f"{name}-") and rec.name[len(name) + 1:].isdigit()))
            and (rec.model_signature, rec.cluster_fingerprint) == (model_signature, cluster_fingerprint)]
    if not ours:
        return name
    unfinished = [rec for rec in ours if rec.status != "complete"
                  and (rec.status != "running" or silent_for(rec.status, rec.updated_at) is not None)]
    return (unfinished or ours)[-1].name
