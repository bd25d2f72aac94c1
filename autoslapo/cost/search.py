"""Exhaustive search over schedules with the cost model: ``candidate_configs``, ``sweep``, ``best_config``
(and ``best_configs``, the n best).

Pure. Every knob left free is enumerated over its valid values for the model and cluster: TP
degrees that divide the heads and the MLP width and stay within a node, pipeline degrees that
split the layers evenly or nearly so (``layout.pp_degrees``), micro-batches in powers of two, checkpoint ratios in quarters, ZeRO stages
(0-1 with pipelines), attention kernels the device has, sequence parallelism when TP > 1. The
batch: ``global_batch`` fixes the micro-batches per step; without it a step runs one micro-batch
per replica (``4 pp`` with pipelines, so the bubble stays small). For a fixed layout, a larger
micro-batch never needs less memory, so the search stops growing it at the first that does not fit.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import autoslapo.layout as layout
from autoslapo.config import KNOB, KNOBS, ScheduleConfig
from autoslapo.cost.device import DevicePerf, device_perf
from autoslapo.cost.encdec import checkpointed_blocks
from autoslapo.cost.estimate import Estimate, estimate
from autoslapo.cost.memory import checkpointed_layer_ids
from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: Knobs the layout enumerates (degrees and batch); every other knob is swept by its declaration.
_LAYOUT = ("tp", "pp", "dp", "micro_batch", "grad_accum")


def _domain(name: str, cluster: ClusterSpec, fixed: dict[str, Any]) -> list[Any]:
    """The values the sweep tries for one non-layout knob: the pinned one, else its sweep, else its default
    (also when the knob it ``refines`` is pinned)."""
    k = KNOB[name]
    if name in fixed:
        return [k.check(fixed[name], "the pinned knobs")]
    if k.refines and k.refines in fixed:  # the refined knob pinned alone means this one at its default
        return [k.default]
    if name == "precision":
        return [layout.default_precision(cluster.device.bf16)]
    if name == "attn_kernel":
        return [v for v in k.sweep or (k.default,) if v != "flash" or cluster.device.flash_attention]
    return list(k.sweep) if k.sweep is not None else [k.default]


def candidate_configs(model: ModelSpec, cluster: ClusterSpec, *, global_batch: int | None = None,
                      rejected: Counter[str] | None = None, acting: bool = False,
                      **fixed: Any) -> Iterator[list[ScheduleConfig]]:
    """Valid configs, grouped by everything but the micro-batch (each group in growing micro-batch).

    ``fixed`` pins knobs by ``ScheduleConfig`` field name; every knob of ``KNOBS`` can be pinned, and
    an unknown name raises ``ConfigError``. A pinned value is never dropped: a pin no valid
    configuration can have yields nothing (and ``best_config`` says which rule it breaks).
    ``rejected``, when given, counts the rule each configuration left out broke. ``acting``: leave
    out the configurations where a knob pinned away from its default changes nothing (its
    ``inert`` rule: selective recomputation with no layer checkpointed, ZeRO without data
    parallelism, sequence parallelism without TP ...).
    """
    bad = sorted(set(fixed) - set(KNOB))
    if bad:
        raise ConfigError(f"unknown knobs {bad}; valid knobs are {sorted(KNOB)}")
    fixed = {k: v for k, v in fixed.items() if v is not None}
    others = [k.name for k in KNOBS if k.name not in _LAYOUT]
    domains = {n: _domain(n, cluster, fixed) for n in others}
    for n in layout.inapplicable_knobs(model, KNOBS):  # a knob the family cannot use: its default only
        if n not in fixed:
            domains[n] = [KNOB[n].default]
    if "ckpt_granularity" not in fixed and not layout.op_ckpt_ok(model):  # per-op: not offered (T5)
        domains["ckpt_granularity"] = [v for v in domains["ckpt_granularity"] if v != "op"]
    # Ratios 0 and 1 first: where another ratio checkpoints none or all of a chunk's blocks, the
    # round figure is the one kept (``_runs_as``)
    domains["ckpt_ratio"].sort(key=lambda r: (r not in (0.0, 1.0), r))
    # Free knobs that may change nothing (their ``inert`` rule): swept only at their default there.
    inert = [(n, rule) for n in others if (rule := KNOB[n].inert) is not None and n not in fixed]
    pinned_inert = [(n, rule) for n, v in fixed.items() if (rule := KNOB[n].inert) is not None
                    and v != KNOB[n].default] if acting else []
    mbs = [fixed["micro_batch"]] if "micro_batch" in fixed else list(MICRO_BATCHES)
    ran: set[tuple[Any, ...]] = set()  # what each group checkpoints, to skip another ratio doing the same
    for tp, pp, dp in layout.layouts(model, cluster, tp=fixed.get("tp"), pp=fixed.get("pp"), dp=fixed.get("dp")):
        for combo in itertools.product(*(domains[n] for n in others)):
            knobs = dict(zip(others, combo, strict=True))
            where = {"tp": tp, "pp": pp, "dp": dp, **knobs}
            if any(knobs[n] != KNOB[n].default and rule(where, model.layers) for n, rule in inert):
                continue  # the same configuration as the one with that knob at its default
            if "virtual_stages" not in fixed and knobs["pipeline_schedule"] == "interleaved":
                # the fewest chunks a rank interleaves (set after the inert test: a pinned interleaved
                # schedule on one stage is then refused by its rule, not skipped without one)
                knobs["virtual_stages"] = where["virtual_stages"] = 2
            if any(rule(where, model.layers) for _, rule in pinned_inert):
                continue  # a pin asked for what this configuration would not do
            group = []
            for mb in mbs:
                if global_batch is not None:
                    if global_batch % (mb * dp):
                        if rejected is not None:
                            rejected[_batch_rule(global_batch, mb, dp)] += 1
                        continue
                    ga = global_batch // (mb * dp)
                else:
                    ga = fixed.get("grad_accum", 4 * pp if pp > 1 else 1)
                try:
                    cfg = ScheduleConfig(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=ga,
                                         **knobs).validate(model, cluster)
                except ConfigError as exc:
                    if rejected is not None:
                        rejected[str(exc)] += 1
                    continue
                group.append(cfg)
            key = _runs_as(model, group[0], acting=acting, fixed=fixed) if group else None
            if key is not None and key not in ran:
                ran.add(key)
                yield group


_CKPT = ("ckpt_ratio", "ckpt_granularity", "ckpt_placement")


def _runs_as(model: ModelSpec, cfg: ScheduleConfig, *, acting: bool, fixed: dict[str, Any]) -> tuple[Any, ...] | None:
    """What ``cfg``'s group runs, its checkpointing read as the blocks it checkpoints: a checkpoint ratio
    checkpoints ``round(ratio x blocks)`` of each pipeline chunk, so on short chunks two ratios (0 and
    0.25 of one block; 0.75 and 1 of two) run the same schedule, and granularity and placement act on
    nothing when no block is checkpointed. Those groups share the key (the first is kept); the key is
    that of a group already run when ``acting`` and a checkpointing knob pinned away from its default
    acts on nothing here (None is never run: the group is skipped)."""
    blocks = frozenset(checkpointed_blocks(model, cfg) if model.encoder_decoder else checkpointed_layer_ids(model, cfg))
    if acting and not blocks and any(fixed.get(k, KNOB[k].default) != KNOB[k].default for k in _CKPT):
        return None
    rest = tuple(getattr(cfg, k.name) for k in KNOBS if k.name not in (*_CKPT, "micro_batch", "grad_accum"))
    how = (cfg.ckpt_granularity,) if blocks else ()
    return (rest, blocks, how)


def _pins(fixed: dict[str, Any]) -> str:
    """``"the pins tp=1 pp=1"`` for a person (``"no pins"`` when none is set)."""
    given = [f"{k}={v}" for k, v in fixed.items() if v is not None]
    return "the pins " + " ".join(given) if given else "no pins"


def _batch_rule(global_batch: int, mb: int, dp: int) -> str:
    return (f"the global batch must split into micro-batches over the replicas: got global batch {global_batch} "
            f"for micro-batch {mb} x dp {dp}; use a global batch that is a multiple of micro-batch x dp")


def no_schedule_reason(model: ModelSpec, cluster: ClusterSpec, fixed: dict[str, Any],
                       rejected: Counter[str]) -> str:
    """The rule that leaves no valid configuration: a pinned degree's own, else the one most of the
    configurations tried broke ("" when none was tried and no pin explains it)."""
    if fixed.get("tp") is not None and (problem := layout.tp_problem(int(fixed["tp"]), model, cluster)):
        return problem
    if fixed.get("pp") is not None and (problem := layout.pp_problem(
            int(fixed["pp"]), model, cluster, int(fixed.get("virtual_stages") or 1))):
        return problem
    pins = {k: fixed.get(k) for k in ("tp", "pp", "dp")}
    if not any(layout.layouts(model, cluster, **pins)):
        given = ", ".join(f"{k}={v}" for k, v in pins.items() if v is not None)
        return (f"tp*pp*dp must equal --gpus: no layout of {cluster.gpus} devices has {given}; "
                f"pin degrees whose product is {cluster.gpus}")
    return rejected.most_common(1)[0][0] if rejected else ""


def sweep(model: ModelSpec, cluster: ClusterSpec, configs: Iterable[ScheduleConfig], *,
          profile: dict[str, Any] | None = None) -> list[Estimate]:
    """Estimates for many configs (assumed valid: they are not re-validated), sharing one device model."""
    perf = device_perf(cluster, profile)
    return [estimate(model, c, cluster, perf=perf, validate=False) for c in configs]


def best_config(model: ModelSpec, cluster: ClusterSpec, *, global_batch: int | None = None,
                profile: dict[str, Any] | None = None, perf: DevicePerf | None = None,
                **fixed: Any) -> Estimate:
    """The schedule with the highest predicted samples/s that fits, over every free knob.

    Takes knobs to pin (``tp=8``, ``zero_stage=1`` ...) and optionally the global batch.
    Returns its ``Estimate``. Raises ``ConfigError`` when no valid config exists, or when none
    fits in memory (naming the smallest footprint found).
    """
    return best_configs(model, cluster, 1, global_batch=global_batch, profile=profile, perf=perf, **fixed)[0]


def best_configs(model: ModelSpec, cluster: ClusterSpec, n: int, *, global_batch: int | None = None,
                 profile: dict[str, Any] | None = None, perf: DevicePerf | None = None,
                 refusal: Callable[[ScheduleConfig], str] | None = None, **fixed: Any) -> list[Estimate]:
    """The ``n`` schedules with the highest predicted samples/s that fit, fastest first (a tie goes
    to the smaller memory, then to the one found first); the first carries ``breakdown["searched"]``,
    how many configurations were estimated. Pins and errors as ``best_config``'s.

    ``refusal(config)``: why the runtime the estimate is for cannot run ``config`` ("" when it can);
    a refused configuration is skipped (ConfigError with the first reason when every one is).

    A knob pinned away from its default is searched where it acts (``candidate_configs(acting=True)``:
    ``ckpt_granularity="selective"`` with ``ckpt_ratio`` free searches ratios above 0); only when no
    such configuration fits does the search take those where it changes nothing.
    """
    if n < 1:
        raise ConfigError(f"the number of schedules must be at least 1: got {n}")
    if global_batch is not None:
        layout.check_global_batch(global_batch)
    perf = perf or device_perf(cluster, profile)
    if any(KNOB[k].inert is not None and v is not None and v != KNOB[k].default
           for k, v in fixed.items() if k in KNOB):
        try:
            return _best_configs(model, cluster, n, global_batch, perf, fixed, acting=True, refusal=refusal)
        except ConfigError:
            pass  # nowhere does the pin act (or fit): the search below says why, or finds where it is inert
    return _best_configs(model, cluster, n, global_batch, perf, fixed, acting=False, refusal=refusal)


def _best_configs(model: ModelSpec, cluster: ClusterSpec, n: int, global_batch: int | None, perf: DevicePerf,
                  fixed: dict[str, Any], *, acting: bool,
                  refusal: Callable[[ScheduleConfig], str] | None = None) -> list[Estimate]:
    top: list[tuple[tuple[float, float, int], Estimate]] = []  # a min-heap of the n best so far
    smallest: Estimate | None = None
    seen = 0
    refused = ""  # the runtime's first reason to refuse a configuration
    rejected: Counter[str] = Counter()
    for group in candidate_configs(model, cluster, global_batch=global_batch, rejected=rejected, acting=acting,
                                   **fixed):
        for cfg in group:
            why = refusal(cfg) if refusal is not None else ""
            if why:
                refused = refused or why
                continue
            est = estimate(model, cfg, cluster, perf=perf, validate=False)
            seen += 1
            if not est.fits:
                if smallest is None or est.memory_per_device_bytes < smallest.memory_per_device_bytes:
                    smallest = est
                break  # larger micro-batches of this layout need more memory still
            key = (est.samples_per_s, -est.memory_per_device_bytes, -seen)
            if len(top) < n:
                heapq.heappush(top, (key, est))
            elif key > top[0][0]:
                heapq.heapreplace(top, (key, est))
    if top:
        ranked = [est for _, est in sorted(top, key=lambda item: item[0], reverse=True)]
        ranked[0] = replace(ranked[0], breakdown={**ranked[0].breakdown, "searched": seen})
        return ranked
    if smallest is None and refused:
        raise ConfigError(f"no schedule of {model.preset} on {cluster.gpus} x {cluster.gpu_type} with {_pins(fixed)} runs "
                          f"on autoslapo's runtime: {refused}")
    if smallest is None:
        reason = no_schedule_reason(model, cluster, {k: v for k, v in fixed.items() if v is not None}, rejected)
        raise ConfigError(
            f"no valid schedule for {model.preset} on {cluster.gpus} x {cluster.gpu_type} with {_pins(fixed)}"
            f"{'' if global_batch is None else f' and global batch {global_batch}'}"
            f"{f': {reason}' if reason else '; relax the fixed knobs'}"
        )
    raise ConfigError(
        f"no schedule fits in memory: the smallest needs {smallest.memory_per_device_bytes / 2**30:.1f} "
        f"GiB per device, {cluster.gpu_type} has {cluster.memory_bytes / 2**30:.1f} GiB; use more or "
        f"larger devices, or a smaller model"
    )
