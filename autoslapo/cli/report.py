"""``autoslapo report STUDY --output DIR``: PNG figures and a self-contained HTML page."""

from __future__ import annotations

import argparse
import json

from autoslapo.cli.studies import add_storage_argument
from autoslapo.storage import require_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", metavar="STUDY", help="study name (see `autoslapo studies`)")
    parser.add_argument("--output", "-o", required=True, metavar="DIR",
                        help="directory to write index.html and the PNG figures into (created if missing)")
    add_storage_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the written files as JSON")


def run(args: argparse.Namespace) -> int:
    from autoslapo.report import write_report

    with require_store(args.storage, read_only=True) as store:
        report = write_report(store, args.study, args.output)
    if args.json:
        print(json.dumps({"study": args.study, "html": str(report.html),
                          "images": {k: str(v) for k, v in report.images.items()}}, indent=2))
    else:
        print(f"wrote the report of {args.study}: {report.html} (+ {len(report.images)} PNG figures)")
    return 0
