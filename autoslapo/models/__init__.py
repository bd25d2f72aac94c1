"""Model families and size presets (``ModelSpec``)."""

from __future__ import annotations

from autoslapo.models.spec import FAMILIES, PRESETS, ModelSpec, list_presets

__all__ = ["FAMILIES", "PRESETS", "ModelSpec", "list_presets"]
