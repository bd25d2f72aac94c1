"""``annotate``: attach a key/value to a parameter (read by later passes: optimizers, ZeRO, pipeline)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

ANNOTATIONS_ATTR = "_autoslapo_annotations"


def annotate(sch: Schedule, param_name: str, key: str, value: Any) -> None:
    """Record ``key=value`` on parameter ``param_name`` of this module.

    Stored both on the parameter (``param._autoslapo_annotations``, survives ``shard``) and in
    ``sch.meta["annotations"][param_name]`` (survives ``build`` re-creating the parameter).
    Raises: ScheduleError for an unknown parameter.
    """
    params = dict(sch.mod.named_parameters(recurse=False))
    if param_name not in params:
        raise ScheduleError(
            f"annotate: {type(sch.mod).__name__} at {sch.path or '<root>'!r} has no parameter "
            f"{param_name!r}; its own parameters: {', '.join(params) or 'none'}"
        )
    p = params[param_name]
    notes = getattr(p, ANNOTATIONS_ATTR, None)
    if notes is None:
        notes = {}
        setattr(p, ANNOTATIONS_ATTR, notes)
    notes[key] = value
    sch.meta.setdefault("annotations", {}).setdefault(param_name, {})[key] = value


def get_annotations(sch: Schedule, param_name: str) -> dict[str, Any]:
    """Return the annotations recorded for ``param_name`` on this node (empty dict if none)."""
    return dict(sch.meta.get("annotations", {}).get(param_name, {}))
