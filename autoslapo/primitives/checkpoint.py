"""``checkpoint``: recompute a module's activations in backward instead of keeping them.

Uses non-reentrant ``torch.utils.checkpoint`` with ``preserve_rng_state=True``: the RNG state at
the module's entry is saved and restored for the recomputation, so dropout draws the same masks
twice and gradients equal those of the un-checkpointed module. The module stays at its path (its
``forward`` is wrapped on the instance; hooks from ``sync`` stay outside the recomputed region,
collectives of child modules are recomputed with it, identically on every rank).

``checkpoint(keep="linear")`` is selective recomputation (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models"): a selective-checkpoint policy keeps the
outputs of the region's matrix products with a weight (``mm``/``addmm``: the linear layers) and
recomputes everything else. On an attention module that is the attention core (scores, softmax,
dropout, the product with v), the activations that grow with ``s^2``; the projections are not
recomputed. Random ops are recomputed in their order from the restored RNG state, so dropout
draws the same masks.

``checkpoint(keep="alternate")`` is per-op selective recomputation as torchtitan's "selective op"
policy does it (``_save_list`` in its llama parallelize module): keep the outputs of a fused
attention kernel (``scaled_dot_product_*`` / flash-attn) and of every other matrix product with a
weight (the 1st, 3rd, ... ``mm``/``addmm`` of the region, counted afresh in each forward and each
recomputation), recompute everything else (norms, activations, the other products, an eager
attention core). It keeps more than full recomputation and less than keeping the linear outputs.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint as torch_ckpt
from torch import nn

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule
from autoslapo.errors import ScheduleError

__all__ = ["KEEP", "LINEAR_OPS", "checkpoint", "is_attention_kernel", "set_call_index"]

_INNER = "_autoslapo_inner_forward"
_FLAGS = "_autoslapo_ckpt_rng"
_KEEP = "_autoslapo_ckpt_keep"
_CALLS = "_autoslapo_ckpt_calls"  # (calls to checkpoint, calls per model forward) of a shared module
_COUNT = "_autoslapo_ckpt_count"
KEEP = ("nothing", "linear", "alternate")
# The products of activations with weights (nn.Linear, transformers' Conv1D): 2-D after flattening
# tokens. The attention core's products are batched (bmm) or a fused SDPA kernel, so recomputed.
LINEAR_OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def _keep_linear(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> torch_ckpt.CheckpointPolicy:
    if op in LINEAR_OPS:
        return torch_ckpt.CheckpointPolicy.MUST_SAVE
    return torch_ckpt.CheckpointPolicy.PREFER_RECOMPUTE


_SELECTIVE = functools.partial(torch_ckpt.create_selective_checkpoint_contexts, _keep_linear)


def is_attention_kernel(op: Any) -> bool:
    """Whether ``op`` is a fused attention kernel (torch's sdpa backends, flash-attn's custom op)."""
    name = str(op)
    return "scaled_dot_product" in name or "flash_attn" in name


def _alternate_contexts() -> tuple[Any, Any]:
    """Fresh contexts for one checkpointed call: the products are counted per pass (the forward and
    its recomputation each from 1), so both passes save the same ones."""
    counts = {False: 0, True: 0}

    def policy(ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> torch_ckpt.CheckpointPolicy:
        if op in LINEAR_OPS:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 1:
                return torch_ckpt.CheckpointPolicy.MUST_SAVE
            return torch_ckpt.CheckpointPolicy.PREFER_RECOMPUTE
        if is_attention_kernel(op):
            return torch_ckpt.CheckpointPolicy.MUST_SAVE
        return torch_ckpt.CheckpointPolicy.PREFER_RECOMPUTE

    return torch_ckpt.create_selective_checkpoint_contexts(policy)


_CONTEXTS: dict[str, Callable[[], tuple[Any, Any]]] = {"linear": _SELECTIVE, "alternate": _alternate_contexts}


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # A bound method (not a closure) so that copy.deepcopy rebinds it to the copy.
    inner = self.__dict__.get(_INNER)
    fn = inner if inner is not None else types.MethodType(type(self).forward, self)
    by_call = self.__dict__.get(_CALLS)
    if by_call is not None:
        # A module run several times per forward (ALBERT's shared layer) checkpoints some calls:
        # every call counts, so call i of each forward is call (count mod period).
        calls, period = by_call
        i = self.__dict__[_COUNT] % period
        self.__dict__[_COUNT] = i + 1
        if i not in calls:
            return fn(*args, **kwargs)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    rng = self.__dict__[_FLAGS]
    contexts = _CONTEXTS.get(self.__dict__.get(_KEEP, "nothing"))
    if contexts is not None:
        return torch_ckpt.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=rng,
                                     context_fn=contexts, **kwargs)
    return torch_ckpt.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=rng, **kwargs)


def set_call_index(module: nn.Module, index: int) -> None:
    """Say that the next call of each module under ``module`` checkpointed by call is call ``index``.

    For a pipeline stage running calls of a shared layer (ALBERT): its ranks and microbatches
    interleave the calls, so the count kept since the first call would not say which one runs.
    Modules checkpointed without ``calls`` (or not at all) are left alone.
    """
    for mod in module.modules():
        by_call = mod.__dict__.get(_CALLS)
        if by_call is not None:
            mod.__dict__[_COUNT] = index % by_call[1]


def checkpoint(sch: Schedule, enabled: bool = True, *, preserve_rng_state: bool = True,
               keep: str = "nothing", calls: Collection[int] | None = None, period: int = 0) -> None:
    """Turn activation checkpointing of this module on (or off with ``enabled=False``).

    Takes: ``enabled`` and ``preserve_rng_state`` (keep True when the module has dropout: turning it
    off saves a little time but the recomputed masks differ and so do the gradients); ``keep``:
    "nothing" (recompute the whole module from its inputs), "linear" (keep the linear layers'
    outputs, recompute the rest: selective recomputation, see the module docstring) or "alternate"
    (keep a fused attention kernel's output and every other linear output: per-op); ``calls`` and
    ``period`` for a module called ``period`` times per model forward (a shared layer): checkpoint
    only those calls (0-based; ``None``: every call). Calls are counted modulo ``period`` from the
    first, so every forward must call the module exactly ``period`` times.
    Returns: None. Idempotent: checkpointing twice wraps once (the last ``keep``/``calls`` hold).
    Raises: ScheduleError for an unknown ``keep``, or ``calls`` outside ``0..period-1``.
    """
    if keep not in KEEP:
        raise ScheduleError(f"checkpoint keep must be one of {', '.join(KEEP)}: got {keep!r}; "
                            "'linear' is selective recomputation, 'alternate' the per-op policy")
    mod = sch.mod
    if calls is not None:
        chosen = frozenset(int(c) for c in calls)
        if period < 1 or any(not 0 <= c < period for c in chosen):
            raise ScheduleError(
                f"checkpoint calls must lie in 0..period-1: got calls={sorted(chosen)}, period={period} "
                f"at {sch.path!r}; give period = the module's calls per forward"
            )
        mod.__dict__[_CALLS] = (chosen, period)
        mod.__dict__[_COUNT] = 0
    else:
        mod.__dict__.pop(_CALLS, None)
        mod.__dict__.pop(_COUNT, None)
    mod.__dict__[_KEEP] = keep
    on = "forward" in mod.__dict__ and getattr(mod.__dict__["forward"], "__func__", None) is _checkpointed_forward
    if enabled and not on:
        mod.__dict__[_INNER] = mod.__dict__.get("forward")  # a forward another primitive patched, or None
        mod.__dict__[_FLAGS] = preserve_rng_state
        mod.forward = types.MethodType(_checkpointed_forward, mod)  # type: ignore[method-assign]
    elif enabled:
        mod.__dict__[_FLAGS] = preserve_rng_state
    elif on:
        inner = mod.__dict__.pop(_INNER, None)
        mod.__dict__.pop(_FLAGS, None)
        mod.__dict__.pop(_KEEP, None)
        mod.__dict__.pop(_CALLS, None)
        mod.__dict__.pop(_COUNT, None)
        del mod.__dict__["forward"]
        if inner is not None:
            mod.forward = inner  # type: ignore[method-assign]
    if not enabled:
        mod.__dict__.pop(_KEEP, None)
        mod.__dict__.pop(_CALLS, None)
        mod.__dict__.pop(_COUNT, None)
    sch.meta["checkpoint"] = bool(enabled)
    if enabled:
        sch.meta["checkpoint_keep"] = keep
        if calls is not None:
            sch.meta["checkpoint_calls"] = sorted(mod.__dict__[_CALLS][0])
