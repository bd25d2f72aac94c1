"""Search spaces: the knobs of ``ScheduleConfig``, their domains, and the rules tying them to a cluster.

Pure data and pure functions (no optuna, ray or sqlalchemy import). A ``SearchSpace`` is written
once per model family (or read from a user's TOML/JSON file); ``bind(model, cluster, global_batch)``
turns it into a ``BoundSpace`` whose domains are fixed for a whole study, so an Optuna sampler sees
the same distributions on every trial (no "dynamic value space" errors). Points of the product
that break a rule are never configurations: ``BoundSpace.derive`` returns an ``Invalid`` with the
reason, and the tuner tells the sampler so without running anything.

Derived knobs: ``dp = gpus / (tp * pp)`` and ``grad_accum = global_batch / (micro_batch * dp)``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import time
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import autoslapo.layout as layout
from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOB, KNOBS, ScheduleConfig
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.spec import ModelSpec

#: Knobs a space may search or fix; the derived ones (``dp``, ``grad_accum``) never.
TUNABLE: tuple[str, ...] = tuple(k.name for k in KNOBS if not k.derived)
#: Knobs whose domains are ordered numbers (the tuner samples them as an index, so TPE/GP/CMA-ES
#: see their order); the others are categorical.
ORDINAL: frozenset[str] = frozenset(k.name for k in KNOBS if k.ordered and not k.derived)
#: ``"auto"`` domains filled in per model and cluster by ``bind``.
AUTO = "auto"
_SPACE_KEYS = ("name", "version", "description", "knobs", "fixed", "rules")
_RULE_KEYS = ("tp_within_node", "max_micro_batch", "batch_per_gpu", "min_global_batch", "max_global_batch")


@dataclass(frozen=True)
class Invalid:
    """A point of the product that is not a runnable configuration, and why."""

    reason: str


@dataclass(frozen=True)
class SearchSpace:
    """Knob domains for one family (cluster-independent; ``"auto"`` resolved by ``bind``).

    ``knobs``: knob -> tuple of values to search (or ``"auto"`` for tp, pp, micro_batch).
    ``fixed``: knob -> the one value used. Knobs in neither take ``ScheduleConfig``'s default (knobs
    declared after the first knob set, ``Knob.since > 1``, are searched over their declared sweep),
    except ``precision``, which falls back to fp16 on devices without bf16 (fp32 where the trials
    cannot run fp16).
    ``rules``: ``tp_within_node`` (default true), ``max_micro_batch`` (64), and the default global
    batch: ``batch_per_gpu`` x gpus, clipped to [``min_global_batch``, ``max_global_batch``].
    """

    name: str
    version: str = "1"
    description: str = ""
    knobs: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    rules: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"search space {self.name!r}"
        knobs = {k: _check_domain(k, v, where) for k, v in dict(self.knobs).items()}
        # a space pinned from flags (``pinned``): the user wrote knob flags, not a space's ``fixed`` table
        what = "the pinned knobs" if self.name.endswith("+pinned") else f"fixed of {where}"
        fixed = {k: _check_value(k, v, where, what) for k, v in dict(self.fixed).items()}
        both = sorted(set(knobs) & set(fixed))
        if both:
            raise ConfigError(f"a knob is either searched or fixed: {both} are both in {where}; remove one")
        rules = {"tp_within_node": True, "max_micro_batch": 64, "batch_per_gpu": 8,
                 "min_global_batch": 8, "max_global_batch": 4096}
        for k, v in dict(self.rules).items():
            if k not in _RULE_KEYS:
                raise ConfigError(f"unknown rule {k!r} in {where}: valid rules are {', '.join(_RULE_KEYS)}")
            if k == "tp_within_node":
                if not isinstance(v, bool):
                    raise ConfigError(f"rules.tp_within_node must be true or false: got {v!r} in {where}")
            elif not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"rules.{k} must be a positive integer: got {v!r} in {where}")
            rules[k] = v
        object.__setattr__(self, "knobs", knobs)
        object.__setattr__(self, "fixed", fixed)
        object.__setattr__(self, "rules", rules)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict; ``space_from_dict(s.to_dict()) == s``."""
        return {"name": self.name, "version": self.version, "description": self.description,
                "knobs": {k: v if v == AUTO else list(v) for k, v in self.knobs.items()},
                "fixed": dict(self.fixed), "rules": dict(self.rules)}

    def pin(self, knobs: Mapping[str, Any]) -> SearchSpace:
        """This space with ``knobs`` fixed to the given values (searched no more), as ``name+pinned``;
        a knob that ``refines`` a pinned one and is not pinned itself is fixed at its default.

        Raises ConfigError for a knob a space cannot fix (unknown or derived) or a bad value.
        """
        # a knob that refines a pinned one (ckpt_granularity, of ckpt_ratio) is pinned at its default too
        knobs = {**{k.name: k.default for k in KNOBS if k.refines in knobs and k.name not in knobs
                    and k.name not in self.fixed}, **knobs}
        fixed = {**self.fixed, **knobs}
        searched = {k: v for k, v in self.knobs.items() if k not in knobs}
        note = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
        return SearchSpace(name=f"{self.name}+pinned", version=f"{self.version}+{note}",
                           description=f"{self.description} (pinned: {note})", knobs=searched,
                           fixed=fixed, rules=self.rules)

    def default_global_batch(self, gpus: int) -> int:
        """``batch_per_gpu`` x gpus clipped to the space's bounds."""
        r = self.rules
        return int(min(max(r["batch_per_gpu"] * gpus, r["min_global_batch"]), max(r["max_global_batch"], gpus)))

    def bind(self, model: ModelSpec, cluster: ClusterSpec, global_batch: int | None = None,
             precisions: Collection[str] | None = None) -> BoundSpace:
        """Fix the domains for ``model`` on ``cluster`` with ``global_batch`` sequences a step.

        Values that can never be valid on this cluster (tp not dividing the heads, pp not dividing
        the layers, tp across nodes...) are dropped here, so the domains stay small; they are the
        same on every call with the same inputs. ``precisions``: the ones the trials can run (None:
        all, as estimates can); a device without bf16 then falls back to fp16 if it is among them,
        else fp32. Raises UsageError for a bad global batch.
        """
        gb = self.default_global_batch(cluster.gpus) if global_batch is None else global_batch
        try:
            layout.check_global_batch(gb)
        except ConfigError as err:
            raise UsageError(str(err)) from None
        if not self.rules["tp_within_node"] and not cluster.allow_cross_node_tp:
            cluster = replace(cluster, allow_cross_node_tp=True)
        domains: dict[str, tuple[Any, ...]] = {}
        # Knobs declared after the first knob set that the space does not mention are searched over
        # their declared sweep: a new knob is searchable without editing every space.
        later = {k.name: k.sweep for k in KNOBS if k.since > 1 and k.sweep and not k.derived
                 and k.name not in self.knobs and k.name not in self.fixed}
        unusable = layout.inapplicable_knobs(model, KNOBS)  # not searched: they run at their defaults
        for knob, dom in {**self.knobs, **later}.items():
            if knob in unusable:
                continue
            values = _auto_domain(knob, model, cluster, self.rules) if dom == AUTO else tuple(dom)
            kept = tuple(v for v in values if _statically_ok(knob, v, model, cluster, self.rules)
                         and (knob != "precision" or precisions is None or v in precisions))
            if not kept:
                raise ConfigError(
                    f"no value of {knob} in {self.name!r} can run {model.preset} on {cluster.gpus} "
                    f"{cluster.gpu_type}: domain {list(values)}; widen the domain in the space file"
                )
            domains[knob] = kept
        fixed = dict(self.fixed)
        # a pinned degree that can never run is the user's input, refused with its own rule (not as an
        # empty study, nor as a global batch that no layout fills)
        why = (layout.tp_problem(int(fixed["tp"]), model, cluster) if "tp" in fixed else "") or (
            layout.pp_problem(int(fixed["pp"]), model, cluster) if "pp" in fixed else "")
        if why:
            raise ConfigError(why)
        precision = layout.default_precision(cluster.device.bf16, precisions)
        if "precision" not in fixed and "precision" not in domains and precision != KNOB["precision"].default:
            fixed["precision"] = precision
        return BoundSpace(self, model, cluster, gb, domains, fixed)


def _auto_domain(knob: str, model: ModelSpec, cluster: ClusterSpec, rules: Mapping[str, Any]) -> tuple[int, ...]:
    if knob == "tp":  # what cannot shard the model (``layout.tp_problem``) is dropped after
        return tuple(layout.divisors(cluster.gpus))
    if knob == "pp":  # the divisors of the layers, and the uneven splits the searches propose (layout.pp_degrees)
        return tuple(sorted({*layout.divisors(math.gcd(model.blocks, cluster.gpus)), *layout.pp_degrees(model, cluster)}))
    if knob == "micro_batch":
        return tuple(2**i for i in range(int(math.log2(rules["max_micro_batch"])) + 1))
    auto = ", ".join(k.name for k in KNOBS if k.auto)
    raise ConfigError(f"{knob} has no automatic domain: only {auto} do; list its values")


def _statically_ok(knob: str, v: Any, model: ModelSpec, cluster: ClusterSpec, rules: Mapping[str, Any]) -> bool:
    if not layout.user_knob_ok(knob, v, model):
        return False
    if knob == "tp":
        return not layout.tp_problem(v, model, cluster)
    if knob == "pp":
        return not layout.pp_problem(v, model, cluster)
    if knob == "micro_batch":
        return bool(v <= rules["max_micro_batch"])
    if knob == "ckpt_granularity" and v == "op":
        return layout.op_ckpt_ok(model)
    if knob == "attn_kernel" and v == "flash":
        return cluster.device.flash_attention and not model.local_attention
    if knob == "precision" and v == "bf16":
        return cluster.device.bf16
    return True


@dataclass(frozen=True)
class BoundSpace:
    """A space bound to a model, a cluster and a global batch: fixed domains and the rules."""

    space: SearchSpace
    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    domains: Mapping[str, tuple[Any, ...]]
    fixed: Mapping[str, Any]

    @property
    def size(self) -> int:
        """Points in the product of the domains (valid or not)."""
        return math.prod(len(v) for v in self.domains.values())

    def check_layouts(self) -> None:
        """Raise ConfigError when no tp*pp*dp layout and micro-batch fills the global batch.

        A cheap necessary condition (divisibility only), so a cluster too large for the batch is
        refused up front instead of ending as an empty study.
        """
        gpus, gb = self.cluster.gpus, self.global_batch

        def dom(knob: str) -> tuple[int, ...]:
            return tuple(self.domains.get(knob, (self.fixed.get(knob, 1),)))

        if layout.batch_fits_some_layout(gb, gpus, dom("tp"), dom("pp"), dom("micro_batch")):
            return
        dps = layout.replica_counts(gpus, dom("tp"), dom("pp"))
        mb = self.fixed.get("micro_batch")  # pinned: the fix is another micro-batch or batch, not fewer devices
        fix = (f"pin a --micro-batch that divides {gb} / dp, or a --global-batch that is a multiple of {mb} x dp"
               if mb is not None else "use fewer --gpus or a larger --global-batch")
        with_mb = f" and micro_batch {mb}" if mb is not None else ""
        raise ConfigError(
            f"micro_batch*dp must divide the global batch for some layout: {gpus} devices with tp in "
            f"{list(dom('tp'))} and pp in {list(dom('pp'))} give dp in {dps}{with_mb} for a global batch of "
            f"{gb}; {fix}"
        )

    def derive(self, params: Mapping[str, Any]) -> ScheduleConfig | Invalid:
        """The configuration for one point (knob -> value), or ``Invalid`` with the reason.

        Knobs that do not matter for the point take one canonical value, so two points that run
        the same way give the same config (and the same ``config_hash``).
        """
        knobs: dict[str, Any] = {**self.fixed, **params}
        try:
            dp = layout.data_parallel(self.cluster.gpus, int(knobs.get("tp", 1)), int(knobs.get("pp", 1)))
            knobs["dp"] = dp
            knobs["grad_accum"] = layout.grad_accum_for(self.global_batch, int(knobs.get("micro_batch", 1)), dp)
        except ConfigError as err:
            return Invalid(str(err))
        layers = self.model.layers
        knobs["ckpt_ratio"] = round(float(knobs.get("ckpt_ratio", 0.0)) * layers) / layers
        try:
            for n in layout.inapplicable_knobs(self.model, KNOBS):
                if n not in self.fixed:  # a knob the family cannot use runs at its default
                    knobs[n] = KNOB[n].default
            return ScheduleConfig(**canonical(knobs, layers)).validate(self.model, self.cluster)
        except ConfigError as err:
            return Invalid(str(err))

    def params_of(self, config: ScheduleConfig) -> dict[str, Any] | None:
        """A point of the domains that derives ``config``, or None if the space cannot reach it."""
        params: dict[str, Any] = {}
        for knob, dom in self.domains.items():
            v = getattr(config, knob)
            if knob == "ckpt_ratio":
                n = round(v * self.model.layers)
                match = [c for c in dom if round(c * self.model.layers) == n]
                if not match:
                    return None
                v = match[0]
            elif v not in dom:
                # Canonicalised knobs (e.g. the schedule when pp=1) may take any domain value.
                v = dom[0]
            params[knob] = v
        derived = self.derive(params)
        if isinstance(derived, Invalid) or derived != config:
            return None
        return params

    def points(self) -> Iterator[dict[str, Any]]:
        """Every point of the product, in a fixed order."""
        names = list(self.domains)
        for combo in itertools.product(*(self.domains[n] for n in names)):
            yield dict(zip(names, combo, strict=True))

    def configs(self) -> list[ScheduleConfig]:
        """Every distinct valid configuration, in a fixed order (deduplicated by config hash)."""
        return list(self._configs)

    def walk(self, *, deadline: float | None = None, tick: Callable[[int, int], None] | None = None,
             every: int = 2000) -> list[ScheduleConfig] | None:
        """``configs()``, walked with ``tick(points done, points in all)`` every ``every`` points; None
        (nothing kept) when ``time.monotonic()`` passes ``deadline`` first. A finished walk is kept:
        ``configs()`` answers from it afterwards."""
        if "_configs" in vars(self):  # walked before
            return list(self._configs)
        seen: set[ScheduleConfig] = set()  # frozen dataclass: equal iff the config hashes are equal
        out: list[ScheduleConfig] = []
        total = self.size
        for i, point in enumerate(self.points(), 1):
            cfg = self.derive(point)
            if isinstance(cfg, ScheduleConfig) and cfg not in seen:
                seen.add(cfg)
                out.append(cfg)
            if not on_pace(i, total, deadline=deadline, tick=tick, every=every):
                return None
        vars(self)["_configs"] = tuple(out)  # the cached property's own slot
        return out

    @functools.cached_property
    def _configs(self) -> tuple[ScheduleConfig, ...]:
        # Computed once per bound space: the prior's ranking and the sim sweep both walk it
        # (about a second for BERT-large on 64 GPUs; seconds for a large model on many devices).
        return tuple(self.walk() or ())


def on_pace(done: int, total: int, *, deadline: float | None, tick: Callable[[int, int], None] | None,
            every: int) -> bool:
    """The check a long loop makes after its ``done``-th item of ``total``: every ``every`` items,
    False when ``time.monotonic()`` has passed ``deadline`` (the loop stops), else ``tick(done, total)``
    (its progress line moves). True otherwise."""
    if done % every:
        return True
    if deadline is not None and time.monotonic() >= deadline:
        return False
    if tick is not None:
        tick(done, total)
    return True


def canonical(knobs: Mapping[str, Any], layers: int) -> dict[str, Any]:
    """``knobs`` with every knob that changes nothing here (``Knob.inert``) at its default.

    Two points that run the same way then give the same config (and the same ``config_hash``).
    """
    out = dict(knobs)
    for k in KNOBS:
        if k.inert is not None and k.inert(out, layers):
            out[k.name] = k.default
    return out


# --- parsing and validation of space descriptions ---------------------------------------------

def _check_value(knob: str, v: Any, where: str, what: str) -> Any:
    if knob not in TUNABLE:
        derived = " and ".join(k.name for k in KNOBS if k.derived)
        raise ConfigError(
            f"unknown knob {knob!r} in {where}: valid knobs are {', '.join(TUNABLE)} "
            f"({derived} are derived from --gpus and --global-batch)"
        )
    return KNOB[knob].check(v, what if what.startswith(("the ", "fixed of ")) else f"{what} of {where}")


def _check_domain(knob: str, dom: Any, where: str) -> Any:
    if dom == AUTO:
        if knob not in KNOB or not KNOB[knob].auto:
            auto = ", ".join(k.name for k in KNOBS if k.auto)
            raise ConfigError(f"knobs.{knob} = \"auto\" is only for {auto} in {where}; list its values")
        return AUTO
    if not isinstance(dom, (list, tuple)) or not dom:
        raise ConfigError(f"knobs.{knob} must be a non-empty list of values or \"auto\": got {dom!r} in {where}")
    values = tuple(_check_value(knob, v, where, "knobs") for v in dom)
    if len(set(values)) != len(values):
        raise ConfigError(f"knobs.{knob} lists a value twice: {list(values)} in {where}; list each once")
    return tuple(sorted(values)) if knob in ORDINAL else values


def space_from_dict(d: Mapping[str, Any], *, source: str = "") -> SearchSpace:
    """Build a ``SearchSpace`` from plain data (what a TOML/JSON space file holds).

    Raises ConfigError naming the key, the value and the fix.
    """
    where = source or "the space description"
    if not isinstance(d, Mapping):
        raise ConfigError(f"a search space must be a table of keys: got {type(d).__name__} in {where}")
    unknown = sorted(set(d) - set(_SPACE_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}: valid keys are {', '.join(_SPACE_KEYS)}")
    name = d.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a search space needs a name (a non-empty string): got {name!r} in {where}")
    for key in ("knobs", "fixed", "rules"):
        if not isinstance(d.get(key, {}), Mapping):
            raise ConfigError(f"{key} must be a table (knob = value): got {d[key]!r} in {where}")
    return SearchSpace(name=name, version=str(d.get("version", "1")), description=str(d.get("description", "")),
                       knobs=dict(d.get("knobs", {})), fixed=dict(d.get("fixed", {})), rules=dict(d.get("rules", {})))


def load_space(path: str | Path) -> SearchSpace:
    """Read a search space from a ``.toml`` or ``.json`` file (parsed as data, never executed).

    Raises UsageError for a missing or unreadable file, ConfigError for bad contents.
    """
    p = Path(path)
    if p.suffix not in (".toml", ".json"):
        raise UsageError(f"--space must be a .toml or .json file: got {str(p)!r}")
    try:
        text = p.read_text()
    except OSError as err:
        raise UsageError(f"--space must be a readable file: {str(p)!r}: {err.strerror}") from None
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        first = str(err).splitlines()[0]
        raise ConfigError(f"the space file must be valid {p.suffix[1:].upper()}: {str(p)!r}: {first}") from None
    return space_from_dict(data, source=str(p))
