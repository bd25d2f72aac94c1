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
    "ScheduleConfig": "autoslapo.config",
    "ClusterSpec": "autoslapo.cluster",
    "ModelSpec": "autoslapo.models.spec",
    "FamilyDescription": "autoslapo.models.families",
    "TrialResult": "autoslapo.result",
    "apply_schedule": "autoslapo.plan",
    "build_model": "autoslapo.models.build",
    "estimate": "autoslapo.cost",
    "run_trial": "autoslapo.runtime",
    "best": "autoslapo.api",
    "best_trial": "autoslapo.api",
    "apply_best": "autoslapo.api",
    "TrainingJob": "autoslapo.api",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from autoslapo.api import TrainingJob as TrainingJob
    from autoslapo.api import apply_best as apply_best
    from autoslapo.api import best as best
    from autoslapo.api import best_trial as best_trial
    from autoslapo.build import build as build
    from autoslapo.cluster import ClusterSpec as ClusterSpec
    from autoslapo.config import ScheduleConfig as ScheduleConfig
    from autoslapo.cost.estimate import estimate as estimate
    from autoslapo.models.build import build_model as build_model
    from autoslapo.models.families import FamilyDescription as FamilyDescription
    from autoslapo.models.spec import ModelSpec as ModelSpec
    from autoslapo.plan import apply_schedule as apply_schedule
    from autoslapo.result import TrialResult as TrialResult
    from autoslapo.runtime import run_trial as run_trial
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
