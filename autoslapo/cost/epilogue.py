"""What a training step does to every parameter besides the layers' own kernels. Pure.

The three step-time models (transformers in ``autoslapo.cost.time``, convolutional networks in
``autoslapo.cost.conv``, a model file's trace in ``autoslapo.cost.user_time``) price these alike,
each as memory-bound passes over one device's parameters (``mem``: ``_Rates.mem``, seconds of
``kernels`` kernels moving ``nbytes``):

- **Gradient accumulation.** With more than one micro-batch a step, autograd adds each micro-batch's
  weight gradient into ``.grad``: a read of the new gradient, a read and a write of the sum.
- **The fp16 loss scaler of autoslapo's runtime** (``autoslapo.runtime.scaler``). A hook on every
  parameter runs on each gradient as it is produced, every micro-batch: ``isfinite`` (reads the
  fp32 gradient, writes a byte mask), a logical not of the mask, ``any`` over it, a cast and an add
  into the overflow flag, and the multiply by ``1 / S`` (reads and writes the gradient): 16 bytes a
  parameter in six kernels a parameter tensor. torch's GradScaler (and Megatron's) unscale once a
  step in fused multi-tensor kernels instead, which the published stacks' optimizer term covers;
  the hooks are what autoslapo's runtime does so that gradients ZeRO-2/3 or a pipeline's owners
  move before the end of backward are unscaled too.
- **The optimizer step.** Adam (or LAMB) reads and writes its fp32 state, the master weights and
  the gradient of each parameter on this device: 28 bytes a parameter in fp32 (weights, gradient,
  two moments, read and written), 32 with 16-bit weights to write back as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from autoslapo.cost.device import is_autoslapo_runtime

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec

__all__ = [
    "SCALER_BYTES_PER_PARAM",
    "SCALER_KERNELS_PER_TENSOR",
    "accumulation_s",
    "layer_tensors",
    "loss_scaler_kernels",
    "loss_scaler_s",
    "optimizer_s",
    "weight_modules",
]

Mem = Callable[[float, int], float]

SCALER_BYTES_PER_PARAM = (4 + 1) + (1 + 1) + 1 + (4 + 4)  # isfinite (read, mask), not (read, write), any, multiply
SCALER_KERNELS_PER_TENSOR = 6  # isfinite, not, any, cast, add, mul


def accumulation_s(mem: Mem, params: float, grad_bytes: int, micro_batches: int) -> float:
    """Seconds a micro-batch spends adding its weight gradients into ``.grad`` (none with one)."""
    return mem(params * grad_bytes * 3, 1) if micro_batches > 1 else 0.0


def loss_scaler_kernels(config: ScheduleConfig, runtime: str, tensors: int) -> int:
    """Kernels the loss scaler's hooks launch a micro-batch over ``tensors`` parameter tensors: none
    but in autoslapo's runtime with fp16."""
    if config.precision != "fp16" or not is_autoslapo_runtime(runtime):
        return 0
    return SCALER_KERNELS_PER_TENSOR * max(tensors, 1)


def loss_scaler_s(mem: Mem, config: ScheduleConfig, runtime: str, params: float, tensors: int) -> float:
    """Seconds a micro-batch spends in the loss scaler's hooks over this device's ``params`` (in
    ``tensors`` tensors); 0 without them."""
    kernels = loss_scaler_kernels(config, runtime, tensors)
    return mem(params * SCALER_BYTES_PER_PARAM, kernels) if kernels else 0.0


def optimizer_s(mem: Mem, config: ScheduleConfig, params: float) -> float:
    """Seconds of the optimizer step over ``params`` (this device's, after ZeRO partitioning)."""
    return mem(params * (28 if config.precision == "fp32" else 32), 4)


def weight_modules(model: ModelSpec) -> int:
    """Modules holding a weight matrix in one transformer layer: q, k, v, out, and the MLP's (2, or 3 gated)."""
    return 4 + (3 if model.gated_mlp else 2)


def layer_tensors(model: ModelSpec) -> int:
    """Parameter tensors of one transformer layer: its weight matrices; with LayerNorm a bias for
    each and two norms' weight and bias; gated (LLaMA), no biases and two RMSNorm weights."""
    weights = weight_modules(model)
    return weights + 2 if model.gated_mlp else 2 * weights + 4
