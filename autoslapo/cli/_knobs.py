"""The schedule knobs' command-line flags, derived from their declarations (``autoslapo.config.KNOBS``).

``run`` and ``verify`` take a knob with its default; ``estimate`` and ``tune`` take it as a pin
(left out: the cost model or the search chooses). Which knobs a command takes follows from the
declaration: ``tune`` never takes the derived ones (dp, grad_accum: they follow from --gpus and
--global-batch), ``run`` takes every knob but dp (= --gpus / (tp*pp)), ``verify`` those marked
``verify``. A boolean knob is ``--flag`` (on), ``--flag on`` or ``--flag off``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Literal

from autoslapo.config import KNOBS, Knob

Command = Literal["run", "estimate", "verify", "tune"]
_ON_OFF = {"on": True, "off": False}


def knobs_for(command: Command) -> tuple[Knob, ...]:
    """The knobs ``command`` takes as flags."""
    if command == "tune":
        return tuple(k for k in KNOBS if not k.derived)
    if command == "run":
        return tuple(k for k in KNOBS if k.name != "dp")
    if command == "verify":
        return tuple(k for k in KNOBS if k.verify)
    return KNOBS


def add_knob_arguments(parser: argparse.ArgumentParser, command: Command,
                       defaults: Mapping[str, Any] | None = None) -> None:
    """Add ``command``'s knob flags to ``parser`` (dest: the knob's name).

    ``defaults``: knob -> a default of this command's own (None: chosen later); other knobs default
    to their declared default for ``run``/``verify`` and to None (free) for ``estimate``/``tune``.
    """
    pinned = command in ("estimate", "tune")
    title = ("schedule knobs (left out: chosen by the search)" if pinned
             else "schedule knobs (left out: their defaults)")
    group = parser.add_argument_group(title)
    own = dict(defaults or {})
    for k in knobs_for(command):
        default = own.get(k.name, None if pinned else k.default)
        shown = "" if default is None else f" (default {_text(k, default)})"
        kw: dict[str, Any] = {"dest": k.name, "default": default, "help": k.help + shown}
        if k.kind == "bool":
            kw.update(nargs="?", const="on", choices=("on", "off"), type=str.lower, metavar="on|off")
            if default is not None:
                kw["default"] = "on" if default else "off"
        elif k.kind == "ratio":
            kw.update(type=float)
        elif k.kind == "int":
            kw.update(type=int)
            if k.choices:
                kw.update(choices=k.choices)
        else:
            kw.update(choices=k.choices)
        group.add_argument(k.flag, **kw)


def knob_values(args: argparse.Namespace, command: Command) -> dict[str, Any]:
    """knob -> value of every knob flag of ``command`` that has a value (bools as True/False)."""
    out: dict[str, Any] = {}
    for k in knobs_for(command):
        v = getattr(args, k.name, None)
        if v is None:
            continue
        out[k.name] = _ON_OFF[v] if k.kind == "bool" else v
    return out


def _text(k: Knob, v: Any) -> str:
    if k.kind == "bool":
        return "on" if v else "off"
    return str(v)
