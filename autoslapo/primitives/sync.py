"""Tensor parallelism: ``sync`` inserts an autograd-aware collective at a module's boundary.

Where the collectives go for column- and row-parallel layers, and for sequence parallelism, is
listed in ``autoslapo.primitives.tp``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives import comm
from autoslapo.primitives.tp import shard_spec

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["MODES", "SYNC_OPS", "map_output", "sync"]

MODES = ("fwd_pre", "fwd_post", "bwd_pre", "bwd_post")
SYNC_OPS = ("all_reduce", "all_gather", "reduce_scatter", "split")


def _has_shards(mod: nn.Module) -> bool:
    return any(shard_spec(p) is not None for p in mod.parameters())


def _pick(args: tuple[Any, ...], kwargs: dict[str, Any], index: int | str) -> tuple[str, int | str]:
    if isinstance(index, str):
        if index in kwargs:
            return "kw", index
        raise ScheduleError(f"sync input {index!r} was not passed as a keyword argument")
    if index < len(args):
        return "pos", index
    if index == 0:  # modules called with keywords only: take the first tensor keyword
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                return "kw", k
    raise ScheduleError(f"sync input {index!r} not found among {len(args)} positional args / {list(kwargs)}")


def map_output(out: Any, index: int | str, fn: Any) -> Any:
    """Apply ``fn`` to output ``index`` of a module (a tensor, a mapping or ModelOutput, a tuple)."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, Mapping):  # dict or transformers ModelOutput (mutated in place)
        key = index if isinstance(index, str) else list(out.keys())[index]
        out[key] = fn(out[key])  # type: ignore[index]
        return out
    if isinstance(out, tuple | list) and not isinstance(index, str):
        items = list(out)
        items[index] = fn(items[index])
        return type(out)(items) if isinstance(out, list) else tuple(items)
    raise ScheduleError(f"sync cannot find output {index!r} in a {type(out).__name__}")


def sync(
    sch: Schedule,
    mode: str,
    op: str = "all_reduce",
    *,
    dim: int = -1,
    bwd: str | None = None,
    index: int | str = 0,
    bias: str | None = "auto",
) -> None:
    """Insert an autograd-aware collective at this module's boundary.

    Takes: ``mode`` (``fwd_pre`` input / ``fwd_post`` output: collective in the forward pass, its
    adjoint in the backward; ``bwd_pre`` output gradient / ``bwd_post`` input gradient: identity
    forward, collective on the gradient), ``op`` (all_reduce, all_gather, reduce_scatter, split),
    ``dim`` for gather/scatter/split, ``bwd`` to override the backward op (e.g. ``reduce_scatter``
    for a sequence-parallel all_gather), ``index`` of the input/output tensor (position or keyword),
    and ``bias``: for a summing ``fwd_post`` on a module whose bias is not sharded, the name of that
    bias to count once ("auto": ``"bias"`` when present; None: off).
    Raises: ScheduleError for an unknown mode or op, a gradient-mode op other than all_reduce, or a
    summing collective on a module without sharded parameters (it would multiply by the group size).
    """
    if mode not in MODES:
        raise ScheduleError(f"sync mode must be one of {MODES}: got {mode!r}")
    if op not in SYNC_OPS:
        raise ScheduleError(f"sync op must be one of {SYNC_OPS}: got {op!r}")
    if bwd is not None and bwd not in comm.OPS:
        raise ScheduleError(f"sync bwd must be one of {comm.OPS}: got {bwd!r}")
    if mode.startswith("bwd") and op != "all_reduce":
        raise ScheduleError(
            f"sync mode {mode!r} keeps the forward unchanged, so only all_reduce fits the gradient: "
            f"got op={op!r}; use a fwd_* mode for {op}"
        )
    summing = (op in ("all_reduce", "reduce_scatter") and mode.startswith("fwd")) or mode.startswith("bwd")
    if summing and not _has_shards(sch.mod):
        raise ScheduleError(
            f"sync({mode!r}, {op!r}) sums over the group, but {type(sch.mod).__name__} at "
            f"{sch.path or '<root>'!r} has no sharded parameters, so every rank holds the full value "
            f"and the sum would be tp={sch.group_size} times too large; shard its parameters first"
        )
    group, mod = sch.group, sch.mod
    rank = sch.rank
    bias_name = None
    if summing and mode == "fwd_post" and bias is not None:
        bias_name = "bias" if bias == "auto" else bias
        b = mod._parameters.get(bias_name)
        if b is None or shard_spec(b) is not None:
            if bias != "auto":
                raise ScheduleError(f"sync bias={bias!r}: no unsharded parameter of that name")
            bias_name = None
    sch.meta.setdefault("syncs", []).append(
        {"mode": mode, "op": op, "dim": dim, "bwd": bwd, "index": index, "bias": bias_name}
    )
    if sch.group_size == 1:
        return

    def collective(t: torch.Tensor) -> torch.Tensor:
        if mode.startswith("bwd"):
            return comm.apply(t, "identity", bwd=op, dim=dim, group=group)
        if bias_name is not None and rank != 0:
            b = mod._parameters[bias_name]
            if b is not None and t.shape[-1:] == b.shape:
                t = t - b.detach().to(t.dtype)  # every rank added the bias; keep rank 0's only
        return comm.apply(t, op, bwd=bwd, dim=dim, group=group)

    if mode in ("fwd_pre", "bwd_post"):

        def pre_hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            where, key = _pick(args, kwargs, index)
            if where == "pos":
                items = list(args)
                items[key] = collective(items[key])  # type: ignore[index]
                return tuple(items), kwargs
            kwargs = dict(kwargs)
            kwargs[key] = collective(kwargs[key])  # type: ignore[index]
            return args, kwargs

        handle = mod.register_forward_pre_hook(pre_hook, with_kwargs=True)
    else:

        def post_hook(_m: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
            return map_output(out, index, collective)

        handle = mod.register_forward_hook(post_hook)
    sch.meta.setdefault("hooks", []).append(handle)
