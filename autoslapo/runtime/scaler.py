"""Dynamic loss scaling for fp16 training on every rank of a layout (TP shards, pipeline stages, ZeRO).

fp16 has five exponent bits: gradients of activations below ~6e-8 flush to zero and above 65,504
overflow. Mixed-precision training therefore multiplies the loss by a scale ``S`` before backward,
so that the activation gradients (fp16 under autocast) stay representable, and divides the
parameters' gradients by ``S`` before the optimizer uses them; when a gradient overflowed the
step is skipped and ``S`` halves, and after ``growth_interval`` clean steps ``S`` doubles
(Micikevicius et al. 2018, "Mixed Precision Training", section 3.2; the recipe of
``torch.amp.GradScaler``, whose defaults these are).

Why not ``torch.amp.GradScaler``: it unscales ``p.grad`` after backward, but under ZeRO-2/3 the
gradients live in DeepSpeed's partitioned buffers (or, in a pipeline's ZeRO-2, are reduced to
their owner and freed in backward), and its overflow check is per process, while a layout's ranks
hold different shards and must all skip the same steps. So the scale is removed where each
gradient is produced: a hook on every parameter (``Tensor.register_hook``, which runs before the
gradient is accumulated and before DeepSpeed's or the owners' hooks) multiplies the fp32 gradient
by ``1/S`` (a power of two: exact) and records whether it is finite; before the optimizer steps,
one all-reduce (MAX) of that flag over the whole world decides, for every rank alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DynamicLossScaler", "SkippableAdamW"]


class SkippableAdamW(torch.optim.AdamW):
    """AdamW whose ``step()`` does nothing while ``skip`` is set: the optimizer DeepSpeed wraps
    steps it at the accumulation boundary, and a step whose gradients overflowed must leave the
    weights and the moments as they were (DeepSpeed then copies the unchanged partition back and
    zeroes the gradients as usual)."""

    skip: bool = False

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if self.skip:
            return None
        return super().step(closure)


class DynamicLossScaler:
    """Loss scale, per-parameter unscaling hooks, and the world's agreement on overflow.

    Use: ``attach(params)`` once; each micro-batch back-propagates ``scale_loss(loss)``; after the
    step's last backward, ``end_step()`` (a collective: every rank calls it) says whether any rank
    saw a non-finite gradient and moves the scale. ``skipped_steps`` counts the skipped steps.
    """

    def __init__(self, device: str | torch.device, *, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, distributed: bool = True) -> None:
        if init_scale <= 0 or growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError(
                "DynamicLossScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                f"growth_interval >= 1; got {init_scale}, {growth_factor}, {backoff_factor}, {growth_interval}"
            )
        self.scale = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.distributed = distributed
        self.clean_steps = 0
        self.skipped_steps = 0
        self._found = torch.zeros((), device=device)
        self._handles: list[Any] = []

    def attach(self, params: Iterable[nn.Parameter]) -> None:
        """Hook every parameter that takes a gradient (each once, shared ones included)."""
        seen: set[int] = set()
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                self._handles.append(p.register_hook(self._unscale))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _unscale(self, grad: torch.Tensor) -> torch.Tensor:
        self._found += (~torch.isfinite(grad)).any().to(self._found.dtype)
        return grad * (1.0 / self.scale)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to back-propagate: ``loss * S``."""
        return loss * self.scale

    def should_skip(self) -> bool:
        """Whether this step's gradients overflowed on any rank (a collective over the world)."""
        found = self._found.detach().clone().reshape(1)
        if self.distributed and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        self._found.zero_()
        return bool(found.item() > 0)

    def end_step(self) -> bool:
        """After a step's last backward: whether to skip its optimizer step (``should_skip``, a
        collective), the scale moved accordingly (``update``)."""
        skip = self.should_skip()
        self.update(skip)
        return skip

    def update(self, skipped: bool) -> None:
        """Halve the scale after an overflow; double it after ``growth_interval`` clean steps."""
        if skipped:
            self.scale *= self.backoff_factor
            self.clean_steps = 0
            self.skipped_steps += 1
            return
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state(self) -> dict[str, Any]:
        return {"loss_scale": self.scale, "skipped_steps": self.skipped_steps}
