"""Tensor parallelism: ``shard`` parameters, and the shard specs and gradient hooks around them.

``sync`` (collectives at a module's boundary) is in ``autoslapo.primitives.sync``; the
vocab-parallel embedding and head in ``autoslapo.primitives.vocab``.

Parameters are sliced to plain local tensors (Megatron style), one shard per rank of the node's
``group``. Each sharded parameter carries a :class:`ShardSpec` (attribute ``_autoslapo_shard``, and
``sch.meta["shards"][name]``) so that ``build`` can materialize it and ``Verify`` can gather it.

Recipes (``tp`` = group size; ``W`` = weight):

* column-parallel ``nn.Linear``: ``shard("weight", 0)``, ``shard("bias", 0)``,
  ``sync("bwd_post", "all_reduce")`` (identity forward, all-reduce of the input gradient).
  For GPT-2's ``Conv1D`` (weight stored ``[in, out]``): ``shard("weight", 1)``, ``shard("bias", 0)``,
  ``shrink_attr("nf")``; for its fused q|k|v ``c_attn`` add ``chunks=3`` to both shards.
* row-parallel: ``shard("weight", 1)`` (``Conv1D``: axis 0), ``sync("fwd_post", "all_reduce")``; the
  unsharded bias is counted once (ranks other than 0 subtract a detached copy before the sum).
* vocab-parallel embedding: ``vocab_parallel()`` (shards rows, masks ids of other ranks, all-reduces).
* sequence parallelism: ``sync("fwd_post", "split", dim=1)`` where the sequence enters a TP block,
  ``sync("fwd_pre", "all_gather", dim=1, bwd="reduce_scatter")`` before column-parallel layers,
  ``sync("fwd_post", "reduce_scatter", dim=1)`` after row-parallel ones (instead of all_reduce),
  ``allreduce_grads()`` on LayerNorms that now see a sequence shard, and
  ``sync("fwd_post", "all_gather", dim=1)`` where the sequence leaves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives import comm

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = [
    "ShardSpec",
    "add_grad_hook",
    "allreduce_grads",
    "copy_param_attrs",
    "gather_shards",
    "param_places",
    "shard",
    "shard_spec",
    "shrink_attr",
    "slice_shard",
]

SHARD_ATTR = "_autoslapo_shard"
GRAD_SYNC_ATTR = "_autoslapo_grad_sync"
# Gradient hooks a primitive put on a parameter. A tensor hook belongs to the Parameter object, so
# ``build``/``materialize``, which replace meta parameters by new ones, register these again.
GRAD_HOOKS_ATTR = "_autoslapo_grad_hooks"


@dataclass(frozen=True)
class ShardSpec:
    """How a parameter was sliced: this rank holds block ``rank`` of every one of ``chunks`` blocks.

    ``full_shape`` is the unsharded shape; ``group`` the process group the shards live on; ``pad``
    the zero rows appended along ``axis`` before slicing (a vocabulary padded to a multiple of tp,
    as Megatron does): the last rank's shard ends with them, and gathering drops them again.
    """

    axis: int
    chunks: int
    full_shape: tuple[int, ...]
    group_size: int
    rank: int
    group: Any = None
    pad: int = 0


def shard_spec(param: torch.Tensor) -> ShardSpec | None:
    """Return the ShardSpec recorded on ``param``, or None if it is not sharded."""
    return getattr(param, SHARD_ATTR, None)


def slice_shard(full: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """Return this rank's shard of the full tensor ``full`` (a fresh, contiguous tensor)."""
    if spec.group_size == 1:
        return full.clone()
    if spec.pad:
        shape = list(full.shape)
        shape[spec.axis] = spec.pad
        full = torch.cat([full, full.new_zeros(shape)], dim=spec.axis)
    part = full.shape[spec.axis] // spec.chunks // spec.group_size
    if full.is_meta:  # only the shape matters; torch.cat on meta is slow (it runs Python refs)
        shape = list(full.shape)
        shape[spec.axis] = part * spec.chunks
        return torch.empty(shape, dtype=full.dtype, device="meta")
    if spec.chunks == 1:
        local = full.narrow(spec.axis, spec.rank * part, part)
        return local.clone(memory_format=torch.contiguous_format)
    blocks = full.chunk(spec.chunks, dim=spec.axis)
    pieces = [b.narrow(spec.axis, spec.rank * part, part) for b in blocks]
    return torch.cat(pieces, dim=spec.axis).contiguous()


def gather_shards(local: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """All-gather every rank's shard and reassemble the full tensor (no autograd).

    The inverse of :func:`slice_shard`: block b of the result is the concatenation over ranks of
    block b of each rank's shard.
    """
    if spec.group_size == 1:
        return local.detach().clone()
    parts = [torch.empty_like(local) for _ in range(spec.group_size)]
    torch.distributed.all_gather(parts, local.detach().contiguous(), group=spec.group)
    per_rank = [p.chunk(spec.chunks, dim=spec.axis) for p in parts]
    blocks = [torch.cat([r[b] for r in per_rank], dim=spec.axis) for b in range(spec.chunks)]
    out = torch.cat(blocks, dim=spec.axis)
    return out.narrow(spec.axis, 0, spec.full_shape[spec.axis]) if spec.pad else out


def _param(sch: Schedule, name: str) -> nn.Parameter:
    params = dict(sch.mod.named_parameters(recurse=False))
    if name not in params:
        valid = ", ".join(params) or "none"
        raise ScheduleError(
            f"{type(sch.mod).__name__} at {sch.path or '<root>'!r} has no parameter {name!r}; "
            f"its own parameters: {valid} (address a child node for deeper ones)"
        )
    return params[name]


Places = list[tuple[nn.Module, str, str]]  # (module, parameter name, dotted path of the parameter)
PLACES_KEY = "param_places"


def _scan_places(root: nn.Module) -> dict[int, Places]:
    places: dict[int, Places] = {}
    for mpath, m in root.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is not None:
                places.setdefault(id(p), []).append((m, pname, f"{mpath}.{pname}" if mpath else pname))
    return places


def param_places(sch: Schedule, param: nn.Parameter) -> Places:
    """Every (module, name, path) that holds ``param`` in the model under ``sch``'s root.

    A tied parameter (GPT-2's wte/lm_head) is one object held by several modules. The map from
    parameters to places is built once per root and kept in ``root.cache`` (``refresh`` clears it,
    so ``replace`` and ``trace`` invalidate it); an entry that no longer holds its parameter (e.g.
    after ``build`` swapped meta tensors) triggers one rescan. Scanning the whole model per shard
    made a TP-8 BERT-large schedule take 0.6 s; with the map it is one scan.
    """
    root = sch.root()
    cache: dict[int, Places] | None = root.cache.get(PLACES_KEY)
    found = cache.get(id(param)) if cache is not None else None
    if not found or any(m._parameters.get(n) is not param for m, n, _ in found):
        cache = _scan_places(root.mod)
        root.cache[PLACES_KEY] = cache
        found = cache.get(id(param), [])
    return found


def _set_everywhere(sch: Schedule, old: nn.Parameter, new: nn.Parameter) -> list[str]:
    # Re-tie every holder of ``old`` to ``new``, then move the cached entry to the new object.
    places = param_places(sch, old)
    for m, pname, _ in places:
        m._parameters[pname] = new
    cache = sch.root().cache.get(PLACES_KEY)
    if cache is not None:
        cache.pop(id(old), None)
        cache[id(new)] = places
    return [path for _, _, path in places]


def shard(sch: Schedule, param_name: str, axis: int, *, chunks: int = 1, pad: bool = False) -> ShardSpec:
    """Slice parameter ``param_name`` of this node to this rank's shard along ``axis``.

    Takes: the parameter's name on this module, the axis, ``chunks`` (3 for a fused q|k|v
    weight: each block is sharded separately so every rank keeps matching q, k and v heads), and
    ``pad``: when the size does not divide by the group size, append zero rows up to the next
    multiple (the caller must keep them out of the result, as ``vocab_parallel`` does).
    Returns: the recorded ShardSpec. Works on the meta device (``build`` materializes later).
    Raises: ScheduleError for an unknown parameter, an axis out of range, a size that does not
    divide by ``chunks * group_size`` (without ``pad``; ``pad`` needs ``chunks=1``), or a parameter
    that is already sharded.
    """
    param = _param(sch, param_name)
    where = f"{sch.path + '.' if sch.path else ''}{param_name}"
    if shard_spec(param) is not None:
        raise ScheduleError(f"{where} is already sharded ({shard_spec(param)}); shard each parameter once")
    if not -param.dim() <= axis < param.dim():
        raise ScheduleError(
            f"shard axis must be in [-{param.dim()}, {param.dim()}) for {where} of shape "
            f"{tuple(param.shape)}: got axis={axis}"
        )
    axis %= param.dim()
    if chunks < 1:
        raise ScheduleError(f"shard chunks must be >= 1: got chunks={chunks} for {where}")
    world, size = sch.group_size, param.shape[axis]
    if pad and chunks != 1:
        raise ScheduleError(f"shard pad=True needs chunks=1: got chunks={chunks} for {where}")
    extra = -size % world if pad else 0
    if size % (chunks * world) and not pad:
        raise ScheduleError(
            f"shard needs size % (chunks * tp) == 0: {where} has size {size} on axis {axis}, "
            f"chunks={chunks}, tp={world} ({chunks * world}); pick a tp that divides {size // chunks}"
            if size % chunks == 0
            else f"shard needs size % (chunks * tp) == 0: {where} has size {size} on axis {axis}, "
            f"chunks={chunks}; {size} is not divisible by chunks={chunks}"
        )
    spec = ShardSpec(axis, chunks, tuple(param.shape), world, sch.rank, sch.group, pad=extra)
    with torch.no_grad():
        local = slice_shard(param.data, spec)
    new = nn.Parameter(local, requires_grad=param.requires_grad)
    setattr(new, SHARD_ATTR, spec)
    for k, v in vars(param).items():  # keep annotations and other tags
        if k != SHARD_ATTR:
            setattr(new, k, v)
    places = _set_everywhere(sch, param, new)
    sch.meta.setdefault("shards", {})[param_name] = spec
    if len(places) > 1:
        sch.meta.setdefault("tied", {})[param_name] = places
    return spec


def shrink_attr(sch: Schedule, *names: str, by: int | None = None) -> dict[str, int]:
    """Divide integer attributes of this module (``num_heads``, ``split_size``, ``nf``...) by ``by``.

    Use it for sizes a forward uses explicitly after its weights were sharded. ``by`` defaults to
    the group size. Returns the new values by name.
    Raises: ScheduleError if an attribute is missing, not an int, or not divisible by ``by``.
    """
    by = sch.group_size if by is None else by
    if by < 1:
        raise ScheduleError(f"shrink_attr needs by >= 1: got by={by}")
    new: dict[str, int] = {}
    for name in names:
        value = getattr(sch.mod, name, None)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScheduleError(
                f"shrink_attr needs an int attribute: {type(sch.mod).__name__}.{name} is {value!r}"
            )
        if value % by:
            raise ScheduleError(
                f"shrink_attr needs {name} % tp == 0: {type(sch.mod).__name__}.{name}={value}, tp={by}; "
                f"pick a tp that divides {value}"
            )
        new[name] = value // by
    for name, value in new.items():
        setattr(sch.mod, name, value)
        sch.meta.setdefault("shrunk", {})[name] = value
    return new


def add_grad_hook(p: nn.Parameter, hook: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Register ``hook`` on ``p``'s gradient and record it, so a materialized copy gets it too."""
    hooks: list[Callable[[torch.Tensor], torch.Tensor]] = getattr(p, GRAD_HOOKS_ATTR, [])
    setattr(p, GRAD_HOOKS_ATTR, [*hooks, hook])
    p.register_hook(hook)


def copy_param_attrs(old: nn.Parameter, new: nn.Parameter) -> None:
    """Give ``new`` (a materialized ``old``) its ShardSpec, annotations, flags and gradient hooks."""
    for k, v in vars(old).items():
        setattr(new, k, v)
    for hook in getattr(old, GRAD_HOOKS_ATTR, ()):
        new.register_hook(hook)


def allreduce_grads(sch: Schedule, *names: str) -> list[str]:
    """Sum the gradients of this module's parameters over the group during backward.

    For replicated parameters that only see part of the data on each rank: LayerNorm weights under
    sequence parallelism. Takes: parameter names relative to this node (default: all, recursively).
    Returns: the names hooked. Raises: ScheduleError for a sharded or unknown parameter, or one that
    already has its gradient synced.
    """
    params = dict(sch.mod.named_parameters())
    chosen = list(names) or list(params)
    for name in chosen:
        if name not in params:
            raise ScheduleError(f"allreduce_grads: no parameter {name!r} under {sch.path or '<root>'!r}; "
                                f"valid: {', '.join(params)}")
        p = params[name]
        if shard_spec(p) is not None:
            raise ScheduleError(f"allreduce_grads: {name!r} is sharded; its gradient is already per-shard")
        if getattr(p, GRAD_SYNC_ATTR, False):
            raise ScheduleError(f"allreduce_grads: {name!r} already has its gradient synced")
    group, world = sch.group, sch.group_size
    for name in chosen:
        p = params[name]
        setattr(p, GRAD_SYNC_ATTR, True)
        if world > 1:
            add_grad_hook(p, functools.partial(comm.all_reduce, group=group))
    sch.meta.setdefault("grad_sync", []).extend(chosen)
    return chosen
