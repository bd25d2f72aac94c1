"""Pipeline parallelism, the primitive: ``cut_pipeline_stage`` marks where one stage ends.

``sch["encoder.layer.1"].cut_pipeline_stage()`` records, in the root's ``meta["pipeline_cuts"]``,
that a stage ends after that child of a ModuleList / nn.Sequential. A cut after the list's last
child leaves the last stage only the head (the final norm, the logits and the loss), and
``sch["encoder.layer.0"].cut_pipeline_stage(before=True)`` (recorded in ``meta["pipeline_cut_before"]``)
leaves the first stage only the embeddings: Llama 3 405B's pipeline does both, its 126 layers in
16 x 8 chunks (Dubey et al. 2024, section 3.3.2). A layer list that runs its one
child N times per forward (ALBERT's shared layer) is cut over the calls instead:
``sch["...albert_layers.0"].cut_pipeline_stage(call=5, calls=12)`` ends a stage after call 5 of 12
(recorded as a :class:`CallCuts` in ``meta["pipeline_call_cuts"]``); :func:`layer_cuts` reads either
kind as one :class:`LayerCuts`. Building and running the stages
(``torch.distributed.pipelining``) is ``autoslapo.pipeline.build_pipeline``'s job; how a model
family runs as a stack of layers is ``autoslapo.models.adapters``'.

An encoder-decoder runs its two block lists as one: ``sch.join_layer_lists(["encoder.block",
"decoder.block"])`` on the root makes the pipeline's layer list the encoder's blocks, then the
decoder's; cuts may then fall in either list, and after the encoder's last block (between the stacks).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = [
    "BEFORE_KEY",
    "CALL_CUTS_KEY",
    "CUTS_KEY",
    "LISTS_KEY",
    "CallCuts",
    "LayerCuts",
    "cut_index",
    "cut_pipeline_stage",
    "join_layer_lists",
    "layer_cuts",
    "layer_lists",
    "layer_position",
    "pipeline_cuts",
    "stage_bounds",
]

CUTS_KEY = "pipeline_cuts"
BEFORE_KEY = "pipeline_cut_before"
LISTS_KEY = "pipeline_layer_lists"
CALL_CUTS_KEY = "pipeline_call_cuts"


@dataclass(frozen=True)
class CallCuts:
    """Pipeline cuts over the calls of one module that a layer list runs ``calls`` times per forward.

    ``path``: that module (the only child of its layer list); ``after``: the call indices (0-based,
    increasing, each below ``calls - 1``) after which a stage ends.
    """

    path: str
    calls: int
    after: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.calls < 2:
            raise ScheduleError(f"a layer list cut over calls runs its module >= 2 times: got calls={self.calls}")
        if any(b <= a for a, b in itertools.pairwise(self.after)) or any(
            not 0 <= c < self.calls - 1 for c in self.after
        ):
            raise ScheduleError(
                f"call cuts must be increasing and in 0..calls-2: got {list(self.after)} for calls={self.calls} "
                f"at {self.path!r}"
            )


@dataclass(frozen=True)
class LayerCuts:
    """The pipeline's layer list as the stages see it: the module path each position runs, and the cuts.

    ``parent``: the layer list's path; ``layers``: one path a position, in order (its children for a
    plain list; its one child repeated for a list of calls); ``cuts``: positions after which a stage
    ends (-1: before the first layer, a first stage of embeddings only; the last position: a last
    stage of the head only); ``shared``: whether positions repeat one module (stages then hold the
    same module).
    """

    parent: str
    layers: tuple[str, ...]
    cuts: tuple[int, ...]
    shared: bool = False




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
    cuts = [*root.meta.get(CUTS_KEY, []), *([root.meta[BEFORE_KEY]] if root.meta.get(BEFORE_KEY) else [])]
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


def cut_pipeline_stage(sch: Schedule, *, before: bool = False, call: int | None = None,
                       calls: int | None = None) -> None:
    """Mark a pipeline-stage boundary right after the module at ``sch`` (or after one of its calls).

    Takes: a node that is a child of an nn.ModuleList or nn.Sequential; every cut of one model must
    lie in the same container, or in the lists :func:`join_layer_lists` joined (then the last child
    of an earlier list may be cut: the boundary between them). A cut after the last child leaves
    the last stage only what follows the list (the head). Records the path in
    ``root.meta["pipeline_cuts"]`` (kept in layer order) and sets ``sch.meta["pipeline_cut"]``.
    With ``before``: the boundary is before the node, which must be the list's first child, so the
    first stage holds only what precedes the list (the embeddings); recorded in
    ``root.meta["pipeline_cut_before"]``.
    Raises: ScheduleError for the root, a child of another kind of module, ``before`` on a child
    other than the first, a second cut at the same place, or cuts in two different containers.
    With ``call`` and ``calls``: the node is the only child of a layer list that runs it ``calls``
    times per forward (a shared layer), and the stage ends after call ``call`` (0-based); recorded
    as a :class:`CallCuts`.
    """
    if call is not None or calls is not None:
        if before:
            raise ScheduleError(f"{sch.path!r}: a cut over calls ends a stage after a call; drop before=True")
        _cut_call(sch, call, calls)
        return
    if CALL_CUTS_KEY in sch.root().meta:
        raise ScheduleError(f"{sch.path!r}: this model is already cut over calls of one module; cut with call=")
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
    if joined and (before or (sch.name == names[-1] and parent.path == joined[-1])):
        raise ScheduleError(
            f"cut_pipeline_stage {'before the first' if before else 'after the last'} block of joined layer lists "
            f"leaves a stage without blocks: {sch.path!r}; an encoder-decoder's end stages hold blocks, cut "
            "between blocks"
        )
    if before:
        if sch.name != names[0]:
            raise ScheduleError(
                f"cut_pipeline_stage(before=True) cuts before the first layer only (a first stage of embeddings): "
                f"{sch.path!r} is child {names.index(sch.name)} of {parent.path or '<root>'!r}; cut after "
                f"{parent.children[names[max(names.index(sch.name) - 1, 0)]].path!r} instead"
            )
        if root.meta.get(BEFORE_KEY):
            raise ScheduleError(f"{sch.path!r} is already cut before; each boundary is cut once")
    cuts: list[str] = root.meta.setdefault(CUTS_KEY, [])
    if not before and sch.path in cuts:
        raise ScheduleError(f"{sch.path!r} is already a pipeline cut; each boundary is cut once")
    others = [*cuts, *([root.meta[BEFORE_KEY]] if root.meta.get(BEFORE_KEY) else [])]
    if others and not joined:
        other = root[others[0]].parent
        if other is not parent:
            raise ScheduleError(
                f"all pipeline cuts must lie in one layer list: {sch.path!r} is in {parent.path or '<root>'!r} "
                f"but earlier cuts are in {other.path if other is not None else '<root>'!r}"
            )
    if before:
        root.meta[BEFORE_KEY] = sch.path
    else:
        cuts.append(sch.path)
        cuts.sort(key=lambda p: layer_position(root, p))
    sch.meta["pipeline_cut"] = True


def _cut_call(sch: Schedule, call: int | None, calls: int | None) -> None:
    if call is None or calls is None:
        raise ScheduleError(
            f"a cut over calls needs both call and calls: got call={call}, calls={calls} at {sch.path!r}"
        )
    parent = sch.parent
    if parent is None or not isinstance(parent.mod, nn.ModuleList | nn.Sequential) or len(parent.children) != 1:
        where = "the root" if parent is None else f"one of {len(parent.children)} children of {parent.path!r}"
        raise ScheduleError(
            f"a cut over calls needs the only child of a ModuleList or nn.Sequential: {sch.path!r} is {where}; "
            "cut a layer list of several layers without call="
        )
    root = sch.root()
    if root.meta.get(CUTS_KEY):
        raise ScheduleError(f"{sch.path!r}: this model is already cut between layers; cut without call=")
    old: CallCuts | None = root.meta.get(CALL_CUTS_KEY)
    if old is not None and (old.path != sch.path or old.calls != calls):
        raise ScheduleError(
            f"all call cuts must name one module and call count: got {sch.path!r} x {calls} after "
            f"{old.path!r} x {old.calls}"
        )
    after = () if old is None else old.after
    if call in after:
        raise ScheduleError(f"call {call} of {sch.path!r} is already a pipeline cut; each boundary is cut once")
    if not 0 <= call < calls - 1:
        raise ScheduleError(
            f"cut_pipeline_stage after call {call} of {calls} leaves an empty stage or none: use a call in "
            f"0..{calls - 2} of {sch.path!r}"
        )
    root.meta[CALL_CUTS_KEY] = CallCuts(sch.path, calls, tuple(sorted({*after, call})))
    sch.meta["pipeline_cut"] = True


def layer_cuts(sch: Schedule) -> LayerCuts | None:
    """The recorded cuts of the model under ``sch`` as a :class:`LayerCuts`, or None when there are none."""
    root = sch.root()
    by_call: CallCuts | None = root.meta.get(CALL_CUTS_KEY)
    if by_call is not None:
        parent = root[by_call.path].parent
        assert parent is not None  # _cut_call checked it
        return LayerCuts(parent.path, (by_call.path,) * by_call.calls, by_call.after, shared=True)
    cuts = pipeline_cuts(root)
    before = root.meta.get(BEFORE_KEY)
    if not cuts and not before:
        return None
    lists = layer_lists(root)  # one list, or the lists join_layer_lists joined (in order)
    layers = tuple(node.path for lst in lists for _, node in root[lst].children.items())
    return LayerCuts(lists[0], layers, (*([-1] if before else []), *(layer_position(root, c) for c in cuts)))


def pipeline_cuts(sch: Schedule) -> list[str]:
    """Return the cut paths recorded on the root of ``sch``, in layer order (empty if none)."""
    return list(sch.root().meta.get(CUTS_KEY, []))


def stage_bounds(num_layers: int, cut_indices: list[int]) -> list[tuple[int, int]]:
    """Split ``range(num_layers)`` after each cut index into ``[start, stop)`` slices (-1: before the
    first layer, an empty first slice; ``num_layers - 1``: after the last, an empty last slice).

    Raises: ScheduleError if the cut indices are not increasing and inside ``[-1, num_layers - 1]``.
    """
    if any(b <= a for a, b in itertools.pairwise(cut_indices)):
        raise ScheduleError(f"pipeline cuts must be increasing: got layer indices {cut_indices}")
    if cut_indices and (cut_indices[0] < -1 or cut_indices[-1] > num_layers - 1):
        raise ScheduleError(f"pipeline cuts {cut_indices} do not fit {num_layers} layers")
    starts = [0, *[c + 1 for c in cut_indices]]
    stops = [*[c + 1 for c in cut_indices], num_layers]
    return list(zip(starts, stops, strict=True))
