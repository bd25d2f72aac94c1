"""Model families and size presets (``ModelSpec``)."""

from __future__ import annotations

from autoslapo.models.build import build_model, example_batch
from autoslapo.models.families import FamilyDescription, get_family, list_families
from autoslapo.models.spec import FAMILIES, PRESETS, ModelSpec, list_presets

__all__ = [
    "FAMILIES",
    "PRESETS",
    "FamilyDescription",
    "ModelSpec",
    "build_model",
    "example_batch",
    "get_family",
    "list_families",
    "list_presets",
]
