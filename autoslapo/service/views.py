"""Studies as JSON: what the endpoints and the web page show, read from the store."""

from __future__ import annotations

import json
from typing import Any

from autoslapo.cluster import LINKS, ClusterSpec
from autoslapo.config import describe
from autoslapo.errors import AutoslapoError
from autoslapo.models.spec import ModelSpec, family_flags
from autoslapo.service.payload import model_label
from autoslapo.storage import baseline_rows, is_baseline_study, silent_for
from store import JobRecord, Store, StudyRecord, TrialRecord

LAUNCHED = ("complete", "oom", "failed", "timeout")  # trials that ran and ended (a chart's points)
IN_FLIGHT = "running"  # a trial claimed and running now: launched too (``pruned`` ones are not)


def _time(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def study_family(study: StudyRecord | None) -> str | None:
    """The model family of ``study`` for ``describe``: None without a study, or when its stored family
    is not one this version knows (empty in an old row, or a family since removed): every knob shown."""
    if study is None:
        return None
    try:
        family_flags(study.model_family)
    except KeyError:
        return None
    return study.model_family


def trial_view(t: TrialRecord, family: str | None) -> dict[str, Any]:
    """One trial as JSON; ``family``: its study's model family (``study_family``), whose knobs alone
    its ``schedule`` line shows, as the CLI's tables (None: every knob)."""
    return {"number": t.number, "status": t.status, "config": t.config, "schedule": describe(t.config, family),
            "samples_per_s": t.samples_per_s, "tokens_per_s": t.tokens_per_s,
            "tflops_per_device": t.tflops_per_device, "peak_memory_bytes": t.peak_memory_bytes,
            "measured": t.measured, "reason": t.reason, "ended_at": _time(t.ended_at)}


def apply_snippet(study: StudyRecord, server: str | None = None, global_batch: int | None = None) -> str:
    """The line a training script runs to train with the best recorded schedule of ``study``'s model
    and cluster (its links and node size too, when they are not the defaults), asked of ``server``
    (this service's URL) when given, at ``global_batch`` when one was asked for. A preset's model is
    named as the preset; any other model (a config.json, a model file) by its signature, which the
    look-up matches as given."""
    cluster = ClusterSpec.from_dict(study.cluster)
    links = cluster.link_values()
    given = f", links={json.dumps(links)}" if links else ""
    if cluster.gpus_per_node != ClusterSpec(gpus=study.gpus, gpu_type=study.gpu_type).gpus_per_node:
        given += f", gpus_per_node={cluster.gpus_per_node}"
    if global_batch is not None:
        given += f", global_batch={global_batch}"
    if server:
        given += f", server={json.dumps(server)}"
    model = json.dumps(study.model_name if _is_preset_of(study) else study.model_signature)
    return f'job = autoslapo.apply_best({model}, gpus={study.gpus}, gpu_type={json.dumps(study.gpu_type)}{given})'


def _is_preset_of(study: StudyRecord) -> bool:
    """True when ``study``'s model name is a preset of its very shape (so the name finds its trials)."""
    try:
        return ModelSpec.from_name(study.model_name).signature() == study.model_signature
    except AutoslapoError:
        return False


def baselines_view(store: Store, study: str, family: str | None) -> list[dict[str, Any]]:
    """The out-of-the-box baselines the tuner scored for ``study`` (its ``<study>.baselines`` companion),
    each with the tuned best's speed-up over it and, with repeats, that speed-up's 95% interval;
    ``family``: the study's model family (``study_family``), whose knobs alone a schedule shows."""
    out = []
    for kind, t in baseline_rows(store, study):
        extra = t.result.get("extra") or {}
        out.append({"baseline": kind, "status": t.status,
                    "samples_per_s": t.samples_per_s if t.status == "complete" else None,
                    "tuned_samples_per_s": extra.get("tuned_samples_per_s"), "speedup": extra.get("speedup"),
                    "speedup_ci95": (extra.get("speedup_ci95") or {}).get(kind),
                    "config": None if "baseline" in t.config else t.config,
                    "schedule": None if "baseline" in t.config else describe(t.config, family),
                    "measured": t.measured, "reason": t.reason})
    return out


def study_view(store: Store, study: StudyRecord | None, job: JobRecord | None, *,
               trials: list[TrialRecord] | None = None, baselines: bool = False,
               server: str | None = None) -> dict[str, Any]:
    """A study's status, progress and best trial so far (a queued job has no study yet); with
    ``baselines``, also its baselines and the best's speed-ups over them; ``server``: this
    service's URL, for the ``apply_best`` line."""
    name = study.name if study is not None else job.study if job is not None else ""
    if trials is None:
        trials = store.trials(name) if study is not None else []
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    complete = [t for t in trials if t.status == "complete" and t.samples_per_s]
    best = max(complete, key=lambda t: t.samples_per_s or 0.0, default=None)
    return _study_doc(store, name, study, job, counts, best, baselines=baselines, server=server)


def _study_doc(store: Store, name: str, study: StudyRecord | None, job: JobRecord | None, counts: dict[str, int],
               best: TrialRecord | None, *, baselines: bool, server: str | None = None) -> dict[str, Any]:
    request = job.request if job is not None else {}
    family = study_family(study)
    doc: dict[str, Any] = {
        "name": name,
        "status": job.status if job is not None else (study.status if study is not None else "queued"),
        "model": study.model_name if study is not None else model_label(request.get("model")),
        "gpus": study.gpus if study is not None else request.get("gpus"),
        "gpu_type": study.gpu_type if study is not None else request.get("gpu_type"),
        "links": ClusterSpec.from_dict(study.cluster).link_values() if study is not None else
        {k: request[k] for k in LINKS if request.get(k) is not None},
        "backend": study.backend if study is not None else request.get("backend"),
        "budget": study_budget(study.budget if study is not None else None, request.get("trials"), launched(counts)),
        "launched": launched(counts),
        "counts": counts,
        "best": None if best is None else trial_view(best, family),
        "owner": job.owner if job is not None else None,
        "error": job.error if job is not None and job.error else None,
        "created_at": _time(study.created_at if study is not None else job.created_at if job else None),
    }
    if study is not None:
        doc["study_status"] = study.status
        if job is None:  # tuned by `autoslapo tune`: seconds since its tuner last marked it alive, when gone
            doc["silent_s"] = silent_for(study.status, study.updated_at)
    if baselines:
        doc["baselines"] = baselines_view(store, name, family) if study is not None else []
        if best is not None:
            doc["best"]["speedup_ci95"] = (best.result.get("extra") or {}).get("speedup_ci95")
    if best is not None and study is not None:
        doc["apply_best"] = apply_snippet(study, server)
    return doc


def launched(counts: dict[str, int]) -> int:
    """The trials a study launched (what its budget counts): ended ones and those in flight."""
    return sum(counts.get(s, 0) for s in (*LAUNCHED, IN_FLIGHT))


def study_budget(stored: int | None, submitted: Any, launched: int) -> int | None:
    """A study's budget: the one the store keeps (``StudyRecord.budget``: set by the tuner that created
    it, raised by a local ``autoslapo tune --resume --trials N`` or a join, never lowered), or the
    job's when that is more (a requeue or a join not yet picked up by a worker). A study stored
    before the store kept budgets (``stored`` None): the one submitted, or more when it ``launched``
    more trials (a local resume raised it). None when neither is known (a study tuned
    outside the service before then)."""
    if stored is None and submitted is None:
        return None
    return max(stored or 0, int(submitted or 0), launched)


def all_studies(store: Store, *, server: str | None = None, include_baselines: bool = False) -> list[dict[str, Any]]:
    """Every study in the store and every job not started yet, oldest first; the tuner's
    ``<study>.baselines`` companions only with ``include_baselines`` (as ``autoslapo studies --all``)."""
    jobs = {j.study: j for j in store.jobs.list()}
    out = []
    for s in store.study_summaries():
        job = jobs.pop(s.study.name, None)
        if include_baselines or not is_baseline_study(s.study):
            out.append(_study_doc(store, s.study.name, s.study, job, s.counts, s.best, baselines=False, server=server))
    out.extend(study_view(store, None, j, server=server) for j in jobs.values())
    return out
