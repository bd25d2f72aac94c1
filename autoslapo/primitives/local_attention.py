"""The attention kernel of models whose attention modules keep their own (local) masks: GPT-Neo.

transformers' GPT-Neo attention (``GPTNeoSelfAttention``) has only an eager and a FlashAttention-2
path, and the latter ignores the local layers' window. Each module keeps its mask as a boolean
buffer ``bias`` (causal for global layers, a causal band of ``window_size`` for local ones) and
computes ``softmax(where(mask, q k^T, min) + attention_mask) v`` without a ``1/sqrt(d)`` scale in
``_attn``. ``apply_local_attention_kernel(model, "sdpa")`` swaps that method, on each instance,
for one ``F.scaled_dot_product_attention`` call with the same mask and ``scale=1``; "eager" puts the
original back. Sharding heads (tensor parallelism) leaves the masks valid: they do not depend on
the head count.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from autoslapo.errors import ScheduleError

__all__ = ["LOCAL_ATTENTION_MODEL_TYPES", "apply_local_attention_kernel", "local_attention_modules"]

#: HF ``config.model_type`` values whose attention modules this module handles.
LOCAL_ATTENTION_MODEL_TYPES = ("gpt_neo",)


def local_attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention modules of ``model`` that keep a mask buffer ``bias`` and compute in ``_attn``."""
    return [m for m in model.modules()
            if hasattr(m, "attention_type") and hasattr(m, "_attn") and isinstance(getattr(m, "bias", None),
                                                                                   torch.Tensor)]


def _sdpa_attn(self: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
    q_len, k_len = query.size(-2), key.size(-2)
    allowed = self.bias[:, :, k_len - q_len:k_len, :k_len]
    mask: torch.Tensor = allowed
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            mask = allowed & attention_mask
        else:
            low = torch.finfo(attention_mask.dtype).min
            mask = attention_mask.masked_fill(~allowed, low).to(query.dtype)
    p = float(self.attn_dropout.p) if self.training else 0.0
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=p, scale=1.0)
    return out, None


def apply_local_attention_kernel(model: nn.Module, impl: str) -> int:
    """Run ``model``'s local-mask attention modules with kernel ``impl`` ("eager" or "sdpa").

    Returns: how many modules were set. Raises: ScheduleError for "flash" (it cannot apply the
    local layers' window), another name, or a model without such modules.
    """
    if impl not in ("eager", "sdpa"):
        raise ScheduleError(
            f"attention kernel {impl!r} cannot apply local (windowed) attention masks in "
            f"{type(model).__name__}; use sdpa or eager"
        )
    mods = local_attention_modules(model)
    if not mods:
        raise ScheduleError(
            f"{type(model).__name__} has no attention module with a mask buffer 'bias' and an '_attn' "
            "method; this kernel switch is for GPT-Neo-style models"
        )
    for m in mods:
        m.__dict__.pop("_attn", None)  # back to the class's eager method
        if impl == "sdpa":
            m.__dict__["_attn"] = types.MethodType(_sdpa_attn, m)
    return len(mods)
