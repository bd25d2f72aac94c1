"""``channels_last``: run a module's convolutions on channels-last (NHWC) feature maps.

A 4-D feature map is stored NCHW by default. cuDNN's tensor-core convolutions (16-bit, and TF32 for
fp32 on Ampere and later) read and write NHWC, so on NCHW tensors each convolution's input and output
are transposed around it (NVIDIA's "Convolutional Layers User's Guide", tensor layouts; PyTorch's
"Channels Last Memory Format" tutorial). The layout changes no value: the same sums in another order.

PyTorch gives a convolution's output the layout of its input (or of its weight, when that one is
channels-last), and BatchNorm, ReLU, pooling and additions keep their input's, so a feature map made
channels-last at a block's entry stays so through it. The primitive converts the module's 4-D
parameters (convolution weights) in place and the 4-D inputs of its forward; both, because an engine
may replace the parameters' storage later (DeepSpeed's ZeRO flattens them into NCHW buffers) and a
pipeline stage receives NCHW tensors (a point-to-point send needs a contiguous tensor, which is why
``contiguous_output`` hands a stage's last block's output back in NCHW, and an input converted here
gets its gradient back in NCHW).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

CHANNELS_LAST = torch.channels_last


class _ToNHWC(torch.autograd.Function):
    """An NCHW tensor as NHWC; its gradient handed back in NCHW, the layout of the tensor it is for
    (a pipeline stage sends its input's gradient, and a send needs a contiguous tensor)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=CHANNELS_LAST)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _to_nhwc(value: Any) -> Any:
    if (isinstance(value, torch.Tensor) and value.dim() == 4 and value.is_floating_point()
            and not value.is_contiguous(memory_format=CHANNELS_LAST)):
        return _ToNHWC.apply(value)
    return value


def _nhwc_inputs(_mod: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_to_nhwc(a) for a in args)


def _nchw_output(_mod: torch.nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
    return out.contiguous() if isinstance(out, torch.Tensor) and out.dim() == 4 else out


def channels_last(sch: Schedule, *, contiguous_output: bool = False) -> None:
    """Keep this module's feature maps channels-last: its 4-D parameters (and those of everything
    under it) are converted in place, and each 4-D floating-point positional input of its forward
    is converted before it runs. ``contiguous_output``: return a 4-D output in the default NCHW
    layout (what a pipeline stage's last block sends). Applying it twice changes nothing more."""
    mod = sch.mod
    with torch.no_grad():
        for p in mod.parameters():
            if p.dim() == 4 and not p.is_contiguous(memory_format=CHANNELS_LAST):
                p.data = p.data.contiguous(memory_format=CHANNELS_LAST)
    done = sch.meta.setdefault("channels_last", {})
    if not done.get("inputs"):
        mod.register_forward_pre_hook(_nhwc_inputs)
        done["inputs"] = True
    if contiguous_output and not done.get("contiguous_output"):
        mod.register_forward_hook(_nchw_output)
        done["contiguous_output"] = True
