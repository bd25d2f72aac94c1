"""``autoslapo export STUDY --output FILE.csv|FILE.parquet``: the study's trials as a table file."""

from __future__ import annotations

import argparse
import json

from autoslapo.cli.studies import add_storage_argument
from autoslapo.errors import UsageError
from autoslapo.storage import require_store

SUFFIXES = (".csv", ".parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", metavar="STUDY", help="study name (see `autoslapo studies`)")
    parser.add_argument("--output", "-o", required=True, metavar="FILE",
                        help="file to write; .csv or .parquet (one row a trial, knobs as config.<knob>)")
    add_storage_argument(parser)
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    out = Path(args.output)
    # Checked before the store is opened, so a typo costs no database round trip.
    if out.suffix.lower() not in SUFFIXES:
        raise UsageError(f"--output must end in .csv or .parquet: got {args.output!r}; rename it")
    if out.is_dir():
        raise UsageError(f"--output must be a file, not a directory: got {args.output!r}")
    with require_store(args.storage, read_only=True) as store:
        frame = store.to_dataframe(args.study)
        path = store.export(args.study, out)
    if args.json:
        print(json.dumps({"study": args.study, "path": str(path), "rows": len(frame),
                          "columns": [str(c) for c in frame.columns]}, indent=2))
    else:
        print(f"wrote {len(frame)} trial{'s' if len(frame) != 1 else ''} of {args.study} to {path}")
    return 0
