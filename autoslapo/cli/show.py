"""``autoslapo show STUDY``: the study's trials with their knobs, status, metrics and reason.

A study submitted to the service that no worker started (a job without a study row: queued, or
cancelled while queued) is shown as ``autoslapo studies`` lists it (``job_row``): no trials.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from autoslapo.cli.best import measurement_noise
from autoslapo.cli.studies import (
    GiB,
    add_storage_argument,
    cluster_cell,
    fmt,
    format_table,
    job_row,
    study_row,
)
from autoslapo.cluster import ClusterSpec
from autoslapo.errors import StorageError, UsageError
from autoslapo.storage import require_store, silent_note

if TYPE_CHECKING:
    from store import TrialRecord

# --sort name -> how to read it from a trial. Metrics sort best first by default.
SORT_KEYS = {
    "number": "number",
    "samples": "samples_per_s",
    "tokens": "tokens_per_s",
    "tflops": "tflops_per_device",
    "memory": "peak_memory_bytes",
    "step-time": "step_time_s",
    "status": "status",
}
DESCENDING_BY_DEFAULT = {"samples", "tokens", "tflops"}
#: The columns the table shows a number in: a trial with none of them measured or estimated nothing.
SHOWN_METRICS = ("samples_per_s", "tflops_per_device", "peak_memory_bytes")
STATUSES = ("running", "complete", "oom", "failed", "timeout", "pruned")
REASON_WIDTH = 70


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", metavar="STUDY", help="study name (see `autoslapo studies`)")
    add_storage_argument(parser)
    parser.add_argument("--sort", choices=sorted(SORT_KEYS), default="number",
                        help="order trials by this column (default: number; metrics sort best first)")
    order = parser.add_mutually_exclusive_group()
    order.add_argument("--asc", dest="order", action="store_const", const="asc", help="ascending order")
    order.add_argument("--desc", dest="order", action="store_const", const="desc", help="descending order")
    parser.add_argument("--status", choices=STATUSES, default=None, help="only trials with this status")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="show at most N trials")
    parser.add_argument("--json", action="store_true", help="print the study and its trials as JSON")


def trial_dict(t: TrialRecord) -> dict[str, Any]:
    """A trial as a JSON-safe dict."""
    return {
        "number": t.number,
        "status": t.status,
        "config": t.config,
        "samples_per_s": t.samples_per_s,
        "tokens_per_s": t.tokens_per_s,
        "tflops_per_device": t.tflops_per_device,
        "hw_tflops_per_device": t.hw_tflops_per_device,
        "peak_memory_bytes": t.peak_memory_bytes,
        "step_time_s": t.step_time_s,
        "step_time_spread_s": t.step_time_spread_s,
        "final_loss": t.final_loss,
        "measured": t.measured,
        "reason": t.reason,
        "host": t.host,
        "started_at": None if t.started_at is None else t.started_at.isoformat(),
        "ended_at": None if t.ended_at is None else t.ended_at.isoformat(),
        # the prior's prediction a real trial was proposed with (tuner/learning.py), else None
        "predicted_samples_per_s": (t.result.get("extra") or {}).get("predicted_samples_per_s"),
        "predicted_memory_bytes": (t.result.get("extra") or {}).get("predicted_memory_bytes"),
        **measurement_noise(t.result),
    }


def metric(t: TrialRecord, attr: str) -> Any:
    """``t``'s ``attr``, None when the trial has none: a trial that did not complete (pruned before
    it ran, failed, out of memory) stores 0 for what it never measured or estimated."""
    value = getattr(t, attr)
    if attr not in ("number", "status") and t.status != "complete" and value == 0:
        return None
    return value


def kind(t: TrialRecord) -> str:
    """The M/E column: measured, estimated by the cost model, ``-`` for a trial with no metric (an
    interrupted or failed trial, one pruned before it ran), blank while running."""
    if t.status == "running":
        return ""
    if t.measured:
        return "M"
    return "E" if any(metric(t, a) is not None for a in SHOWN_METRICS) else "-"


def sort_trials(trials: list[TrialRecord], key: str, order: str | None) -> list[TrialRecord]:
    """Trials ordered by ``key`` (a ``SORT_KEYS`` name); missing values (``metric``) always go last."""
    attr = SORT_KEYS[key]
    descending = (order == "desc") if order else key in DESCENDING_BY_DEFAULT
    present = [t for t in trials if metric(t, attr) is not None]
    missing = [t for t in trials if metric(t, attr) is None]
    # Ties keep trial order in both directions (sort is stable, reverse included).
    present.sort(key=lambda t: t.number)
    present.sort(key=lambda t: metric(t, attr), reverse=descending)
    return present + missing


def _knob_text(config: dict[str, Any], varying: list[str]) -> str:
    if "tp" not in config:  # a baseline none of whose configurations fitted
        return f"(no {config.get('baseline', '')} configuration)".replace("(no  ", "(no ")
    return " ".join(f"{k}={_short(config.get(k))}" for k in varying if k in config)


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def run(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be a positive integer: got {args.limit}")
    with require_store(args.storage, read_only=True) as store:
        try:
            study = store.get_study(args.study)
        except StorageError:  # no such study: a job a worker has not started yet, or today's error
            job = store.jobs.get(args.study)
            if job is None:
                raise
            return _show_job(job_row(store, job), args)
        summary = study_row(store, study)
        trials = store.trials(args.study, status=args.status)
    trials = sort_trials(trials, args.sort, args.order)
    if args.limit is not None:
        trials = trials[: args.limit]
    if args.json:
        print(json.dumps({"study": summary, "trials": [trial_dict(t) for t in trials]}, indent=2))
        return 0
    keys: list[str] = []
    # a baseline that found no configuration is stored as {"baseline": kind}: no knobs to show
    real = [t for t in trials if "tp" in t.config]
    for t in real:
        keys.extend(k for k in t.config if k not in keys)
    # Knobs every listed trial shares go in the header; the table shows only those that differ.
    fixed = {k: real[0].config.get(k) for k in keys if len({json.dumps(t.config.get(k)) for t in real}) == 1} \
        if real else {}
    varying = [k for k in keys if k not in fixed]
    print(f"study {study.name}: {summary['model_label']} on {ClusterSpec.from_dict(study.cluster).described_as()}, "
          f"backend {study.backend}, "
          f"{summary['trials']} trials, status {study.status}{silent_note(summary['silent_s'])}")
    if fixed and len(real) > 1:
        print("same in every trial shown: " + " ".join(f"{k}={_short(v)}" for k, v in fixed.items()))
    if not trials:
        print("no trials" + (f" with status {args.status}" if args.status else ""))
        return 0
    rows = []
    for t in trials:
        reason = t.reason if len(t.reason) <= REASON_WIDTH else t.reason[: REASON_WIDTH - 3] + "..."
        rows.append([
            str(t.number),
            t.status,
            fmt(metric(t, "samples_per_s")),
            fmt(metric(t, "tflops_per_device"), ".3g"),
            fmt(None if (memory := metric(t, "peak_memory_bytes")) is None else memory / GiB, ".1f"),
            kind(t),
            _knob_text(t.config, varying if len(trials) > 1 else keys),
            reason,
        ])
    print(format_table(rows, ["#", "STATUS", "samples/s", "TFLOP/s/dev", "GiB/dev", "M/E", "KNOBS", "REASON"],
                       right=(0, 2, 3, 4)))
    return 0


#: What a job-only study's status says of it (``_show_job``); any other status: ``JOB_ENDED``.
JOB_NOTES = {
    "queued": "queued: no worker has started it yet, so no trials (an `autoslapo worker` on this store runs it)",
    "cancelled": "cancelled before a worker started it: no trials",
    "running": "a worker has just taken it and is starting it: no trials yet",
}
JOB_ENDED = "{status} before its study was created: no trials"


def _show_job(row: dict[str, Any], args: argparse.Namespace) -> int:
    """``show`` of a study submitted to the service that no worker started (``job_row``)."""
    if args.json:
        print(json.dumps({"study": row, "trials": []}, indent=2))
        return 0
    budget = "" if row["budget"] is None else f"budget {row['budget']} trials, "
    print(f"study {row['name']}: {row['model_label']} on {cluster_cell(row)}, backend {row['backend']}, "
          f"{budget}status {row['status']}")
    note = JOB_NOTES.get(row["status"]) or JOB_ENDED.format(status=row["status"])
    print(note + (f" ({row['error']})" if row["error"] else ""))
    return 0
