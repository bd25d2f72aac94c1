"""``replace``: swap the module at a node for another, keeping its path in the tree."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import nn

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule


def replace(sch: Schedule, new_module: nn.Module) -> Schedule:
    """Put ``new_module`` where this node's module was (same path, same train/eval mode).

    Takes: the replacement module. Returns: this node, now scheduling ``new_module`` (its children
    are rebuilt; ``meta`` is kept and gains ``"replaced": <old class name>``).
    Raises: ScheduleError if ``new_module`` is not an nn.Module.
    """
    if not isinstance(new_module, nn.Module):
        raise ScheduleError(f"replace needs an nn.Module: got {type(new_module).__name__}")
    old = sch.mod
    new_module.train(old.training)
    if sch.parent is not None:
        # setattr on the parent keeps ModuleList/Sequential indexing ("0", "1", ...) working.
        setattr(sch.parent.mod, sch.name, new_module)
    sch.mod = new_module
    sch.meta["replaced"] = type(old).__name__
    sch.refresh()
    return sch


def replace_all(
    sch: Schedule, module_type: type[nn.Module], factory: Callable[[nn.Module], nn.Module]
) -> list[str]:
    """Replace every module of ``module_type`` under this node with ``factory(old_module)``.

    The node itself is not replaced, and the new modules are not searched again.
    Returns: the paths replaced, in tree order. Raises: ScheduleError if ``factory`` returns
    something that is not an nn.Module.
    """
    targets = [node for path, node in sch.named_schedules() if node is not sch and isinstance(node.mod, module_type)]
    done: list[str] = []
    replaced_ids: set[int] = set()
    for node in targets:
        # Skip modules nested inside one already replaced (their node left the tree).
        anc = node.parent
        skip = False
        while anc is not None and anc is not sch:
            if id(anc) in replaced_ids:
                skip = True
                break
            anc = anc.parent
        if skip:
            continue
        replace(node, factory(node.mod))
        replaced_ids.add(id(node))
        done.append(node.path)
    return done
