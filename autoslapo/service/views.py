"""Studies as JSON: what the endpoints and the web page show, read from the store."""

from __future__ import annotations

import json
from typing import Any

from autoslapo.cluster import LINKS, ClusterSpec
from autoslapo.config import describe
from autoslapo.service.payload import model_label
from autoslapo.storage import baseline_study, silent_for
from store import JobRecord, Store, StudyRecord, TrialRecord

LAUNCHED = ("complete", "oom", "failed", "timeout")


def _time(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def trial_view(t: TrialRecord) -> dict[str, Any]:
    """One trial as JSON."""
    return {"number": t.number, "status": t.status, "config": t.config, "schedule": describe(t.config),
            "samples_per_s": t.samples_per_s, "tokens_per_s": t.tokens_per_s,
            "tflops_per_device": t.tflops_per_device, "peak_memory_bytes": t.peak_memory_bytes,
            "measured": t.measured, "reason": t.reason, "ended_at": _time(t.ended_at)}


def apply_snippet(study: StudyRecord) -> str:
    """The line a training script runs to train with the best recorded schedule of ``study``'s model
    and cluster (its links too, when they are not the device preset's)."""
    links = ClusterSpec.from_dict(study.cluster).link_values()
    given = f", links={json.dumps(links)}" if links else ""
    return f'job = autoslapo.apply_best("{study.model_name}", gpus={study.gpus}, gpu_type="{study.gpu_type}"{given})'


def baselines_view(store: Store, study: str) -> list[dict[str, Any]]:
    """The out-of-the-box baselines the tuner scored for ``study`` (its ``<study>.baselines`` companion),
    each with the tuned best's speed-up over it and, with repeats, that speed-up's 95% interval."""
    companion = baseline_study(study)
    if not store.has_study(companion):
        return []
    out = []
    for t in store.trials(companion):
        extra = t.result.get("extra") or {}
        kind = str(extra.get("baseline") or f"baseline {t.number}")
        out.append({"baseline": kind, "status": t.status,
                    "samples_per_s": t.samples_per_s if t.status == "complete" else None,
                    "tuned_samples_per_s": extra.get("tuned_samples_per_s"), "speedup": extra.get("speedup"),
                    "speedup_ci95": (extra.get("speedup_ci95") or {}).get(kind),
                    "config": None if "baseline" in t.config else t.config,
                    "schedule": None if "baseline" in t.config else describe(t.config),
                    "measured": t.measured, "reason": t.reason})
    return out


def study_view(store: Store, study: StudyRecord | None, job: JobRecord | None, *,
               trials: list[TrialRecord] | None = None, baselines: bool = False) -> dict[str, Any]:
    """A study's status, progress and best trial so far (a queued job has no study yet); with
    ``baselines``, also its baselines and the best's speed-ups over them."""
    name = study.name if study is not None else job.study if job is not None else ""
    if trials is None:
        trials = store.trials(name) if study is not None else []
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    complete = [t for t in trials if t.status == "complete" and t.samples_per_s]
    best = max(complete, key=lambda t: t.samples_per_s or 0.0, default=None)
    return _study_doc(store, name, study, job, counts, best, baselines=baselines)


def _study_doc(store: Store, name: str, study: StudyRecord | None, job: JobRecord | None, counts: dict[str, int],
               best: TrialRecord | None, *, baselines: bool) -> dict[str, Any]:
    request = job.request if job is not None else {}
    doc: dict[str, Any] = {
        "name": name,
        "status": job.status if job is not None else (study.status if study is not None else "queued"),
        "model": study.model_name if study is not None else model_label(request.get("model")),
        "gpus": study.gpus if study is not None else request.get("gpus"),
        "gpu_type": study.gpu_type if study is not None else request.get("gpu_type"),
        "links": ClusterSpec.from_dict(study.cluster).link_values() if study is not None else
        {k: request[k] for k in LINKS if request.get(k) is not None},
        "backend": study.backend if study is not None else request.get("backend"),
        "budget": request.get("trials"),
        "launched": sum(counts.get(s, 0) for s in LAUNCHED),
        "counts": counts,
        "best": None if best is None else trial_view(best),
        "owner": job.owner if job is not None else None,
        "error": job.error if job is not None and job.error else None,
        "created_at": _time(study.created_at if study is not None else job.created_at if job else None),
    }
    if study is not None:
        doc["study_status"] = study.status
        if job is None:  # tuned by `autoslapo tune`: seconds since its tuner last marked it alive, when gone
            doc["silent_s"] = silent_for(study.status, study.updated_at)
    if baselines:
        doc["baselines"] = baselines_view(store, name) if study is not None else []
        if best is not None:
            doc["best"]["speedup_ci95"] = (best.result.get("extra") or {}).get("speedup_ci95")
    if best is not None and study is not None:
        doc["apply_best"] = apply_snippet(study)
    return doc


def all_studies(store: Store) -> list[dict[str, Any]]:
    """Every study in the store and every job not started yet, oldest first."""
    jobs = {j.study: j for j in store.jobs.list()}
    out = [_study_doc(store, s.study.name, s.study, jobs.pop(s.study.name, None), s.counts, s.best, baselines=False)
           for s in store.study_summaries()]
    out.extend(study_view(store, None, j) for j in jobs.values())
    return out
