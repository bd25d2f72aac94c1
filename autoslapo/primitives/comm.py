"""Autograd-aware collectives over a tensor-parallel group (the building blocks of ``sync``).

Each forward collective is paired with its adjoint under the usual SPMD convention: a gradient that
arrives at a *replicated* tensor is the true gradient on every rank, one that arrives at a *partial*
tensor (a per-rank contribution to a sum) is summed by the adjoint.

| forward          | input -> output          | backward (adjoint)         |
|------------------|--------------------------|----------------------------|
| ``all_reduce``   | partial -> replicated    | identity                   |
| ``all_gather``   | sharded -> replicated    | ``split`` (this rank's part) |
| ``reduce_scatter`` | partial -> sharded     | ``all_gather``             |
| ``split``        | replicated -> sharded    | ``all_gather``             |
| ``identity``     | replicated -> replicated | ``all_reduce`` (Megatron's "f") |

Sequence parallelism fuses ``all_gather`` with the all-reduce that the column-parallel input needs:
forward ``all_gather``, backward ``reduce_scatter`` (see :func:`apply`'s ``bwd``).

Written on plain ``torch.distributed`` calls so they run on gloo (which has no reduce_scatter: it is
done as all_reduce + slice there) and on a fake process group for shape rehearsals.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["OPS", "apply"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "split", "identity")


def _world(group: Any) -> int:
    return 1 if group is None else int(dist.get_world_size(group))


def _rank(group: Any) -> int:
    return 0 if group is None else int(dist.get_rank(group))


def all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum ``x`` over the group (no autograd); returns a new tensor."""
    if _world(group) == 1:
        return x
    out = x.contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_gather(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order (no autograd)."""
    world = _world(group)
    if world == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def split(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """This rank's equal slice of ``x`` along ``dim`` (no autograd, no communication)."""
    world = _world(group)
    if world == 1:
        return x
    size = x.shape[dim]
    if size % world:
        from autoslapo.errors import ScheduleError

        raise ScheduleError(
            f"split along dim {dim} needs a size divisible by the group size: got {size} for "
            f"{world} ranks; pad the sequence or batch to a multiple of {world}"
        )
    return x.narrow(dim, _rank(group) * (size // world), size // world).contiguous()


def reduce_scatter(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Sum over the group, then keep this rank's slice along ``dim`` (no autograd)."""
    if _world(group) == 1:
        return x
    # gloo has no reduce_scatter; all_reduce + slice moves world/(world-1)x more bytes but is exact
    # and backend-independent. A NCCL fast path can replace this without changing the semantics.
    return split(all_reduce(x, group), dim, group)


def _run(op: str, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    if op == "all_reduce":
        return all_reduce(x, group)
    if op == "all_gather":
        return all_gather(x, dim, group)
    if op == "reduce_scatter":
        return reduce_scatter(x, dim, group)
    if op == "split":
        return split(x, dim, group)
    if op == "identity":
        return x
    raise ValueError(op)


ADJOINT = {
    "all_reduce": "identity",
    "all_gather": "split",
    "reduce_scatter": "all_gather",
    "split": "all_gather",
    "identity": "all_reduce",
}


class _Collective(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: str, bwd: str, dim: int, group: Any) -> torch.Tensor:
        ctx.bwd, ctx.dim, ctx.group = bwd, dim, group
        out = _run(fwd, x, dim, group)
        # identity must still return a distinct tensor for autograd to attach the backward op.
        return out.view_as(out) if out is x else out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _run(ctx.bwd, grad, ctx.dim, ctx.group), None, None, None, None


def apply(x: torch.Tensor, fwd: str, *, bwd: str | None = None, dim: int = -1, group: Any = None) -> torch.Tensor:
    """Run collective ``fwd`` on ``x`` in the forward pass and ``bwd`` on its gradient.

    Takes: the tensor, a forward op from :data:`OPS`, the backward op (default: the adjoint in the
    table above), the dimension for gather/scatter/split, and the process group.
    Returns: the result (a new autograd node). Raises: ValueError for an unknown op name.
    """
    if fwd not in OPS or (bwd is not None and bwd not in OPS):
        raise ValueError(f"collective must be one of {OPS}: got fwd={fwd!r}, bwd={bwd!r}")
    if _world(group) == 1:
        return x
    return _Collective.apply(x, fwd, bwd or ADJOINT[fwd], dim, group)  # type: ignore[no-any-return]
