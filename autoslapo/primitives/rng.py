"""``fork_rng``: give a module its own random stream, per tensor-parallel rank or shared.

Which to use (every TP rank is seeded identically, as ``build`` does):

* ``per_rank=True`` for dropout on *sharded* activations: attention-probability dropout when heads
  are split across ranks, dropout on a sequence shard under sequence parallelism. Each rank draws
  a different mask, as the unsharded model would for different heads/tokens.
* ``per_rank=False`` (or no fork at all) for dropout on *replicated* activations: after a
  row-parallel all-reduce every rank holds the same tensor and must drop the same elements, or the
  replicas diverge.

The region's seed is one draw from the global generator at the module's entry, mixed with the rank
when ``per_rank``; the global state is restored on exit (so it advances by exactly one draw on every
rank). Under ``checkpoint`` the recomputation restores the entry state first, so the same seed and the
same masks come back: the fork is RNG-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

_MIX = 0x9E3779B97F4A7C15


def _region_seed(draw: int, rank: int, per_rank: bool) -> int:
    return (draw ^ (_MIX * (rank + 1) if per_rank else 0)) % (2**63)


def fork_rng(sch: Schedule, *, per_rank: bool = True) -> None:
    """Run this module under a forked RNG stream (see the module docstring for which mode).

    Takes: ``per_rank`` (True: a different stream on every TP rank; False: the same on all).
    Returns: None.
    """
    rank = sch.rank
    saved: list[tuple[torch.Tensor, list[torch.Tensor] | None]] = []

    def pre_hook(_m: nn.Module, _args: tuple[Any, ...]) -> None:
        draw = int(torch.randint(0, 2**62, (1,)).item())
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        saved.append((torch.get_rng_state(), cuda))
        torch.manual_seed(_region_seed(draw, rank, per_rank))

    def post_hook(_m: nn.Module, _args: tuple[Any, ...], _out: Any) -> None:
        cpu, cuda = saved.pop()
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    sch.meta.setdefault("hooks", []).extend(
        [sch.mod.register_forward_pre_hook(pre_hook), sch.mod.register_forward_hook(post_hook)]
    )
    sch.meta["fork_rng"] = "per_rank" if per_rank else "shared"
