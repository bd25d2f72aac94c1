"""``Knob``: what one schedule knob is, declared once beside its ``ScheduleConfig`` field.

A knob's declaration is the one place that says its type, domain, default, whether its values
are ordered, its command-line flag and help, its display label, when it makes no difference
(``inert``) and which consumers take it. Everything that lists knobs (the config's checks, the
search spaces, the cost model's sweep, the CLI flags, the baselines, the simulators, the tables)
reads ``KNOBS`` (in ``autoslapo.config``) rather than a list of its own; ``tests/autoslapo/test_knobs.py``
pins every consumer against it.

Pure: no torch, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal

from autoslapo.errors import ConfigError

Kind = Literal["int", "ratio", "bool", "choice"]
#: ``inert(knobs, layers) -> True`` when, for this combination of the other knobs, the knob changes nothing
#: (its value is then the default, so two equivalent configurations are one trial).
Inert = Callable[[Mapping[str, Any], int], bool]


@dataclass(frozen=True)
class Knob:
    """One knob of ``ScheduleConfig``.

    ``kind``: ``int`` (a positive integer unless ``choices`` lists the values), ``ratio`` (a number
    in [0, 1]), ``bool`` or ``choice`` (one of ``choices``). ``ordered``: the values have an order the
    samplers may use. ``flag``/``help``/``label``: the command-line flag, its help, the short name in
    tables. ``derived``: set by the layout from --gpus and the global batch (dp, grad_accum), never
    searched. ``auto``: a search space may say ``"auto"`` and get the domain the model and cluster
    allow. ``sweep``: the values the cost model's exhaustive search tries when the knob is free
    (None: only the default; layout knobs are enumerated by ``autoslapo.layout``). ``brief``: always
    shown in a one-line summary (others only when not at their default). ``verify``: ``autoslapo
    verify`` takes it (it changes how the schedule is applied, which ``Verify`` checks). ``effect``:
    the perturbed simulator gives its values a hidden effect. ``since``: the knob set's version that
    added it; knobs after version 1 at their default are left out of the config hash, so trials
    stored before the knob existed keep their digests. ``transformer_only``: the knob acts on attention,
    tokens or a vocabulary, so a convolutional family (WideResNet) runs it at its default only:
    spaces and sweeps keep it there and a config that sets it otherwise is refused
    (``autoslapo.layout.inapplicable_knobs``). ``conv_only``: the other way round, the knob acts on
    convolutions' feature maps, so every other family runs it at its default only. ``refines``: the knob this one refines; when that one
    is pinned and this one is not, a search keeps this one at its default (``--ckpt-ratio 1`` alone
    means whole layers recomputed, as it did before ``ckpt_granularity`` existed). ``families``: the
    families whose models have what the knob acts on (empty: any); on another family it runs at its
    default only, as a ``transformer_only`` knob does on a convolutional one. ``user_file``: a user's
    own module (``autoslapo tune my_model.py``) takes it: the user schedule
    (``plan._apply_user_schedule``) implements it. Off by default: a knob added without saying so
    runs at its default on a model file, not searched there (where it would change nothing and
    spend real trials on its values).
    """

    kind: Kind
    help: str
    label: str
    choices: tuple[Any, ...] = ()
    ordered: bool = False
    flag: str = ""
    derived: bool = False
    auto: bool = False
    sweep: tuple[Any, ...] | None = None
    brief: bool = False
    verify: bool = False
    effect: bool = False
    inert: Inert | None = None
    since: int = 1
    transformer_only: bool = False
    conv_only: bool = False
    refines: str = ""
    families: tuple[str, ...] = ()
    user_file: bool = False
    # Filled in from the dataclass field by ``bind_knobs``.
    name: str = ""
    default: Any = None

    def check(self, value: Any, where: str = "") -> Any:
        """``value`` as this knob holds it (ratios as floats); ConfigError naming the rule otherwise."""
        at = f" in {where}" if where else ""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be true or false: got {value!r}{at}")
            return value
        if self.kind == "ratio":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"{self.name} must be between 0 and 1: got {value!r}{at}")
            return float(value)
        if self.choices:
            # bool is an int: True must not pass for 1.
            if isinstance(value, bool) or value not in self.choices:
                allowed = ", ".join(json.dumps(c) for c in self.choices)
                raise ConfigError(f"{self.name} must be one of {allowed}: got {json.dumps(value)}{at}")
            return value
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{self.name} must be a positive integer: got {value!r}{at}")
        return value

    @property
    def domain(self) -> tuple[Any, ...]:
        """Every value for a finite knob (bools and choices); empty for open integers and ratios."""
        return (False, True) if self.kind == "bool" else self.choices

    def show(self, value: Any) -> str:
        """``label=value`` (ratios to two places; a bool as its label when on, ``no-label`` when off)."""
        if self.kind == "bool":
            return self.label if value else f"no-{self.label}"
        if self.kind == "ratio":
            return f"{self.label}={float(value):.2f}"
        return f"{self.label}={value}"


def knob(kind: Kind, help: str, label: str, **kw: Any) -> dict[str, Any]:
    """Field metadata declaring a knob: ``field(default=..., metadata=knob(...))``."""
    return {"knob": Knob(kind, help, label, **kw)}


def bind_knobs(cls: type) -> tuple[Knob, ...]:
    """The knobs of a dataclass whose fields carry ``knob(...)`` metadata, in field order.

    Each gets its field's name, default and (unless given) the flag ``--<name with dashes>``.
    """
    out = []
    for f in fields(cls):
        k = f.metadata.get("knob")
        if k is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no knob declaration")
        if f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} needs a default")
        flag = k.flag or "--" + f.name.replace("_", "-")
        out.append(Knob(**{**_fields_of(k), "name": f.name, "default": f.default, "flag": flag}))
    return tuple(out)


def _fields_of(k: Knob) -> dict[str, Any]:
    return {f.name: getattr(k, f.name) for f in fields(k)}
