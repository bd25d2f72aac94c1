"""The schedule knobs' command-line flags, derived from their declarations (``autoslapo.config.KNOBS``).

``run`` and ``verify`` take a knob with its default; ``estimate`` and ``tune`` take it as a pin
(left out: the cost model or the search chooses). Which knobs a command takes follows from the
declaration: ``tune`` never takes the derived ones (dp, grad_accum: they follow from --gpus and
--global-batch), ``run`` takes every knob but dp (= --gpus / (tp*pp)), ``verify`` those marked
``verify``. A boolean knob is ``--flag`` (on), ``--flag on`` or ``--flag off``.
``check_refinements`` refuses, for ``run`` and ``verify`` (one explicit configuration), a knob set
away from its default that refines another left at the default, where it would act on nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Literal

from autoslapo.config import KNOB, KNOBS, Knob
from autoslapo.errors import UsageError

Command = Literal["run", "estimate", "verify", "tune"]
_ON_OFF = {"on": True, "off": False}
#: knob -> the knob it refines (acts on what that one turns on), for ``check_refinements``: each declared
#: ``refines`` (ckpt_granularity of ckpt_ratio), and ckpt_placement, which picks the layers ckpt_ratio
#: checkpoints. Its declaration does not say ``refines``: that would also pin it in every search space
#: pinned on the ratio alone (``SearchSpace.pin``), renaming those spaces' versions (and their studies).
REFINES: dict[str, str] = {**{k.name: k.refines for k in KNOBS if k.refines}, "ckpt_placement": "ckpt_ratio"}
#: refined knob -> (what the refining knobs act on, what its default leaves of that), for the message
_ACTS_ON = {"ckpt_ratio": ("checkpointed layers", "none checkpointed")}


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


def check_refinements(knobs: Mapping[str, Any]) -> None:
    """UsageError for a knob away from its default that refines a knob at its default, where it acts on
    nothing (``--ckpt-granularity selective`` with ``--ckpt-ratio 0``): ``run`` and ``verify`` would
    otherwise run the configuration without it, silently. Other inert knobs (``--zero-stage`` with one
    data replica) are left alone: those follow from the layout, not from a knob the user left out.
    """
    for name, refined in REFINES.items():
        k, r = KNOB[name], KNOB[refined]
        if name not in knobs or knobs[name] == k.default or knobs.get(refined, r.default) != r.default:
            continue
        inert = k.inert
        if inert is None or not inert(knobs, 0):
            continue
        acting = [v for v in (r.sweep or r.domain) if v != r.default and not inert({**knobs, refined: v}, 0)]
        what, none = _ACTS_ON.get(refined, (f"what {r.flag} turns on", "its default"))
        raise UsageError(f"{k.flag} {_shown(k, knobs[name])} acts on {what}: got it with {r.flag} "
                         f"{_shown(r, r.default)} ({none}); pass {_acting(r, acting)}, or drop {k.flag}")


def _acting(r: Knob, acting: list[Any]) -> str:
    """``--ckpt-ratio 1 (or another ratio above 0)``: ``r`` at values ``acting`` (from its sweep) where
    the refining knob acts."""
    if not acting:
        return f"{r.flag} other than {_shown(r, r.default)}"
    if r.kind == "ratio":
        if max(acting) == 1.0:
            return f"{r.flag} 1 (or another ratio above {_shown(r, r.default)})"
        return f"{r.flag} {_shown(r, acting[len(acting) // 2])} (or another ratio strictly between 0 and 1)"
    rest = f" (or {', '.join(_shown(r, v) for v in acting[:-1])})" if len(acting) > 1 else ""
    return f"{r.flag} {_shown(r, acting[-1])}{rest}"


def _shown(k: Knob, v: Any) -> str:
    """A value as its flag takes it (a ratio 1.0 as 1)."""
    return f"{float(v):g}" if k.kind == "ratio" else _text(k, v)
