"""``checkpoint``: recompute a module's activations in backward instead of keeping them.

Uses non-reentrant ``torch.utils.checkpoint`` with ``preserve_rng_state=True``: the RNG state at
the module's entry is saved and restored for the recomputation, so dropout draws the same masks
twice and gradients equal those of the un-checkpointed module. The module stays at its path (its
``forward`` is wrapped on the instance; hooks from ``sync`` stay outside the recomputed region,
collectives of child modules are recomputed with it, identically on every rank).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.checkpoint as torch_ckpt
from torch import nn

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

_INNER = "_autoslapo_inner_forward"
_FLAGS = "_autoslapo_ckpt_rng"


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # A bound method (not a closure) so that copy.deepcopy rebinds it to the copy.
    inner = self.__dict__.get(_INNER)
    fn = inner if inner is not None else types.MethodType(type(self).forward, self)
    if not torch.is_grad_enabled():
        return fn(*args, **kwargs)
    return torch_ckpt.checkpoint(
        fn, *args, use_reentrant=False, preserve_rng_state=self.__dict__[_FLAGS], **kwargs
    )


def checkpoint(sch: Schedule, enabled: bool = True, *, preserve_rng_state: bool = True) -> None:
    """Turn activation checkpointing of this module on (or off with ``enabled=False``).

    Takes: ``enabled`` and ``preserve_rng_state`` (keep True when the module has dropout: turning it
    off saves a little time but the recomputed masks differ and so do the gradients).
    Returns: None. Idempotent: checkpointing twice wraps once.
    """
    mod = sch.mod
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
        del mod.__dict__["forward"]
        if inner is not None:
            mod.forward = inner  # type: ignore[method-assign]
    sch.meta["checkpoint"] = bool(enabled)
