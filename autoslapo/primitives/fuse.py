"""``fuse``: turn a submodule, or a subgraph found by ``find``, into one fused region.

Three ways, from cheapest to most general:

* ``sch["mlp"].fuse()`` with a compiler compiles the whole submodule in place
  (``nn.Module.compile``): the module object, its parameters and its path stay the same.
* ``sch["mlp"].fuse(match)`` where the match is a Linear followed by GeLU (from
  ``find((nn.Linear, (nn.GELU, F.gelu)))``) puts a :class:`FusedLinearGelu` there: the matmul without
  bias, then bias-add and GeLU in one function, eager by default or compiled (Slapo's bias-GeLU).
* any other match becomes its own GraphModule (a region sharing the parameters), compiled unless
  the compiler is "eager".

Compiling costs tens of seconds cold, so the "eager" compiler exists to check the rewrite itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives.trace import Match, replace_subgraph

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["COMPILERS", "FusedLinearGelu", "bias_gelu", "extract_region", "fuse"]

COMPILERS = ("eager", "inductor", "aot_eager")



def _gelu_types() -> tuple[type, ...]:
    """nn.GELU, plus transformers' GELUActivation (it wraps exact F.gelu) when transformers is loaded.

    Looked up in ``sys.modules`` rather than imported: a model holding a GELUActivation has already
    imported it, and importing transformers here would add seconds to ``import autoslapo.schedule``.
    """
    acts = sys.modules.get("transformers.activations")
    gelu_activation = getattr(acts, "GELUActivation", None)
    return (nn.GELU,) if gelu_activation is None else (nn.GELU, gelu_activation)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(x + bias)``: the fusable tail of Linear + GeLU."""
    return F.gelu(x + bias, approximate=approximate)


class FusedLinearGelu(nn.Module):
    """Linear then GeLU with the bias-add folded into the activation.

    Holds the Linear it was built from as its child ``linear`` (only its forward is replaced: the
    matmul here, the bias-add inside the activation), so the model's parameters are the same objects
    and a meta-device model gives them the values the unscheduled model's Linear would get (its
    initializer and the seed of its path, ``autoslapo.build.materialize``).
    """

    def __init__(self, linear: nn.Linear, approximate: str = "none", compiler: str = "eager") -> None:
        super().__init__()
        if linear.bias is None:
            raise ScheduleError(
                "bias-GeLU fusion needs a Linear with a bias: got bias=None; fuse the region instead"
            )
        self.linear = linear
        self.approximate = approximate
        self.compiler = compiler
        self._act: Callable[..., torch.Tensor] = bias_gelu
        if compiler != "eager":
            self._act = torch.compile(bias_gelu, backend=compiler, dynamic=True)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor:
        assert self.linear.bias is not None
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._act(F.linear(x, self.weight), self.bias, self.approximate)

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, compiler={self.compiler!r}"


def _check_compiler(compiler: str) -> None:
    if compiler not in COMPILERS:
        raise ScheduleError(f"unknown fuse compiler {compiler!r}; valid: {', '.join(COMPILERS)}")


def _linear_gelu(gm: fx.GraphModule, match: Match) -> tuple[nn.Linear, str] | None:
    """Return (linear, approximate) if the match is exactly Linear -> GeLU, else None."""
    if len(match.nodes) != 2:
        return None
    first, second = match.nodes
    if first.op != "call_module" or len(match.inputs) != 1:
        return None
    lin = gm.get_submodule(str(first.target))
    if not isinstance(lin, nn.Linear) or lin.bias is None:
        return None
    if second.op == "call_module":
        act = gm.get_submodule(str(second.target))
        if isinstance(act, nn.GELU):
            return lin, act.approximate
        if isinstance(act, _gelu_types()):
            return lin, "none"
        return None
    if second.op == "call_function" and second.target is F.gelu:
        approx = second.kwargs.get("approximate", "none")
        if len(second.args) > 1 or not isinstance(approx, str):
            return None
        return lin, approx
    return None


def extract_region(gm: fx.GraphModule, match: Match) -> fx.GraphModule:
    """Copy the matched nodes into a GraphModule of their own, sharing ``gm``'s parameters.

    Takes: the traced module and a match in it. Returns: a GraphModule called with
    ``match.inputs`` in order and returning ``match.output``'s value.
    """
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, inp in enumerate(match.inputs):
        env[inp] = g.placeholder(f"in_{i}")
    for n in match.nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[match.output])
    return fx.GraphModule(gm, g, class_name="FusedRegion")


def fuse(
    sch: Schedule,
    match: Match | None = None,
    *,
    compiler: str = "eager",
    name: str = "fused",
    **compile_options: Any,
) -> nn.Module:
    """Fuse the module at ``sch`` (no match) or the subgraph ``match`` of its traced module.

    Takes: an optional match from ``sch.find``; ``compiler`` one of ``COMPILERS`` ("eager" keeps
    the rewrite but compiles nothing); ``name`` for the new submodule; extra options for
    ``torch.compile`` (mode=..., dynamic=..., fullgraph=...).
    Returns: the compiled module (no match) or the new fused submodule.
    Raises: ScheduleError for an unknown compiler, ``compiler="eager"`` without a match (nothing to
    fuse), or a match on an untraced module.
    """
    _check_compiler(compiler)
    if match is None:
        if compiler == "eager":
            raise ScheduleError(
                "fuse() without a match compiles the whole module, so it needs a compiler: got "
                "compiler='eager'; pass compiler='inductor', or find a subgraph first and fuse(match)"
            )
        sch.mod.compile(backend=compiler, **compile_options)
        sch.meta["fused"] = {"compiler": compiler, "region": "module"}
        return sch.mod
    if not isinstance(sch.mod, fx.GraphModule):
        raise ScheduleError(
            f"fuse(match) needs the traced module: {sch.path!r} is a {type(sch.mod).__name__}; "
            f"call sch[{sch.path!r}].trace() and find() first"
        )
    gm = sch.mod
    lg = _linear_gelu(gm, match) if match.graph is gm.graph else None
    new: nn.Module
    if lg is not None and not compile_options:
        lin, approx = lg
        new = FusedLinearGelu(lin, approximate=approx, compiler=compiler)
        kind = "linear_gelu"
    else:
        new = extract_region(gm, match)
        if compiler != "eager":
            new.compile(backend=compiler, **compile_options)
        kind = "region"
    path = replace_subgraph(sch, match, new, name=name)
    fused = sch.meta.get("fused")
    if not isinstance(fused, list):
        fused = []
        sch.meta["fused"] = fused
    fused.append({"path": path, "kind": kind, "compiler": compiler})
    return new
