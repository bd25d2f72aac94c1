"""WideResNet (Zagoruyko and Komodakis, 2016), written in autoslapo: torchvision's ``wide_resnet50_2``
architecture without torchvision (its wheel does not load beside the pinned CPU torch).

ResNet-50's bottleneck blocks ``[3, 4, 6, 3]`` (He et al., 2016) whose inner width is ``64 * k``
per group times the stage's multiplier (torchvision's ``width_per_group = 64 * k``): conv1 1x1 ->
bn1 -> ReLU -> conv2 3x3 (stride 2 at the first block of stages 2-4) -> bn2 -> ReLU -> conv3 1x1
(4x the stage's base width) -> bn3, plus the identity (or a 1x1 conv + BN downsample) and a ReLU.
Stem: 7x7/2 conv, BN, ReLU, 3x3/2 max-pool; head: global average pool and a linear classifier.
Parameter count and layer order equal torchvision's (``wide_resnet50_2``: 68,883,240); the blocks
sit in one ``blocks`` ModuleList (torchvision nests them in ``layer1``..``layer4``) so the schedule
checkpoints them by ratio. ``forward(images, labels)`` returns the cross-entropy loss.

Tensor parallelism (``shard_bottleneck``) shards each block's inner channels: conv1's output
channels with bn1 (its weight, bias and running statistics), conv2's input channels; conv2's partial
sums are all-reduced, and conv1's input gradient too (the block's input is replicated). BatchNorm
normalises each channel over (batch, height, width), so a channel shard is exact.

Used through the model files in ``autoslapo/models/zoo`` (``wideresnet-tiny``, ``wideresnet-50``,
``wideresnet-50-4``), which the CLI resolves like a user's own model file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["Bottleneck", "WideResNet", "entry_points", "shard_bottleneck", "wideresnet_params"]

EXPANSION = 4


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (the stride on the 3x3 conv, as ResNet v1.5)."""

    def __init__(self, inplanes: int, planes: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * EXPANSION, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * EXPANSION)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes * EXPANSION:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * EXPANSION, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes * EXPANSION))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class WideResNet(nn.Module):
    """A wide ResNet with bottleneck blocks; ``width_factor`` k widens every block's inner channels."""

    def __init__(self, depths: Sequence[int] = (3, 4, 6, 3), width_factor: int = 2, classes: int = 1000,
                 base: int = 64) -> None:
        super().__init__()
        width_per_group = base * width_factor
        self.conv1 = nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        blocks: list[nn.Module] = []
        inplanes = base
        for stage, depth in enumerate(depths):
            planes = base * 2**stage
            width = planes * width_per_group // base
            for i in range(depth):
                blocks.append(Bottleneck(inplanes, planes, width, stride=2 if stage and i == 0 else 1))
                inplanes = planes * EXPANSION
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(inplanes, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        for block in self.blocks:
            x = block(x)
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits, labels)


def wideresnet_params(depths: Sequence[int] = (3, 4, 6, 3), width_factor: int = 2, classes: int = 1000,
                      base: int = 64) -> int:
    """Parameters of ``WideResNet(depths, width_factor, classes)``, counted from the shapes (pure)."""
    n = 3 * base * 49 + 2 * base  # stem conv + bn
    inplanes = base
    for stage, depth in enumerate(depths):
        planes = base * 2**stage
        width = planes * width_factor
        out = planes * EXPANSION
        for i in range(depth):
            n += inplanes * width + 2 * width + 9 * width * width + 2 * width + width * out + 2 * out
            if i == 0 and (stage or inplanes != out):
                n += inplanes * out + 2 * out
            inplanes = out
    return n + inplanes * classes + classes


def _shard_buffers(bn: nn.BatchNorm2d, tp: int, rank: int) -> None:
    for name in ("running_mean", "running_var"):
        buf = bn._buffers[name]
        assert buf is not None
        bn._buffers[name] = buf.chunk(tp)[rank].clone()
    bn.num_features //= tp


def shard_bottleneck(block: Schedule) -> None:
    """Tensor parallelism of one ``Bottleneck`` node over its schedule's group (see the module docstring).

    Raises: ScheduleError (from ``shard``) when the group size does not divide the inner width.
    """
    import torch.distributed as dist

    tp = block.group_size
    rank = dist.get_rank(block.group) if tp > 1 else 0
    block["conv1"].shard("weight", 0)
    block["bn1"].shard("weight", 0)
    block["bn1"].shard("bias", 0)
    _shard_buffers(block["bn1"].mod, tp, rank)  # type: ignore[arg-type]
    block["conv2"].shard("weight", 1)
    conv1, conv2 = block["conv1"].mod, block["conv2"].mod
    assert isinstance(conv1, nn.Conv2d) and isinstance(conv2, nn.Conv2d)
    conv1.out_channels //= tp
    conv2.in_channels //= tp
    block["conv1"].sync("bwd_post", "all_reduce")  # the block's input is replicated: sum its gradient
    block["conv2"].sync("fwd_post", "all_reduce")  # partial sums over the input-channel shards


def entry_points(*, width_factor: int, depths: Sequence[int] = (3, 4, 6, 3), classes: int = 1000,
                 image_size: int = 224, base: int = 64) -> dict[str, Any]:
    """The names a model file defines for one WideResNet size: build, batch, layers, shard_block, tp_divisor.

    ``batch(micro_batch, seed)``: ``images`` (N, 3, image_size, image_size) from a normal
    distribution and ``labels`` (N,) uniform over the classes.
    """
    def build() -> nn.Module:
        return WideResNet(depths, width_factor, classes, base)

    def batch(micro_batch: int, seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        images = torch.randn(micro_batch, 3, image_size, image_size, generator=gen)
        return {"images": images, "labels": torch.randint(0, classes, (micro_batch,), generator=gen)}

    shard: Callable[[Schedule], None] = shard_bottleneck
    return {"build": build, "batch": batch, "layers": "blocks", "shard_block": shard,
            "tp_divisor": math.gcd(*(base * 2**s * width_factor for s in range(len(depths))))}
