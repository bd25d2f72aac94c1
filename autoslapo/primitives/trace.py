"""Trace a submodule into a graph, find subgraphs in it, and swap a subgraph for a module.

``sch["mlp"].trace()`` turns the module at that node into a ``torch.fx.GraphModule`` (same
parameters, same results) and puts it in its place in the model, so the node's ``mod`` becomes the
graph. ``find`` then locates subgraphs three ways:

* a regex over node names (a submodule path such as ``"fc1"`` or a function name such as ``"gelu"``);
* a chain of ops, e.g. ``(nn.Linear, (nn.GELU, F.gelu))``: each element is a module class (matches a
  call of a submodule of that class), a function (matches a call of it), or a tuple of those (any of
  them), and each op's single use is the next op;
* a pattern function such as ``lambda x, b: F.gelu(x + b)``, traced and matched with torch.fx's
  ``SubgraphMatcher``.

Each match can be handed to ``replace_subgraph`` (or to ``fuse``), which puts one call of a new
module where the matched nodes were. Whole-module replacement is ``replace`` (owned elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = [
    "Match",
    "find",
    "find_in_graph",
    "replace_subgraph",
    "swap_module",
    "trace",
    "trace_module",
]

OpSpec = type | Callable[..., Any] | tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class Match:
    """A subgraph found by :func:`find`.

    Attributes:
        graph: the ``fx.Graph`` the nodes live in (a match is only valid for that graph).
        nodes: the matched nodes, in graph order.
        inputs: the values flowing into the subgraph, in the order the replacement is called with.
        output: the one matched node whose value is used after the subgraph.
    """

    graph: fx.Graph
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    output: fx.Node

    @property
    def targets(self) -> tuple[str, ...]:
        """The node targets as strings: submodule paths for module calls, names for functions."""
        return tuple(_target_name(n) for n in self.nodes)

    def __repr__(self) -> str:
        return f"Match(nodes={[n.name for n in self.nodes]}, targets={list(self.targets)})"


def _target_name(node: fx.Node) -> str:
    if node.op in ("call_module", "get_attr", "call_method"):
        return str(node.target)
    target = node.target
    return str(getattr(target, "__name__", target))


def swap_module(sch: Schedule, new: nn.Module) -> None:
    """Put ``new`` where ``sch.mod`` sits in the model and in the tree.

    Takes: the node and the new module. The parent module's attribute (or ModuleList slot) is
    reassigned and the parent node refreshed; for the root only the tree changes.
    """
    if sch.parent is not None:
        setattr(sch.parent.mod, sch.name, new)
    # The parent keeps this very node (its meta stays); only the subtree is rebuilt.
    sch.mod = new
    sch.refresh()


class _LeafTracer(fx.Tracer):
    """fx tracer that also keeps the given classes and submodule paths opaque."""

    def __init__(
        self, leaf_types: tuple[type, ...], leaf_paths: frozenset[str], open_types: tuple[type, ...] = ()
    ) -> None:
        super().__init__()
        self._leaf_types = leaf_types
        self._leaf_paths = leaf_paths
        self._open_types = open_types

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self._open_types and isinstance(m, self._open_types):
            return False
        if module_qualified_name in self._leaf_paths:
            return True
        if self._leaf_types and isinstance(m, self._leaf_types):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def trace_module(
    mod: nn.Module,
    *,
    leaf_modules: Iterable[type | str] = (),
    decompose: Iterable[type] = (),
    method: str = "fx",
    example_inputs: tuple[Any, ...] | None = None,
    concrete_args: dict[str, Any] | None = None,
) -> fx.GraphModule:
    """Trace ``mod`` into a GraphModule that shares its parameters.

    Takes: the module; ``leaf_modules``, classes or submodule paths (relative to ``mod``) to keep as
    single calls (fx only; torch.nn built-ins are leaves anyway); ``decompose``, torch.nn classes to
    trace through instead (e.g. ``nn.Linear`` to see ``F.linear`` with its bias); ``method`` "fx" (symbolic_trace)
    or "export" (torch.export, needs ``example_inputs``); ``concrete_args`` for fx.
    Returns: the GraphModule. Raises: ScheduleError for a bad method or a failed trace.
    """
    if method not in ("fx", "export"):
        raise ScheduleError(f"trace method must be 'fx' or 'export': got {method!r}; pick one of those")
    if isinstance(mod, fx.GraphModule):
        return mod
    if method == "export":
        if example_inputs is None:
            raise ScheduleError(
                "trace(method='export') needs example inputs: got example_inputs=None; "
                "pass example_inputs=(tensor, ...) shaped like a real call"
            )
        try:
            exported = torch.export.export(mod, tuple(example_inputs))
        except Exception as exc:
            raise ScheduleError(
                f"torch.export could not trace {type(mod).__name__}: {exc}; try method='fx' with leaf_modules"
            ) from exc
        gm = exported.module()
        if not isinstance(gm, fx.GraphModule):
            raise ScheduleError(f"torch.export returned {type(gm).__name__}, not a GraphModule")
        return gm
    leaves = list(leaf_modules)
    leaf_types = tuple(x for x in leaves if isinstance(x, type))
    leaf_paths = frozenset(x for x in leaves if isinstance(x, str))
    bad = [x for x in leaves if not isinstance(x, type | str)]
    if bad:
        raise ScheduleError(f"leaf_modules takes classes or submodule paths: got {bad!r}")
    open_types = tuple(decompose)
    if not all(isinstance(t, type) for t in open_types):
        raise ScheduleError(f"decompose takes module classes, e.g. (nn.Linear,): got {open_types!r}")
    tracer = _LeafTracer(leaf_types, leaf_paths, open_types)
    try:
        graph = tracer.trace(mod, concrete_args=concrete_args)
    except Exception as exc:
        raise ScheduleError(
            f"torch.fx could not trace {type(mod).__name__}: {type(exc).__name__}: {exc}; trace a smaller "
            "submodule, mark the untraceable part with leaf_modules=[...], or use method='export'"
        ) from exc
    return fx.GraphModule(mod, graph, class_name=f"Traced{type(mod).__name__}")


def trace(
    sch: Schedule,
    *,
    leaf_modules: Iterable[type | str] = (),
    decompose: Iterable[type] = (),
    method: str = "fx",
    example_inputs: tuple[Any, ...] | None = None,
    concrete_args: dict[str, Any] | None = None,
) -> fx.GraphModule:
    """Trace the module at ``sch`` and put the GraphModule in its place.

    Takes: see :func:`trace_module`. Returns: the GraphModule (also ``sch.mod`` afterwards).
    Tracing twice is a no-op. Raises: ScheduleError if tracing fails.
    """
    gm = trace_module(
        sch.mod,
        leaf_modules=leaf_modules,
        decompose=decompose,
        method=method,
        example_inputs=example_inputs,
        concrete_args=concrete_args,
    )
    if gm is not sch.mod:
        sch.meta["traced"] = {"method": method, "class": type(sch.mod).__name__}
        swap_module(sch, gm)
    return gm


def _graph_module(sch: Schedule, what: str) -> fx.GraphModule:
    if not isinstance(sch.mod, fx.GraphModule):
        path = sch.path or "<root>"
        raise ScheduleError(
            f"{what} works on a traced module: {path!r} is a {type(sch.mod).__name__}; "
            f"call sch[{sch.path!r}].trace() first"
        )
    return sch.mod


def _order(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def _make_match(graph: fx.Graph, nodes: Iterable[fx.Node], inputs: Sequence[fx.Node] | None = None) -> Match:
    order = _order(graph)
    ns = tuple(sorted(set(nodes), key=order.__getitem__))
    inside = set(ns)
    outs = [n for n in ns if any(u not in inside for u in n.users)]
    if len(outs) != 1:
        raise ScheduleError(
            f"a matched subgraph must have exactly one value used outside it: nodes "
            f"{[n.name for n in ns]} have {len(outs)} ({[n.name for n in outs]}); match a larger or smaller pattern"
        )
    if inputs is None:
        seen: list[fx.Node] = []
        for n in ns:
            for a in n.all_input_nodes:
                if a not in inside and a not in seen:
                    seen.append(a)
        inputs = seen
    return Match(graph=graph, nodes=ns, inputs=tuple(inputs), output=outs[0])


def _op_matches(node: fx.Node, spec: OpSpec, gm: fx.GraphModule) -> bool:
    if isinstance(spec, tuple):
        return any(_op_matches(node, s, gm) for s in spec)
    if isinstance(spec, type):
        if node.op != "call_module":
            return False
        return isinstance(gm.get_submodule(str(node.target)), spec)
    if node.op == "call_function":
        return node.target is spec
    if node.op == "call_method" and isinstance(spec, str):
        return node.target == spec
    return False


def _find_chain(gm: fx.GraphModule, chain: Sequence[OpSpec]) -> list[Match]:
    matches: list[Match] = []
    used: set[fx.Node] = set()
    for start in gm.graph.nodes:
        if start in used or not _op_matches(start, chain[0], gm):
            continue
        nodes = [start]
        ok = True
        for spec in chain[1:]:
            users = list(nodes[-1].users)
            if len(users) != 1 or not _op_matches(users[0], spec, gm) or users[0] in used:
                ok = False
                break
            # the next op must take the previous value as its first tensor input
            if users[0].all_input_nodes[0] is not nodes[-1]:
                ok = False
                break
            nodes.append(users[0])
        if ok:
            matches.append(_make_match(gm.graph, nodes, inputs=start.all_input_nodes))
            used.update(nodes)
    return matches


def _find_pattern(gm: fx.GraphModule, pattern: Callable[..., Any]) -> list[Match]:
    try:
        pgraph = fx.symbolic_trace(pattern).graph
    except Exception as exc:
        raise ScheduleError(
            f"the pattern function could not be traced by torch.fx: {exc}; write it with torch ops "
            "on its arguments only, e.g. lambda x, b: F.gelu(x + b)"
        ) from exc
    matcher = SubgraphMatcher(
        pgraph, match_output=False, match_placeholder=False, remove_overlapping_matches=True
    )
    out: list[Match] = []
    for m in matcher.match(gm.graph):
        body = [gn for pn, gn in m.nodes_map.items() if pn.op not in ("placeholder", "output")]
        out.append(_make_match(gm.graph, body, inputs=m.placeholder_nodes))
    return out


def find_in_graph(gm: fx.GraphModule, pattern: str | Callable[..., Any] | Sequence[OpSpec]) -> list[Match]:
    """Find subgraphs of ``gm`` matching ``pattern`` (regex, op chain or pattern function).

    Returns: the matches in graph order (possibly empty). Raises: ScheduleError for a bad pattern.
    """
    if isinstance(pattern, str):
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ScheduleError(f"find pattern {pattern!r} is not a valid regex: {exc}") from exc
        ops = ("call_module", "call_function", "call_method")
        return [
            _make_match(gm.graph, [n]) for n in gm.graph.nodes if n.op in ops and rx.search(_target_name(n))
        ]
    if isinstance(pattern, list | tuple):
        if not pattern:
            raise ScheduleError("find got an empty op chain; pass e.g. (nn.Linear, nn.GELU)")
        return _find_chain(gm, pattern)
    if callable(pattern):
        return _find_pattern(gm, pattern)
    raise ScheduleError(
        f"find takes a regex string, an op chain tuple or a pattern function: got {type(pattern).__name__}"
    )


def find(sch: Schedule, pattern: str | Callable[..., Any] | Sequence[OpSpec]) -> list[Match]:
    """Find subgraphs in the traced module at ``sch``.

    Takes: a regex over node targets (submodule paths, function names), an op chain such as
    ``(nn.Linear, (nn.GELU, F.gelu))``, or a pattern function such as ``lambda x, b: F.gelu(x + b)``.
    Returns: a list of :class:`Match`. Raises: ScheduleError if ``sch`` is not traced.
    """
    return find_in_graph(_graph_module(sch, "find"), pattern)


def _free_name(gm: fx.GraphModule, base: str) -> str:
    base = re.sub(r"\W", "_", base) or "sub"
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name


def replace_in_graph(gm: fx.GraphModule, match: Match, new_module: nn.Module, name: str = "fused") -> fx.Node:
    """Rewrite ``gm`` so ``new_module(*match.inputs)`` stands where the matched nodes were.

    Returns: the new call_module node. Raises: ScheduleError if the match is stale or foreign.
    """
    if match.graph is not gm.graph:
        raise ScheduleError(
            "replace_subgraph got a match from another graph; call find() on this node again after tracing"
        )
    live = set(gm.graph.nodes)
    gone = [n.name for n in match.nodes if n not in live]
    if gone:
        raise ScheduleError(f"the match is stale: nodes {gone} were already replaced; call find() again")
    attr = _free_name(gm, name)
    gm.add_submodule(attr, new_module)
    with gm.graph.inserting_after(match.output):
        new_node = gm.graph.call_module(attr, args=tuple(match.inputs))
    match.output.replace_all_uses_with(new_node)
    for n in reversed(match.nodes):
        if n.users:
            raise ScheduleError(
                f"node {n.name} of the match is still used after replacement; match is not closed"
            )
        gm.graph.erase_node(n)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return new_node


def replace_subgraph(sch: Schedule, match: Match, new_module: nn.Module, *, name: str = "fused") -> str:
    """Replace the subgraph ``match`` of the traced module at ``sch`` with ``new_module``.

    Takes: a match from ``sch.find(...)``; the module, called as ``new_module(*match.inputs)``;
    the attribute name to give it (made unique). Returns: the submodule path of the new module
    (relative to ``sch``). Raises: ScheduleError if ``sch`` is not traced or the match is stale.
    """
    gm = _graph_module(sch, "replace_subgraph")
    if not isinstance(new_module, nn.Module):
        raise ScheduleError(f"replace_subgraph needs an nn.Module: got {type(new_module).__name__}")
    node = replace_in_graph(gm, match, new_module, name)
    sch.refresh()
    sch.meta.setdefault("replaced_subgraphs", []).append(str(node.target))
    return str(node.target)
