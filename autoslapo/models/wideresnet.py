"""WideResNet (Zagoruyko & Komodakis 2016) as torchvision writes it, in the project.

torchvision's wheel does not load beside the pinned CPU torch, so the architecture is written here:
the same layers, shapes, initialization and parameter count as ``torchvision.models.wide_resnet50_2``
(68,883,240 parameters for 1000 classes; a test pins it), with two differences that only rename
things: the 16 bottleneck blocks sit in one flat ``blocks`` list (torchvision's ``layer{s}.{j}``
is ``blocks.{k}``, in the same order) so that a schedule addresses them like transformer layers,
and the stem (``conv1``, ``bn1``, ReLU, max-pool) is one ``stem`` module.

How a ``ModelSpec`` of the ``wideresnet`` family reads as a WideResNet (see ``stage_shapes``):
``hidden`` is the first stage's output channels (256 in ResNet-50; the stem has ``hidden/4``),
``ffn`` the first stage's bottleneck width (``hidden/4 x`` the width factor: 128 for
wide_resnet50_2), each later stage doubling both; ``layers`` the number of blocks (16: [3, 4, 6, 3]
per stage, see ``autoslapo.models.wrn_shape``); ``seq_len`` the image side in pixels; ``vocab`` the classes;
``heads`` is 1 (no attention).

The forward takes ``images`` (N x 3 x H x W floats) and optional ``labels`` (N int64 classes) and
returns ``loss`` (cross-entropy, when labels are given) and ``logits``, as a transformers image
classifier does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import ImageClassifierOutputWithNoAttention

from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.models.wrn_shape import EXPANSION, stage_blocks

__all__ = ["Bottleneck", "WideResNet", "stage_shapes"]

def stage_shapes(spec: ModelSpec) -> list[tuple[int, int, int]]:
    """``(blocks, bottleneck width, output channels)`` of each stage of ``spec``'s WideResNet."""
    return [(n, spec.ffn * 2**s, spec.hidden * 2**s) for s, n in enumerate(stage_blocks(spec.layers))]


class Bottleneck(nn.Module):
    """torchvision's ``Bottleneck`` (ResNet V1.5: the stride sits on the 3x3 convolution).

    1x1 ``conv1`` to ``width`` channels, ``bn1``, ReLU; 3x3 ``conv2`` (``stride``), ``bn2``, ReLU;
    1x1 ``conv3`` to ``out`` channels, ``bn3``; plus the shortcut (``downsample``: a strided 1x1
    convolution and a BatchNorm when the shape changes), then ReLU.
    """

    def __init__(self, inplanes: int, width: int, out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Not in place: a tensor-parallel schedule hooks conv2's output, and checkpointing replays.
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(h + shortcut)


class Stem(nn.Module):
    """The 7x7/2 convolution, BatchNorm, ReLU and 3x3/2 max-pool before the first stage."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.maxpool(F.relu(self.bn1(self.conv1(images))))


class WideResNet(nn.Module):
    """A WideResNet of ``spec``'s shape (``wideresnet-50-2`` is torchvision's ``wide_resnet50_2``).

    Modules: ``stem``, ``blocks`` (every Bottleneck, in order), ``fc`` (the classifier after global
    average pooling). ``forward(images, labels=None)`` returns ``loss`` and ``logits``.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if spec.family != "wideresnet":
            raise ConfigError(f"WideResNet builds the wideresnet family: got {spec.family!r}")
        self.spec = spec
        stem = spec.hidden // EXPANSION
        self.stem = Stem(stem)
        blocks: list[nn.Module] = []
        inplanes = stem
        for s, (n, width, out) in enumerate(stage_shapes(spec)):
            for j in range(n):
                blocks.append(Bottleneck(inplanes, width, out, stride=2 if (s > 0 and j == 0) else 1))
                inplanes = out
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(inplanes, spec.vocab)
        for m in self.modules():
            self._init_weights(m)

    def _init_weights(self, module: nn.Module) -> None:
        # torchvision's: Kaiming-normal (fan out) convolutions, BatchNorm at 1 and 0, the Linear's own.
        # ``autoslapo.build.materialize`` calls it module by module on full-size tensors.
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d | nn.Linear):
            module.reset_parameters()

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None
                ) -> ImageClassifierOutputWithNoAttention:
        # float32 batches feed a model built in another dtype (float64 checks, 16-bit weights)
        h = self.stem(images.to(self.stem.conv1.weight.dtype))
        for block in self.blocks:
            h = block(h)
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))
        loss = None if labels is None else F.cross_entropy(logits.float(), labels)
        return ImageClassifierOutputWithNoAttention(loss=loss, logits=logits)
