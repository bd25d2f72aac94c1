"""``autoslapo studies``: one line a study (model, cluster, backend, trials, best, status).

Also home of the helpers the read-only result commands share (show, export, best, report): the
``--storage`` flag and plain-text tables. Opening a store read-only, without creating one, is
``autoslapo.storage``'s (``open_existing_store`` / ``require_store`` with ``read_only``), which the
library uses too.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoslapo.cluster import ClusterSpec
from autoslapo.errors import UsageError
from autoslapo.storage import (
    is_baseline_study,
    open_existing_store,
    silent_for,
    silent_note,
    study_label,
    trials_global_batch,
)

if TYPE_CHECKING:
    from store import Store, StudyRecord

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
            listed = [s for s in store.list_studies() if args.all or not is_baseline_study(s)]
            studies = [
                s for s in listed
                if (args.model is None or args.model in (s.model_name, s.model_family))
                and (args.gpus is None or s.gpus == args.gpus)
            ]
            stored = len(listed)
            rows = [study_row(store, s) for s in studies]
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
            f"{r['gpus']} x {r['gpu_type']}" + (f" ({r['links']})" if r["links"] else ""),
            "-" if r["global_batch"] is None else f"{r['global_batch']:,}",
            r["backend"],
            str(r["trials"]),
            fmt(r["best_samples_per_s"]) + ("" if r["best_measured"] is None else (" (M)" if r["best_measured"] else " (E)")),
            r["status"] + silent_note(r["silent_s"]),
        ]
        for r in rows
    ]
    print(format_table(table, ["STUDY", "MODEL", "CLUSTER", "BATCH", "BACKEND", "TRIALS", "BEST samples/s", "STATUS"],
                       right=(3, 5, 6)))
    print("(M) measured, (E) estimated by the cost model")
    if any(r["silent_s"] is not None for r in rows):
        print("(no tuner) a study left running by a tuner that is gone (killed, or its machine): "
              "`autoslapo tune MODEL ... --study NAME --resume` takes it over")
    return 0
