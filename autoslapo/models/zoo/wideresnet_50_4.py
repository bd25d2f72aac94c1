"""wideresnet-50-4: WideResNet-50 at width factor 4 (blocks [3, 4, 6, 3], 224x224 ImageNet)."""

from autoslapo.models.wideresnet import entry_points

globals().update(entry_points(width_factor=4))
