"""The schedule tree: one node per submodule of an unchanged ``nn.Module``, addressed by path.

``create_schedule(model)`` mirrors ``model.named_modules()`` as a tree of :class:`Schedule` nodes.
Primitives (``replace``, ``shard``, ``sync``, ``checkpoint``, ...) are plain functions
``fn(sch, *args, **kwargs)`` in ``autoslapo.primitives``; :class:`Schedule` declares each built-in
one as a method (a class attribute bound to the function), so
``sch["encoder.layer.0.attention.self.query"].shard("weight", 0)`` reads like the paper and a type
checker knows its signature, and a misspelled primitive is a type error. The primitive modules
import ``Schedule`` only for type checking: the registry has no import cycle.

:func:`register_primitive` adds an extension primitive at run time (``sch.<name>(...)`` then works,
though type checkers see only the built-ins; ``get_primitive(name)(sch, ...)`` is the typed way).

The model definition is never edited: primitives slice parameters in place, add hooks, or swap a
submodule for another (then the parent node calls :meth:`Schedule.refresh`).
"""

from __future__ import annotations

import difflib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives import annotate as _annotate
from autoslapo.primitives import checkpoint as _checkpoint
from autoslapo.primitives import fuse as _fuse
from autoslapo.primitives import kernel as _kernel
from autoslapo.primitives import loss as _loss
from autoslapo.primitives import memory_format as _memory_format
from autoslapo.primitives import norm as _norm
from autoslapo.primitives import pipeline as _pipeline
from autoslapo.primitives import replace as _replace
from autoslapo.primitives import rng as _rng
from autoslapo.primitives import sync as _sync
from autoslapo.primitives import tp as _tp
from autoslapo.primitives import trace as _trace
from autoslapo.primitives import vocab as _vocab

__all__ = [
    "Schedule",
    "create_schedule",
    "get_primitive",
    "list_primitives",
    "register_primitive",
]

F = TypeVar("F", bound=Callable[..., Any])

class Schedule:
    """One node of the schedule tree.

    Attributes:
        name: the last path component ("" for the root).
        path: dotted path from the root ("" for the root), as in ``named_modules``.
        mod: the module this node schedules (changes when ``replace`` swaps it).
        parent: the parent node, ``None`` for the root.
        children: child nodes by attribute name (ModuleList children by index: "0", "1", ...).
        group: the tensor-parallel ProcessGroup, or ``None`` (world size 1).
        meta: per-node metadata (annotations, pipeline cut flags, applied primitives, ...).
        cache: on the root, data derived from the module tree (cleared by :meth:`refresh`).
    """

    def __init__(
        self,
        mod: nn.Module,
        *,
        name: str = "",
        path: str = "",
        parent: Schedule | None = None,
        group: Any = None,
    ) -> None:
        self.name = name
        self.path = path
        self.mod = mod
        self.parent = parent
        self.group = group
        self.meta: dict[str, Any] = {}
        # Facts derived from the whole module tree (e.g. where each parameter is held), kept on the
        # root by the primitives that need them and dropped whenever a subtree is rebuilt.
        self.cache: dict[str, Any] = {}
        self.children: dict[str, Schedule] = {}
        if mod not in _ORIGIN:
            _ORIGIN[mod] = path
        self._build_children()

    # -- tree -------------------------------------------------------------------------------------

    def _build_children(self, keep: dict[str, Schedule] | None = None) -> None:
        keep = keep or {}
        children: dict[str, Schedule] = {}
        for cname, cmod in self.mod.named_children():
            old = keep.get(cname)
            if old is not None and old.mod is cmod:
                old.refresh()
                children[cname] = old
                continue
            cpath = f"{self.path}.{cname}" if self.path else cname
            children[cname] = Schedule(cmod, name=cname, path=cpath, parent=self, group=self.group)
        self.children = children

    def refresh(self) -> None:
        """Rebuild the subtree from ``self.mod`` after a submodule was swapped.

        Children whose module object is unchanged keep their node (and its ``meta``). Clears the
        root's :attr:`cache`, since the module tree may have changed.
        """
        self.root().cache.clear()
        self._build_children(keep=self.children)

    def root(self) -> Schedule:
        """Return the root node of this tree."""
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def named_schedules(self, prefix: str = "") -> Iterator[tuple[str, Schedule]]:
        """Yield ``(path, node)`` depth-first, this node first.

        Paths are absolute (``node.path``) so they match the model's ``named_modules``.
        """
        del prefix  # kept for signature symmetry with named_modules
        stack: list[Schedule] = [self]
        while stack:
            node = stack.pop()
            yield node.path, node
            stack.extend(reversed(list(node.children.values())))

    def _resolve(self, path: str) -> Schedule | None:
        node: Schedule = self
        if path == "":
            return node
        for part in path.split("."):
            nxt = node.children.get(part)
            if nxt is None:
                return None
            node = nxt
        return node

    def __getitem__(self, path: str) -> Schedule:
        """Return the node at ``path`` (dotted, relative to this node; "" is this node).

        Raises:
            ScheduleError: no such submodule; the message lists the closest valid paths.
        """
        if not isinstance(path, str):
            raise ScheduleError(f"a schedule path must be a dotted string: got {path!r}")
        node = self._resolve(path)
        if node is None:
            base = len(self.path) + 1 if self.path else 0
            valid = [p[base:] for p, _ in self.named_schedules() if p != self.path]
            close = difflib.get_close_matches(path, valid, n=3, cutoff=0.5)
            if close:
                hint = f"; did you mean {', '.join(repr(c) for c in close)}?"
            else:
                hint = f"; children here: {', '.join(self.children) or 'none'}"
            where = f" under {self.path!r}" if self.path else ""
            raise ScheduleError(f"no submodule {path!r}{where} in the schedule{hint}")
        return node

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self._resolve(path) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.children)

    if not TYPE_CHECKING:
        # Only at run time, and only when normal lookup fails: says which primitives exist and the
        # closest one. Hidden from type checkers so that ``sch.shrad(...)`` stays a type error.
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            close = difflib.get_close_matches(name, list(_PRIMITIVES), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise AttributeError(
                f"Schedule has no primitive or attribute {name!r}; {hint}primitives: {', '.join(sorted(_PRIMITIVES))}"
            )

    # -- primitives (built-in; each is ``fn(sch, ...)`` in autoslapo.primitives, bound as a method) --

    annotate = _annotate.annotate
    checkpoint = _checkpoint.checkpoint
    channels_last = _memory_format.channels_last
    fuse = _fuse.fuse
    attention_kernel = _kernel.attention_kernel
    rms_norm_kernel = _norm.rms_norm_kernel
    vocab_parallel_loss = _loss.vocab_parallel_loss
    cut_pipeline_stage = _pipeline.cut_pipeline_stage
    join_layer_lists = _pipeline.join_layer_lists
    replace = _replace.replace
    replace_all = _replace.replace_all
    fork_rng = _rng.fork_rng
    shard = _tp.shard
    shrink_attr = _tp.shrink_attr
    sync = _sync.sync
    vocab_parallel = _vocab.vocab_parallel
    vocab_parallel_head = _vocab.vocab_parallel_head
    allreduce_grads = _tp.allreduce_grads
    trace = _trace.trace
    find = _trace.find
    replace_subgraph = _trace.replace_subgraph

    # -- process group ----------------------------------------------------------------------------

    @property
    def group_size(self) -> int:
        """Size of the tensor-parallel group (1 when there is none); ``world_size`` is tp x pp x dp."""
        if self.group is None:
            return 1
        import torch.distributed as dist

        return int(dist.get_world_size(self.group))

    @property
    def rank(self) -> int:
        """This process's rank inside the tensor-parallel group (0 when there is none)."""
        if self.group is None:
            return 0
        import torch.distributed as dist

        return int(dist.get_rank(self.group))

    def __repr__(self) -> str:
        return f"Schedule(path={self.path!r}, mod={type(self.mod).__name__}, children={len(self.children)})"


# The path each module had when a schedule first covered it. A primitive that moves a module (``fuse``
# puts the fused Linear under its new region) leaves it here, so a meta-device model is materialized
# with the seeds of the unscheduled model's paths (``autoslapo.build.materialize``): the scheduled
# model starts from the same weights.
_ORIGIN: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def origin_path(module: nn.Module) -> str | None:
    """The dotted path ``module`` had when a schedule first covered it (None if none has)."""
    return _ORIGIN.get(module)


def create_schedule(model: nn.Module, group: Any = None) -> Schedule:
    """Create the schedule tree over ``model``.

    Takes: the model (never modified by this call) and the tensor-parallel process group
    (``None`` for a single process). Returns: the root :class:`Schedule` node.
    Raises: ScheduleError if ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise ScheduleError(f"create_schedule needs an nn.Module: got {type(model).__name__}")
    return Schedule(model, group=group)


# The built-ins, read off the class: every attribute that is a function of autoslapo.primitives.
_PRIMITIVES: dict[str, Callable[..., Any]] = {
    name: fn for name, fn in vars(Schedule).items()
    if callable(fn) and getattr(fn, "__module__", "").startswith("autoslapo.primitives.")
}


def register_primitive(name: str) -> Callable[[F], F]:
    """Register ``fn(sch, *args, **kwargs)`` as extension primitive ``name``, callable as ``sch.<name>(...)``.

    Type checkers do not see extension primitives on ``Schedule``; ``get_primitive(name)(sch, ...)``
    calls one without a type error. Re-registering the same function (a module reload) is fine.
    Raises: ScheduleError if ``name`` is taken by another primitive or a Schedule attribute.
    """

    def deco(fn: F) -> F:
        existing = _PRIMITIVES.get(name)
        if existing is not None and existing is not fn:
            same = (
                getattr(existing, "__module__", None) == fn.__module__
                and getattr(existing, "__qualname__", None) == fn.__qualname__
            )
            if not same:  # re-registering the same function on module reload is fine
                raise ScheduleError(
                    f"primitive {name!r} is already registered by {existing.__module__}; pick another name"
                )
        elif existing is None and hasattr(Schedule, name):
            raise ScheduleError(f"primitive name {name!r} clashes with a Schedule attribute; pick another name")
        _PRIMITIVES[name] = fn
        setattr(Schedule, name, fn)
        return fn

    return deco


def list_primitives() -> list[str]:
    """Return the names of all primitives (built-in and registered), sorted."""
    return sorted(_PRIMITIVES)


def get_primitive(name: str) -> Callable[..., Any]:
    """Return the primitive function called ``name``.

    Raises: ScheduleError naming the valid primitives (and the closest one) if ``name`` is unknown.
    """
    try:
        return _PRIMITIVES[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_PRIMITIVES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ScheduleError(
            f"unknown primitive {name!r}; valid: {', '.join(sorted(_PRIMITIVES))}{hint}"
        ) from None
