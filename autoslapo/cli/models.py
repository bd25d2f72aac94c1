"""``autoslapo models``: every model preset with its family and shape (a table, or JSON).

The names listed here are what ``tune``, ``estimate``, ``best``, ``run`` and ``verify`` take; an
alias (``bert`` -> ``bert-large``) is shown next to the preset it names. The shape flags
(``--hidden``, ``--layers``, ...) of those commands start from these values.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

COLUMNS = ("family", "hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "seq_len", "params")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo models``."""
    parser.add_argument("--json", action="store_true", help="print a JSON list of objects, one a preset")


def preset_rows() -> list[dict[str, Any]]:
    """One dict a preset: name, aliases, family, shape and parameter count, in the presets' order."""
    from autoslapo.models.spec import ALIASES, PRESETS

    rows = []
    for name, spec in PRESETS.items():
        rows.append({
            "name": name, "aliases": sorted(a for a, target in ALIASES.items() if target == name),
            "family": spec.family, "hidden": spec.hidden, "layers": spec.layers, "heads": spec.heads,
            "kv_heads": spec.kv_heads, "ffn": spec.ffn, "vocab": spec.vocab, "seq_len": spec.seq_len,
            "max_positions": spec.max_positions, "params": spec.num_params(),
        })
    return rows


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.{1 if n < 100 * size else 0}f}{unit}"
    return str(n)


def run(args: argparse.Namespace) -> int:
    """Print the presets; returns 0."""
    rows = preset_rows()
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    table = [[r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else ""),
              *(_human(r[c]) if c == "params" else str(r[c]) for c in COLUMNS)] for r in rows]
    header = ["PRESET (ALIASES)", *(c.upper() for c in COLUMNS)]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        right = (c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True))
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), *right]
        print("  ".join(cells).rstrip())
    return 0
