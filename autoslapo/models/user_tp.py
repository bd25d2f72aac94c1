"""Whether a model file's attention still runs with its heads split over tensor-parallel ranks.

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
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from autoslapo.models.families import FamilyDescription

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


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


def _split_call(attn: nn.Module, desc: FamilyDescription, call: tuple[tuple[Any, ...], dict[str, Any]],
                attrs: tuple[str, ...], tp: int) -> str:
    """Run a copy of ``attn`` split as tp ``tp`` splits it; "" when it runs, else its error in one line."""
    import torch
    from torch import nn

    prefix = desc.attention + "."
    mod = copy.deepcopy(attn)
    for path, column in [*((p, True) for p in desc.qkv), (desc.attn_out, False)]:
        rel = path[len(prefix):]
        lin = mod.get_submodule(rel)
        assert isinstance(lin, nn.Linear)
        shape = (lin.in_features, lin.out_features // tp) if column else (lin.in_features // tp, lin.out_features)
        _replace(mod, rel, nn.Linear(*shape, bias=lin.bias is not None, device="meta", dtype=lin.weight.dtype))
    for name in attrs:
        setattr(mod, name, getattr(mod, name) // tp)
    try:
        with torch.no_grad():
            mod(*call[0], **call[1])
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"
    return ""


def split_attention_problem(attn: nn.Module, desc: FamilyDescription,
                            call: tuple[tuple[Any, ...], dict[str, Any]] | None, module: str) -> str:
    """Why tensor parallelism cannot split ``attn`` (the first block's ``family.attention``, called with
    ``call``) as the family describes it, as a one-line rule with its fix; "" when it can (or the
    projections live outside the attention module, where the split cannot be tried alone)."""
    prefix = desc.attention + "."
    if call is None or not all(p.startswith(prefix) for p in (*desc.qkv, desc.attn_out)):
        return ""
    attrs = tuple(desc.attention_attrs)
    error = _split_call(attn, desc, call, attrs, CHECK_TP)
    if not error:
        return ""
    ints = {k: v for k, v in vars(attn).items() if isinstance(v, int) and not isinstance(v, bool) and k not in attrs
            and v >= CHECK_TP and v % CHECK_TP == 0 and not PER_HEAD.search(k)}
    # head counts first (num_heads, n_head), then widths (hidden, embed_dim), smaller first
    names = sorted(ints, key=lambda k: ("head" not in k.lower(), ints[k], k))[:MAX_CANDIDATES]
    fix = None
    for n in (1, 2):
        fix = next((extra for extra in itertools.combinations(names, n)
                    if not _split_call(attn, desc, call, attrs + extra, CHECK_TP)), None)
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
