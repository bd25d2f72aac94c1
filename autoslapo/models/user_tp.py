"""A model file's family checks: its paths, and whether its blocks still run split over tensor-parallel ranks.

``tp_unit`` checks the paths a ``family`` names inside each block (the q/k/v and MLP input paths
column-parallel Linears, attn_out and mlp_out row-parallel ones, the head counts integers) and
gives the largest tp every size the schedule shards divides.

Tensor parallelism shards ``family.qkv`` by output features and ``family.attn_out`` by input
features, and divides the integers ``family.attention_attrs`` names (the head counts the forward
reads, ``self.num_heads``) by tp. A forward that reads a head count the family does not name
reshapes the split projections with the whole count and fails inside the ranks ("shape '[4, 32,
4, 16]' is invalid for input of size 4096"): the trace cannot tell which integers a forward
divides by tp. So the trace splits it itself, on the meta device: a copy of the first block's
attention module with its projections cut as tp 2 cuts them and the named attributes divided,
called with the inputs the traced forward gave it. When that fails, the file's tensor
parallelism is refused before anything runs (``layout.tp_problem`` reads ``extra["tp_problem"]``),
naming the attributes that make it run when divided too, found by trying the module's integers.

The MLP is split the same way: ``family.mlp_in`` cut by output features (the Linears that widen the
MLP's input: fc1, or gate and up), ``family.mlp_out`` by input features (the one that narrows it
back), on a copy of the smallest module of the first block that holds them all, called with the
inputs the traced forward gave it. With the paths swapped every size still divides tp, but the ranks
fail ("mat1 and mat2 shapes cannot be multiplied"); the check refuses tp > 1 and names the order
that runs, found by trying each of the named Linears as mlp_out.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from typing import TYPE_CHECKING, Any

from autoslapo.errors import UsageError

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.hooks import RemovableHandle

    from autoslapo.models.families import FamilyDescription

#: A module's positional and keyword inputs, as a forward pre-hook saw them.
Call = tuple[tuple[Any, ...], dict[str, Any]]

#: The degree the check splits by: any tp the file's sizes allow splits the same integers.
CHECK_TP = 2
#: Sizes of one head (never divided by tp), left out of the attributes tried.
PER_HEAD = re.compile(r"head_?dim|head_?size|d_?head|dim_?head|^d_[kv]$|scale", re.IGNORECASE)
#: Names that are a head's width when they are the whole name (``head_dim``, ``attention_head_size``),
#: which tp keeps: named in ``attention_attrs``, the forward would run split with each head halved
#: and the number of heads whole (BERT's ``all_head_size``, the heads' total, is divided rightly).
HEAD_WIDTH = re.compile(r"(attention_|attn_)?(head_?dim|head_?size|d_?head|dim_?head|d_[kv])", re.IGNORECASE)
#: At most this many of the module's integers are tried as missing head counts (singly and in pairs).
MAX_CANDIDATES = 8


def resolve_path(model: nn.Module, path: str, what: str) -> nn.Module:
    """The submodule at dotted ``path``. Raises UsageError naming the missing part and the valid children."""
    mod = model
    for part in path.split("."):
        children = dict(mod.named_children())
        if part not in children:
            raise UsageError(f"{what} {path!r} is not a submodule path of {type(model).__name__}: no {part!r} in "
                             f"{type(mod).__name__} (children: {', '.join(children) or 'none'}); fix the path")
        mod = children[part]
    return mod


def head_width_problem(attrs: tuple[str, ...], attn: object, module: str) -> str:
    """Why ``attrs`` (a family's ``attention_attrs``) cannot be the head counts tp divides: one names a
    head's width (``head_dim``), as a one-line rule with its fix naming the module's head counts; ""."""
    wrong = [a for a in attrs if HEAD_WIDTH.fullmatch(a)]
    if not wrong:
        return ""
    counts = [k for k, v in vars(attn).items() if isinstance(v, int) and not isinstance(v, bool)
              and "head" in k.lower() and not HEAD_WIDTH.fullmatch(k) and k not in attrs]
    fix = f"name the head count instead ({', '.join(repr(k) for k in counts)} in it)" if counts else "name the head count instead"
    return (f"family.attention_attrs names the integers tensor parallelism divides by tp, the head counts: "
            f"{wrong[0]!r} in {module}.py is a head's width, which tp keeps (each rank runs whole heads, "
            f"fewer of them); {fix}, or leave it out")


def head_widths(attn: nn.Module, call: Call, widths: set[int]) -> set[int]:
    """The widths of the heads ``attn``'s forward, called with ``call`` on the meta device, cuts its
    projections' outputs into: the last size of each view of a tensor whose last size is in ``widths``
    as ``[..., heads, width]`` (or ``[..., 3, heads, width]``, a fused q/k/v); empty when none is seen."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    found: set[int] = set()
    views = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)

    class Views(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            x = args[0] if args else None
            if (func in views and isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor) and x.dim()
                    and int(x.shape[-1]) in widths):
                k = next((k for k in (2, 3) if out.dim() > k and math.prod(out.shape[-k:]) == x.shape[-1]), 0)
                if k and min(out.shape[-2:]) > 1:
                    found.add(int(out.shape[-1]))
            return out
    try:
        with torch.no_grad(), Views():
            attn(*call[0], **call[1])
    except Exception:  # the trace ran it: a failure here is the split checks' to name
        return set()
    return found


def attrs_value_problem(block: nn.Module, desc: FamilyDescription, call: Call | None, module: str) -> str:
    """Why an integer ``desc.attention_attrs`` names cannot be what tp divides, as a one-line rule with its
    fix; "". Each must be a head count (times the head width, a q/k/v projection's output width: heads or
    key/value heads) or such a width itself (BERT's ``all_head_size``), else dividing it by tp fails inside
    the ranks or runs wrong numbers (the number of layers, the model's width where the heads' is not).
    The head width is the one the forward cuts the projections into (else a ``head_dim`` attribute)."""
    attrs = tuple(desc.attention_attrs)
    if not attrs or call is None:
        return ""
    attn = block.get_submodule(desc.attention)
    outs = [int(getattr(block.get_submodule(p), "out_features", 0)) for p in desc.qkv]  # Linears (tp_unit)
    widths = {w for o in outs for w in (o, o // desc.qkv_chunks) if w > 0}
    ints = {k: v for k, v in vars(attn).items() if isinstance(v, int) and not isinstance(v, bool)}
    heads = head_widths(attn, call, widths) or {v for k, v in ints.items() if HEAD_WIDTH.fullmatch(k) and v > 0}
    counts = {w // d for w in widths for d in heads if w % d == 0}
    for attr in attrs:
        v = ints.get(attr)
        if v is None:  # not an integer: tp_unit says so
            continue
        if v in widths or (v in counts if heads else v > 0 and any(w % v == 0 for w in widths)):
            continue
        per = f"the head width, {'/'.join(map(str, sorted(heads)))}," if heads else "a head's width"
        rule = (f"family.attention_attrs names what tensor parallelism divides by tp, head counts (a count times "
                f"{per} is a q/k/v projection's output width, {'/'.join(map(str, sorted(widths)))}) or such a width")
        expect = (f"a head count ({', '.join(map(str, sorted(counts)))}) or a width "
                  f"({', '.join(map(str, sorted(widths)))})" if heads else
                  f"a divisor of {'/'.join(map(str, sorted(widths)))}")
        better = [f"{k!r} ({ints[k]} in it)" for k in sorted(ints, key=lambda k: ("head" not in k.lower(), k))
                  if k not in attrs and (ints[k] in counts or ints[k] in widths)][:3]
        fix = f"name {' or '.join(better)} instead, or leave {attr!r} out" if better else f"leave {attr!r} out"
        return f"{rule}: {attr!r} is {v} in {module}.py's {desc.attention!r}, expected {expect}; {fix}"
    return ""


def tp_unit(blocks: list[nn.Module], desc: FamilyDescription, module: str) -> int:
    """The largest tensor-parallel degree every size the schedule shards divides, after checking the
    paths ``desc`` names inside each block. Raises UsageError naming a path that breaks a rule."""
    from torch import nn

    sizes: list[int] = []
    for block in blocks:
        attn = resolve_path(block, desc.attention, "family.attention")
        width = head_width_problem(tuple(desc.attention_attrs), attn, module)
        if width:  # halved, the forward runs with wrong numbers; no split check would see it
            raise UsageError(width)
        for attr in desc.attention_attrs:
            v = getattr(attn, attr, None)
            if not isinstance(v, int):
                raise UsageError(f"family.attention_attrs names integer attributes of the attention module: "
                                 f"{attr!r} is {v!r} in {module}.py; list only integer attributes")
            sizes.append(v)
        for path in (*desc.qkv, *desc.mlp_in):
            lin = resolve_path(block, path, "family column-parallel path")
            if not isinstance(lin, nn.Linear):
                raise UsageError(f"a family's q/k/v and MLP input paths must be nn.Linear: {path!r} is a "
                                 f"{type(lin).__name__} in {module}.py; point them at the Linear layers")
            sizes.append(lin.out_features // desc.qkv_chunks if path in desc.qkv else lin.out_features)
        for path in (desc.attn_out, desc.mlp_out):
            lin = resolve_path(block, path, "family row-parallel path")
            if not isinstance(lin, nn.Linear):
                raise UsageError(f"a family's attn_out and mlp_out paths must be nn.Linear: {path!r} is a "
                                 f"{type(lin).__name__} in {module}.py; point them at the Linear layers")
            sizes.append(lin.in_features)
        for path in desc.norms:
            resolve_path(block, path, "family.norms")
        if desc.mlp is not None:
            resolve_path(block, desc.mlp, "family.mlp")
    return math.gcd(*sizes) if sizes else 1


def mlp_root(desc: FamilyDescription) -> str:
    """The path (in a block; "" for the block) of the smallest module holding ``mlp_in`` and ``mlp_out``."""
    common: list[str] = []
    for parts in zip(*(p.split(".")[:-1] for p in (*desc.mlp_in, desc.mlp_out)), strict=False):
        if len(set(parts)) > 1:
            break
        common.append(parts[0])
    return ".".join(common)


def capture_calls(block: nn.Module, desc: FamilyDescription, calls: dict[str, Call]) -> list[RemovableHandle]:
    """Hooks saving into ``calls`` the first inputs of ``block``'s attention (key ``"attention"``) and of
    its MLP's module (key ``"mlp"``, see ``mlp_root``): what the split checks call them with."""
    def saver(key: str) -> Any:
        def save(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            calls.setdefault(key, (args, dict(kwargs)))
        return save
    return [block.get_submodule(desc.attention).register_forward_pre_hook(saver("attention"), with_kwargs=True),
            block.get_submodule(mlp_root(desc)).register_forward_pre_hook(saver("mlp"), with_kwargs=True)]


def _split_call(mod: nn.Module, root: str, desc: FamilyDescription, call: Call, cuts: list[tuple[str, bool]],
                attrs: tuple[str, ...], tp: int) -> str:
    """Run a copy of ``mod`` (the block's module at ``root``) with the Linears at ``cuts`` (block paths,
    True: by output features) cut as tp ``tp`` cuts them and ``attrs`` of the attention divided when it
    holds the attention; "" when it runs, else its error in one line."""
    import torch
    from torch import nn

    prefix = root + "." if root else ""
    mod = copy.deepcopy(mod)
    for path, column in cuts:
        rel = path[len(prefix):]
        lin = mod.get_submodule(rel)
        assert isinstance(lin, nn.Linear)
        shape = (lin.in_features, lin.out_features // tp) if column else (lin.in_features // tp, lin.out_features)
        parent, _, leaf = rel.rpartition(".")
        setattr(mod.get_submodule(parent), leaf,
                nn.Linear(*shape, bias=lin.bias is not None, device="meta", dtype=lin.weight.dtype))
    if attrs and (desc.attention == root or desc.attention.startswith(prefix)):
        attn = mod.get_submodule(desc.attention[len(prefix):] if desc.attention != root else "")
        for name in attrs:
            setattr(attn, name, getattr(attn, name) // tp)
    try:
        with torch.no_grad():
            mod(*call[0], **call[1])
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"
    return ""


def _attention_cuts(desc: FamilyDescription) -> list[tuple[str, bool]]:
    return [*((p, True) for p in desc.qkv), (desc.attn_out, False)]


def split_attention_problem(attn: nn.Module, desc: FamilyDescription, call: Call | None, module: str) -> str:
    """Why tensor parallelism cannot split ``attn`` (the first block's ``family.attention``, called with
    ``call``) as the family describes it, as a one-line rule with its fix; "" when it can (or the
    projections live outside the attention module, where the split cannot be tried alone)."""
    prefix = desc.attention + "."
    if call is None or not all(p.startswith(prefix) for p in (*desc.qkv, desc.attn_out)):
        return ""
    attrs, cuts = tuple(desc.attention_attrs), _attention_cuts(desc)
    error = _split_call(attn, desc.attention, desc, call, cuts, attrs, CHECK_TP)
    if not error:
        return ""
    ints = {k: v for k, v in vars(attn).items() if isinstance(v, int) and not isinstance(v, bool) and k not in attrs
            and v >= CHECK_TP and v % CHECK_TP == 0 and not PER_HEAD.search(k)}
    # head counts first (num_heads, n_head), then widths (hidden, embed_dim), smaller first
    names = sorted(ints, key=lambda k: ("head" not in k.lower(), ints[k], k))[:MAX_CANDIDATES]
    fix = None
    for n in (1, 2):
        fix = next((extra for extra in itertools.combinations(names, n)
                    if not _split_call(attn, desc.attention, desc, call, cuts, attrs + extra, CHECK_TP)), None)
        if fix is not None:
            break
    named = "attention_attrs=(" + "".join(f"{a!r}, " for a in attrs + (fix or ())).rstrip(", ") + \
        ("," if len(attrs + (fix or ())) == 1 else "") + ")"
    how = (f"set {named} (with it divided too, the split forward runs)" if fix is not None else
           "name in attention_attrs every integer attribute its forward reads as a head count (its integers: "
           + ", ".join(f"{k}={ints[k]}" for k in names) + ")" if names else
           "make its forward read the head count from the projections' shapes")
    return (f"family.attention_attrs must name the head counts {module}.py's attention forward reads (tensor "
            f"parallelism divides them by tp): split over {CHECK_TP} ranks, {desc.attention!r} fails with "
            f"attention_attrs={attrs!r} ({error}); {how}, or use tp=1")


def split_mlp_problem(block: nn.Module, desc: FamilyDescription, call: Call | None, module: str) -> str:
    """Why tensor parallelism cannot split the first block's MLP (the module at ``mlp_root``, called with
    ``call``) as ``mlp_in`` and ``mlp_out`` describe it, as a one-line rule with its fix; "" when it can
    (or when that module holds the attention and its split alone already fails: not the MLP's doing)."""
    from torch import nn

    root = mlp_root(desc)
    if call is None:
        return ""
    mod, attrs = block.get_submodule(root), tuple(desc.attention_attrs)
    inside = [c for c in _attention_cuts(desc) if not root or c[0].startswith(root + ".")]

    def fails(mlp_in: tuple[str, ...], mlp_out: str) -> str:
        cuts = [*inside, *((p, True) for p in mlp_in), (mlp_out, False)]
        return _split_call(mod, root, desc, call, cuts, attrs, CHECK_TP)
    error = fails(desc.mlp_in, desc.mlp_out)
    if not error or (inside and _split_call(mod, root, desc, call, inside, attrs, CHECK_TP)):
        return ""
    # the fixes tried: another of the named Linears as mlp_out (swapped paths), or one more in mlp_in (a gate)
    named, prefix = [*desc.mlp_in, desc.mlp_out], root + "." if root else ""
    others = [prefix + n for n, m in mod.named_modules() if isinstance(m, nn.Linear) and n and prefix + n not in named
              and not any(prefix + n == c[0] for c in inside)]
    tries = [*((tuple(p for p in named if p != out), out) for out in reversed(named) if out != desc.mlp_out),
             *(((*desc.mlp_in, extra), desc.mlp_out) for extra in others)]
    fix = next((t for t in tries if not fails(*t)), None)
    given, where = f"mlp_in={desc.mlp_in!r}, mlp_out={desc.mlp_out!r}", repr(root) if root else "block"
    how = (f"set mlp_in={fix[0]!r}, mlp_out={fix[1]!r} (with them, the split forward runs)" if fix is not None else
           "name in mlp_in every Linear that takes the MLP's input (fc1; gate and up) and in mlp_out the one that "
           "gives its output (fc2; down)")
    return (f"family.mlp_in must name the Linear(s) that widen the MLP's input (tensor parallelism cuts their output "
            f"features) and mlp_out the one that narrows it back (cut by its input features): split over {CHECK_TP} "
            f"ranks, {module}.py's {where} fails with {given} ({error}); {how}, or use tp=1")
