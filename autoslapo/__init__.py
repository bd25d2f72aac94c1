"""autoslapo: find the fastest training schedule for a model on a cluster, and remember it.

Public names are re-exported lazily from their modules, so ``import autoslapo`` (and the CLI) does
not load torch or transformers until one of them is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it. Keep this a plain list of re-exports.
_EXPORTS: dict[str, str] = {
    "Schedule": "autoslapo.schedule",
    "create_schedule": "autoslapo.schedule",
    "list_primitives": "autoslapo.schedule",
    "register_primitive": "autoslapo.schedule",
    "build": "autoslapo.build",
    "Verify": "autoslapo.verify",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from autoslapo.build import build as build
    from autoslapo.schedule import Schedule as Schedule
    from autoslapo.schedule import create_schedule as create_schedule
    from autoslapo.schedule import list_primitives as list_primitives
    from autoslapo.schedule import register_primitive as register_primitive
    from autoslapo.verify import Verify as Verify


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autoslapo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
