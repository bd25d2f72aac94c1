"""``rms_norm_kernel``: run an RMSNorm module as one autograd op that keeps its input and ``rstd``.

transformers writes an RMSNorm (LLaMA's ``LlamaRMSNorm``, T5's ``T5LayerNorm``) as a chain of
tensor ops: a cast to fp32, square, mean, add, reciprocal square root, product, a cast back and
the weight's product. Each is a kernel of its own, and autograd keeps the tensors the chain's
backward reads: the fp32 copy of the input and the normalized tensor before the weight (LLaMA,
16-bit: 4 + 2 bytes an element, where the input alone is 2; T5: the input, its fp32 copy and the
normalized tensor).

The ``"fused"`` kernel computes the same values, keeps the input and one fp32 ``rstd`` a row, and
in backward derives the gradients from them (``dx = rstd (g_w - x_hat mean(g_w x_hat))`` with
``x_hat = x rstd`` and ``g_w`` the output's gradient times the weight; the weight's gradient is the
output's gradient times the normalized tensor, summed over rows). On a CUDA device whose torch has
the one-kernel RMSNorm (``torch._fused_rms_norm`` with its backward, torch 2.8 and later), a module
whose weight has its input's dtype runs on it; elsewhere the forward runs the module's own ops
without recording them and the backward the formula above.
``"eager"`` puts the module's own forward back.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoslapo.config import NORM_KERNELS
from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["is_rms_norm", "rms_norm", "rms_norm_kernel"]

_HALF = (torch.float16, torch.bfloat16)


def _normalized(xf: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype,
                llama: bool) -> torch.Tensor:
    """The tensor the weight multiplies, in the dtype the module's own code gives it: LLaMA casts the
    fp32 product back to the input's ``dtype``, T5 to the weight's when that is 16-bit."""
    h = xf * rstd  # fp32 (fp64 for T5's fp64 input)
    if llama:
        return h.to(dtype)
    return h.to(weight.dtype) if weight.dtype in _HALF else h


def _cuda_fused(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.is_cuda and weight.dtype == x.dtype and hasattr(torch, "_fused_rms_norm")
            and hasattr(torch.ops.aten, "_fused_rms_norm_backward"))


def _upcast(x: torch.Tensor, llama: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the tensor the module normalizes, the fp32 one its variance is taken over): LLaMA casts its
    input to fp32 and normalizes that, T5 takes the variance in fp32 and scales its input as it is."""
    xf = x.float()
    return (xf if llama else x), xf


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, llama: bool) -> torch.Tensor:
        if _cuda_fused(x, weight):
            out, rstd = torch._fused_rms_norm(x, [x.shape[-1]], weight, eps)
        else:
            xf, x32 = _upcast(x, llama)
            rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
            out = weight * _normalized(xf, rstd, weight, x.dtype, llama)
        ctx.save_for_backward(x, weight, rstd)
        ctx.llama = llama
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, rstd = ctx.saved_tensors
        if _cuda_fused(x, weight):
            dx, dw = torch.ops.aten._fused_rms_norm_backward(
                grad.contiguous(), x, [x.shape[-1]], rstd, weight, [True, bool(ctx.needs_input_grad[1])])
            return dx, dw, None, None
        xf, _ = _upcast(x, ctx.llama)
        h = _normalized(xf, rstd, weight, x.dtype, ctx.llama)
        dw = (grad * h).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        h_dtype = h.dtype
        del h
        # the normalized tensor's gradient in its own dtype (as autograd hands it back), then fp32;
        # in place from here on: a backward near the step's peak holds two row-sized tensors, not six
        g = (grad * weight).to(h_dtype).to(xf.dtype)
        x_hat = xf * rstd
        dot = (g * x_hat).mean(-1, keepdim=True)
        dx = g.sub_(x_hat.mul_(dot)).mul_(rstd)
        return dx.to(x.dtype), dw, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, llama: bool = True) -> torch.Tensor:
    """``weight * normalize(x)`` as one autograd op keeping ``x`` and ``rstd`` (see the module docstring);
    ``llama``: LLaMA's casts (else T5's)."""
    return _RMSNorm.apply(x, weight, eps, llama)


def is_rms_norm(mod: nn.Module) -> bool:
    """Whether ``mod`` is one of transformers' RMSNorm modules (LLaMA's ``LlamaRMSNorm`` and its kin,
    T5's ``T5LayerNorm``)."""
    name = type(mod).__name__
    return name.endswith("RMSNorm") or name == "T5LayerNorm"


def _eps(mod: nn.Module) -> float:
    for name in ("variance_epsilon", "eps"):
        value = getattr(mod, name, None)
        if isinstance(value, float):
            return value
    raise ScheduleError(f"rms_norm_kernel: {type(mod).__name__} has no epsilon (variance_epsilon or eps); "
                        "apply it to an RMSNorm module (LlamaRMSNorm, T5LayerNorm)")


def _fused_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # bound to the module (``types.MethodType``): a deep copy of the module rebinds it to the copy
    weight = self.weight
    assert isinstance(weight, torch.Tensor)  # checked when the kernel was set
    return rms_norm(hidden_states, weight, _eps(self), llama=type(self).__name__ != "T5LayerNorm")


def rms_norm_kernel(sch: Schedule, kernel: str = "fused") -> None:
    """Run this RMSNorm module with ``kernel``: ``"fused"`` (one autograd op, see the module docstring)
    or ``"eager"`` (its own forward). The module keeps its parameter and hooks; only its forward changes.

    Raises: ScheduleError for another kernel name or a module that is not an RMSNorm."""
    if kernel not in NORM_KERNELS:
        raise ScheduleError(f"norm kernel must be one of {', '.join(NORM_KERNELS)}: got {kernel!r}")
    mod = sch.mod
    weight = getattr(mod, "weight", None)
    if not is_rms_norm(mod) or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        raise ScheduleError(f"rms_norm_kernel needs an RMSNorm module (LlamaRMSNorm, T5LayerNorm): {sch.path!r} "
                            f"is a {type(mod).__name__}; apply it to the family's norms")
    if kernel == "eager":
        mod.__dict__.pop("forward", None)
        sch.meta.pop("norm_kernel", None)
        return
    _eps(mod)  # refuses a module without one now, not at its first call
    mod.forward = types.MethodType(_fused_forward, mod)  # type: ignore[method-assign]
    sch.meta["norm_kernel"] = kernel
