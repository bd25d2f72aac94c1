"""Pipeline parallelism, the primitive: ``cut_pipeline_stage`` marks where one stage ends.

``sch["encoder.layer.1"].cut_pipeline_stage()`` records, in the root's ``meta["pipeline_cuts"]``,
that a stage ends after that child of a ModuleList / nn.Sequential. Building and running the stages
(``torch.distributed.pipelining``) is ``autoslapo.pipeline.build_pipeline``'s job; how a model
family runs as a stack of layers is ``autoslapo.models.adapters``'.

An encoder-decoder runs its two block lists as one: ``sch.join_layer_lists(["encoder.block",
"decoder.block"])`` on the root makes the pipeline's layer list the encoder's blocks, then the
decoder's; cuts may then fall in either list, and after the encoder's last block (between the stacks).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from torch import nn

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = [
    "CUTS_KEY",
    "LISTS_KEY",
    "cut_index",
    "cut_pipeline_stage",
    "join_layer_lists",
    "layer_lists",
    "layer_position",
    "pipeline_cuts",
    "stage_bounds",
]

CUTS_KEY = "pipeline_cuts"
LISTS_KEY = "pipeline_layer_lists"


# -- cut --------------------------------------------------------------------------------------------


def cut_index(node: Schedule) -> int:
    """The position of ``node`` among its parent's children (a cut's layer index)."""
    if node.parent is None:
        raise ScheduleError("the root has no layer index; a pipeline cut is a child of a layer list")
    return list(node.parent.children).index(node.name)


def join_layer_lists(sch: Schedule, paths: list[str] | tuple[str, ...]) -> None:
    """Make the pipeline's layer list the children of ``paths``, one list after another.

    Takes: the root; the paths of two or more ModuleLists / nn.Sequentials in forward order (T5:
    ``["encoder.block", "decoder.block"]``). Records them in ``root.meta["pipeline_layer_lists"]``.
    Raises: ScheduleError on a node other than the root, fewer than two paths, a path that is not a
    ModuleList or nn.Sequential of the model, or cuts recorded already.
    """
    if sch.parent is not None:
        raise ScheduleError(f"join_layer_lists is a primitive of the root: got {sch.path!r}; call it on sch")
    if len(paths) < 2:
        raise ScheduleError(f"join_layer_lists needs two or more layer lists: got {list(paths)}")
    for path in paths:
        if path not in sch or not isinstance(sch[path].mod, nn.ModuleList | nn.Sequential):
            raise ScheduleError(
                f"join_layer_lists needs ModuleLists or nn.Sequentials of the model: {path!r} is "
                f"{type(sch[path].mod).__name__ if path in sch else 'not a submodule'}"
            )
    if sch.meta.get(CUTS_KEY):
        raise ScheduleError(f"join_layer_lists must come before the cuts: cuts {sch.meta[CUTS_KEY]} are recorded")
    sch.meta[LISTS_KEY] = list(paths)


def layer_lists(sch: Schedule) -> list[str]:
    """The paths of the pipeline's layer lists: the joined ones, else the list of the first cut
    (empty without cuts)."""
    root = sch.root()
    if root.meta.get(LISTS_KEY):
        return list(root.meta[LISTS_KEY])
    cuts = root.meta.get(CUTS_KEY, [])
    parent = root[cuts[0]].parent if cuts else None
    return [] if parent is None else [parent.path]


def layer_position(sch: Schedule, path: str) -> int:
    """The index of the layer at ``path`` in the pipeline's layer list (joined lists counted in order)."""
    root = sch.root()
    node = root[path]
    offset = 0
    for lst in root.meta.get(LISTS_KEY) or []:
        if node.parent is not None and node.parent.path == lst:
            break
        offset += len(root[lst].children)
    return offset + cut_index(node)


def cut_pipeline_stage(sch: Schedule) -> None:
    """Mark a pipeline-stage boundary right after the module at ``sch``.

    Takes: a node that is a child (not the last) of an nn.ModuleList or nn.Sequential; every cut of
    one model must lie in the same container, or in the lists :func:`join_layer_lists` joined (then
    the last child of an earlier list may be cut: the boundary between them). Records the path in ``root.meta["pipeline_cuts"]``
    (kept in layer order) and sets ``sch.meta["pipeline_cut"]``.
    Raises: ScheduleError for the root, a child of another kind of module, the last child, a
    second cut at the same place, or cuts in two different containers.
    """
    parent = sch.parent
    if parent is None:
        raise ScheduleError(
            "cut_pipeline_stage needs a child of a ModuleList or nn.Sequential: got the root; "
            "cut after a layer, e.g. sch['encoder.layer.1'].cut_pipeline_stage()"
        )
    if not isinstance(parent.mod, nn.ModuleList | nn.Sequential):
        raise ScheduleError(
            f"cut_pipeline_stage cuts only between children of a ModuleList or nn.Sequential: "
            f"{sch.path!r} is a child of {type(parent.mod).__name__} {parent.path!r}; "
            "cut after one of the layers of the model's layer list instead"
        )
    names = list(parent.children)
    root = sch.root()
    joined: list[str] = root.meta.get(LISTS_KEY) or []
    if joined and parent.path not in joined:
        raise ScheduleError(
            f"all pipeline cuts must lie in the joined layer lists {joined}: {sch.path!r} is in {parent.path!r}"
        )
    if sch.name == names[-1] and (not joined or parent.path == joined[-1]):
        raise ScheduleError(
            f"cut_pipeline_stage after the last child leaves an empty stage: {sch.path!r} is the last of "
            f"{len(names)} children of {parent.path or '<root>'!r}; cut after an earlier one"
        )
    cuts: list[str] = root.meta.setdefault(CUTS_KEY, [])
    if sch.path in cuts:
        raise ScheduleError(f"{sch.path!r} is already a pipeline cut; each boundary is cut once")
    if cuts and not joined:
        other = root[cuts[0]].parent
        if other is not parent:
            raise ScheduleError(
                f"all pipeline cuts must lie in one layer list: {sch.path!r} is in {parent.path or '<root>'!r} "
                f"but earlier cuts are in {other.path if other is not None else '<root>'!r}"
            )
    cuts.append(sch.path)
    cuts.sort(key=lambda p: layer_position(root, p))
    sch.meta["pipeline_cut"] = True


def pipeline_cuts(sch: Schedule) -> list[str]:
    """Return the cut paths recorded on the root of ``sch``, in layer order (empty if none)."""
    return list(sch.root().meta.get(CUTS_KEY, []))


def stage_bounds(num_layers: int, cut_indices: list[int]) -> list[tuple[int, int]]:
    """Split ``range(num_layers)`` after each cut index into ``[start, stop)`` slices.

    Raises: ScheduleError if the cut indices are not increasing and inside ``[0, num_layers - 1)``.
    """
    if any(b <= a for a, b in itertools.pairwise(cut_indices)):
        raise ScheduleError(f"pipeline cuts must be increasing: got layer indices {cut_indices}")
    if cut_indices and (cut_indices[0] < 0 or cut_indices[-1] >= num_layers - 1):
        raise ScheduleError(f"pipeline cuts {cut_indices} do not fit {num_layers} layers")
    starts = [0, *[c + 1 for c in cut_indices]]
    stops = [*[c + 1 for c in cut_indices], num_layers]
    return list(zip(starts, stops, strict=True))
