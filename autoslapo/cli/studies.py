"""``autoslapo studies``: one line a study (model, cluster, backend, trials, best, status).

A study submitted to the service has a job (``store.jobs``) before a worker starts it and writes
its study row; such a job-only study (queued, or cancelled while queued) is listed too, as the
service's ``GET /v1/studies`` describes it (``job_row``), with no trials and no best.

Also home of the helpers the read-only result commands share (show, export, best, report): the
``--storage`` flag and plain-text tables. Opening a store read-only, without creating one, is
``autoslapo.storage``'s (``open_existing_store`` / ``require_store`` with ``read_only``), which the
library uses too.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from autoslapo.cluster import ClusterSpec, links_text
from autoslapo.errors import AutoslapoError, UsageError
from autoslapo.storage import (
    is_baseline_study,
    open_existing_store,
    silent_for,
    silent_note,
    study_label,
    trials_global_batch,
)

if TYPE_CHECKING:
    from store import JobRecord, Store, StudyRecord

GiB = 1024**3


def add_storage_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--storage URL`` flag every result command takes."""
    parser.add_argument(
        "--storage",
        metavar="URL",
        default=None,
        help="store URL (default: $AUTOSLAPO_STORAGE, else sqlite:///autoslapo.db in this directory)",
    )


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str], *, right: Sequence[int] = ()) -> str:
    """Rows as aligned plain-text columns under ``header``; columns in ``right`` are right-aligned."""
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def fmt(value: float | int | None, spec: str = ".4g") -> str:
    """A number for a table cell; ``-`` when missing."""
    return "-" if value is None else format(value, spec)


def figure(x: float) -> str:
    """``x`` with one decimal, or three significant digits below 0.1 (a CPU's 0.0213 samples/s is not 0.0)."""
    return f"{x:,.1f}" if x == 0 or abs(x) >= 0.1 else f"{x:.3g}"


def study_row(store: Store, study: StudyRecord) -> dict[str, Any]:
    """One study as a JSON-safe dict: its description, trial counts and best throughput."""
    trials = store.trials(study.name)
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    done = [t for t in trials if t.status == "complete" and t.samples_per_s is not None]
    best = max(done, key=lambda t: t.samples_per_s or 0.0) if done else None
    return {
        "name": study.name,
        "model": study.model_name,
        "model_label": study_label(study),
        "family": study.model_family,
        "gpus": study.gpus,
        "gpu_type": study.gpu_type,
        "links": ClusterSpec.from_dict(study.cluster).own_links(),  # "" on the device preset's links
        "backend": study.backend,
        "objective": study.objective,
        "status": study.status,
        # a running study whose tuner stopped marking it alive (killed): seconds since, else None
        "silent_s": silent_for(study.status, study.updated_at),
        "trials": len(trials),
        # what its trials ran at (tune fixes one a study): two studies of one model and cluster differ by it
        "global_batch": trials_global_batch(t.config for t in trials),
        "trials_by_status": counts,
        "best_samples_per_s": None if best is None else best.samples_per_s,
        "best_trial": None if best is None else best.number,
        "best_measured": None if best is None else best.measured,
        "created_at": study.created_at.isoformat(),
        "updated_at": study.updated_at.isoformat(),
    }


def job_row(store: Store, job: JobRecord) -> dict[str, Any]:
    """A job whose study a worker has not started (no study row: queued, cancelled while queued)
    in ``study_row``'s shape: what the service's ``GET /v1/studies`` says of it (``study_view``),
    no trials and no best; plus its ``budget``, ``owner`` and ``error``, and ``started`` False."""
    from autoslapo.service.views import study_view  # the service (FastAPI): only when a store has such a job

    view = study_view(store, None, job)
    model, family = _job_model(job.request.get("model"), view["model"])
    return {
        "name": view["name"], "model": model, "model_label": view["model"], "family": family,
        "gpus": view["gpus"], "gpu_type": view["gpu_type"], "links": links_text(view["links"]),
        "backend": view["backend"], "objective": None, "status": view["status"], "silent_s": None,
        "trials": 0, "global_batch": job.request.get("global_batch"), "trials_by_status": {},
        "best_samples_per_s": None, "best_trial": None, "best_measured": None,
        "created_at": view["created_at"], "updated_at": job.updated_at.isoformat(),
        "budget": view["budget"], "owner": view["owner"], "error": view["error"], "started": False,
    }


def _job_model(value: Any, label: str) -> tuple[str, str | None]:
    """The model name and family the study of a job's ``model`` field will be stored under (what
    ``--model`` matches): a preset's or a config.json's spec (read as data, never a model file's
    trace); a model file's name and the ``user`` family; ``label`` and no family when unreadable."""
    from autoslapo.models.spec import USER_FAMILY
    from autoslapo.service.payload import is_module_file, model_spec_of

    if is_module_file(value):
        return str(value["module_file"].get("name", label)).removesuffix(".py"), USER_FAMILY
    try:
        spec = model_spec_of(value)
    except (AutoslapoError, TypeError, ValueError, KeyError, AttributeError):
        return label, None
    return spec.name, spec.family


def job_only_rows(store: Store, studies: set[str]) -> list[dict[str, Any]]:
    """``job_row`` of every job whose study is not among ``studies`` (the store's), oldest first."""
    return [job_row(store, j) for j in store.jobs.list() if j.study not in studies]


def cluster_cell(row: dict[str, Any]) -> str:
    """A row's cluster as the table shows it: "64 x a100-80gb", with its own links when it has any."""
    return f"{row['gpus']} x {row['gpu_type']}" + (f" ({row['links']})" if row["links"] else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_storage_argument(parser)
    parser.add_argument("--model", default=None, help="only studies of this model name (e.g. bert-large)")
    parser.add_argument("--gpus", type=int, default=None, help="only studies on this many devices")
    parser.add_argument("--all", action="store_true",
                        help="also list the companion '<study>.baselines' studies the tuner scores baselines in")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")


def run(args: argparse.Namespace) -> int:
    if args.gpus is not None and args.gpus < 1:
        raise UsageError(f"--gpus must be a positive integer: got {args.gpus}")
    store = open_existing_store(args.storage, read_only=True)
    stored = 0
    if store is None:
        rows: list[dict[str, Any]] = []
        where = None
    else:
        with store:
            where = store.url
            every = store.list_studies()
            listed = [s for s in every if args.all or not is_baseline_study(s)]
            studies = [
                s for s in listed
                if (args.model is None or args.model in (s.model_name, s.model_family))
                and (args.gpus is None or s.gpus == args.gpus)
            ]
            waiting = job_only_rows(store, {s.name for s in every})
            stored = len(listed) + len(waiting)
            jobs = [r for r in waiting if (args.model is None or args.model in (r["model"], r["family"]))
                    and (args.gpus is None or r["gpus"] == args.gpus)]
            # one list, oldest first: a job-only study among the studies by when it was submitted
            rows = list(heapq.merge([study_row(store, s) for s in studies], jobs,
                                    key=lambda r: datetime.fromisoformat(r["created_at"])))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        from store import resolve_url

        filters = " ".join(f"--{k} {v}" for k, v in (("model", args.model), ("gpus", args.gpus)) if v is not None)
        if stored and filters:  # the store has studies: the filter matched none of them
            print(f"no studies match {filters} in {where} ({stored} stored; `autoslapo studies` lists them)",
                  file=sys.stderr)
        elif where is None:
            print(f"no store at {resolve_url(args.storage)} yet (the file does not exist or holds no tables); run "
                  "`autoslapo tune MODEL --gpus N` to make one, or point --storage at an existing store", file=sys.stderr)
        else:
            print(f"no studies in {where}; run `autoslapo tune MODEL --gpus N`", file=sys.stderr)
        return 0
    table = [
        [
            r["name"],
            r["model_label"],
            cluster_cell(r),
            "-" if r["global_batch"] is None else f"{r['global_batch']:,}",
            str(r["backend"]),
            str(r["trials"]),
            fmt(r["best_samples_per_s"]) + ("" if r["best_measured"] is None else (" (M)" if r["best_measured"] else " (E)")),
            r["status"] + silent_note(r["silent_s"]),
        ]
        for r in rows
    ]
    print(format_table(table, ["STUDY", "MODEL", "CLUSTER", "BATCH", "BACKEND", "TRIALS", "BEST samples/s", "STATUS"],
                       right=(3, 5, 6)))
    print("(M) measured, (E) estimated by the cost model")
    if any(r.get("started") is False for r in rows):
        print("0 trials and no best: a study submitted to a service that no worker started (queued, or cancelled "
              "while queued); `autoslapo show NAME` says more")
    if any(r["silent_s"] is not None for r in rows):
        print("(no tuner) a study left running by a tuner that is gone (killed, or its machine): "
              "`autoslapo tune MODEL ... --study NAME --resume` takes it over")
    return 0
