"""wideresnet-50: torchvision's wide_resnet50_2 (blocks [3, 4, 6, 3], k=2, 224x224 ImageNet), 68,883,240 parameters."""

from autoslapo.models.wideresnet import entry_points

globals().update(entry_points(width_factor=2))
