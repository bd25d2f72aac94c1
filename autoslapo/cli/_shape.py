"""The model-shape flags (``--hidden --layers --heads --kv-heads --ffn --seq-len --vocab``), declared once.

Every command that takes a model preset takes these flags the same way; ``shape_overrides`` turns
the given ones into ``ModelSpec.from_name`` keyword arguments (``with_overrides`` keeps the shape
consistent: a new hidden width brings the family's MLP width unless ``--ffn`` is given).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

# dimension (ModelSpec field) -> help. The flag is the name with dashes.
SHAPE_FLAGS: dict[str, str] = {
    "hidden": "model width (the MLP width follows the family's rule unless --ffn is given)",
    "layers": "transformer layers",
    "heads": "attention (query) heads",
    "kv_heads": "key/value heads: fewer than --heads is grouped-query attention (LLaMA only)",
    "ffn": "MLP inner width",
    "seq_len": "training sequence length",
    "vocab": "vocabulary size",
}


def add_shape_arguments(parser: argparse.ArgumentParser, *, defaults: Mapping[str, int | None] | None = None,
                        helps: Mapping[str, str] | None = None) -> None:
    """Add the shape flags to ``parser`` in one group; each defaults to the preset's value (None).

    ``defaults`` and ``helps`` (keyed by dimension, e.g. ``seq_len``) let a command keep its own
    default and wording for a flag (``verify`` checks a short sequence by default).
    """
    defaults, helps = defaults or {}, helps or {}
    unknown = sorted((set(defaults) | set(helps)) - set(SHAPE_FLAGS))
    if unknown:
        raise ValueError(f"unknown shape flags {unknown}; valid: {sorted(SHAPE_FLAGS)}")
    group = parser.add_argument_group("model shape (default: the preset's)")
    for name, text in SHAPE_FLAGS.items():
        group.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, metavar="N",
                           default=defaults.get(name), help=helps.get(name, text))


def shape_overrides(args: argparse.Namespace) -> dict[str, int]:
    """The shape flags given on the command line, as ``ModelSpec.with_overrides`` keywords."""
    return {name: v for name in SHAPE_FLAGS if (v := getattr(args, name, None)) is not None}
