"""Kernel choice: the attention implementation, "eager", "sdpa" or "flash".

``sch.attention_kernel("sdpa")`` works two ways:

* on an HF transformers model (a ``PreTrainedModel`` node) it sets the model-wide implementation
  through ``model.set_attn_implementation``. It is model-wide on purpose: HF builds one attention
  mask per forward for the configured implementation (additive float for eager, boolean or none for
  sdpa), so layers cannot differ. "flash" maps to ``flash_attention_2`` when the flash-attn package
  is installed and otherwise to SDPA pinned to its flash backend (registered with HF's
  ``AttentionInterface`` as ``autoslapo_sdpa_flash``).
* on any other module it traces the module with torch.fx, finds the attention core
  ``softmax(q @ k^T * scale [+ mask]) [-> dropout(p=0)] @ v`` and puts one call of
  ``F.scaled_dot_product_attention`` in its place; "eager" swaps the original module back.

"flash" needs a CUDA device whose SDPA flash backend is on; anywhere else it raises ScheduleError.
"""

from __future__ import annotations

import copy
import operator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives.local_attention import LOCAL_ATTENTION_MODEL_TYPES, apply_local_attention_kernel
from autoslapo.primitives.trace import swap_module, trace_module

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = [
    "ATTN_IMPLS",
    "HF_FLASH_SDPA",
    "attention_core",
    "attention_kernel",
    "flash_available",
    "rewrite_attention",
]

ATTN_IMPLS = ("eager", "sdpa", "flash")
HF_FLASH_SDPA = "autoslapo_sdpa_flash"


def flash_available(device: torch.device) -> bool:
    """True when ``device`` is CUDA and torch's flash SDPA backend is built and enabled."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    built = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
    return bool(built and torch.backends.cuda.flash_sdp_enabled())


def _module_device(mod: nn.Module) -> torch.device:
    for p in mod.parameters():
        return p.device
    return torch.device("cpu")


def _check_impl(impl: str, mod: nn.Module, path: str) -> None:
    if impl not in ATTN_IMPLS:
        raise ScheduleError(f"unknown attention kernel {impl!r}; valid: {', '.join(ATTN_IMPLS)}")
    if impl == "flash":
        dev = _module_device(mod)
        if not flash_available(dev):
            raise ScheduleError(
                f"attention kernel 'flash' needs a CUDA device with the flash SDPA backend: "
                f"{path or '<root>'!r} is on {dev} (cuda available: {torch.cuda.is_available()}); "
                "use 'sdpa' here, or move the model to a GPU first"
            )


def attention_core(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    factor: Any,
    op: str,
    backend: str,
) -> torch.Tensor:
    """``softmax(q @ k^T (op) factor + mask) @ v`` through ``F.scaled_dot_product_attention``.

    ``op`` is "mul", "div" or "none" (no scaling in the original code); ``backend`` "sdpa" lets torch
    pick, "flash" pins the flash backend.
    """
    scale = 1.0 if op == "none" else (float(factor) if op == "mul" else 1.0 / float(factor))
    if backend == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# -- generic modules: find and rewrite the attention core -------------------------------------------

_MATMUL = (torch.matmul, operator.matmul)
_SOFTMAX = (torch.softmax, F.softmax)


def _is_matmul(n: Any) -> bool:
    return isinstance(n, fx.Node) and (
        (n.op == "call_function" and n.target in _MATMUL) or (n.op == "call_method" and n.target == "matmul")
    )


def _transposed_key(n: Any) -> fx.Node | None:
    """Return k if ``n`` is k.transpose(-2, -1) (either order) or k.mT, else None."""
    if not isinstance(n, fx.Node):
        return None
    if (n.op == "call_method" and n.target == "transpose") or (
        n.op == "call_function" and n.target is torch.transpose
    ):
        dims = {d % 4 if isinstance(d, int) else d for d in n.args[1:3]}
        if dims == {2, 3} and isinstance(n.args[0], fx.Node):
            return n.args[0]
    if n.op == "call_function" and n.target is getattr and n.args[1] == "mT":
        return n.args[0] if isinstance(n.args[0], fx.Node) else None
    return None


def _softmax_dim_is_last(n: fx.Node) -> bool:
    dim = n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else None)
    return dim in (-1, 3)


def _only_user(n: fx.Node) -> fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def rewrite_attention(gm: fx.GraphModule, backend: str = "sdpa") -> int:
    """Replace every attention core in ``gm`` with one :func:`attention_core` call.

    Takes: a traced module, backend "sdpa" or "flash". Returns: how many cores were rewritten.
    Raises: ScheduleError when an attention dropout with p > 0 sits between softmax and the value
    matmul (SDPA's dropout draws different random numbers, so the rewrite would not be exact).
    """
    count = 0
    for sm in list(gm.graph.nodes):
        is_sm = (sm.op == "call_function" and sm.target in _SOFTMAX) or (
            sm.op == "call_method" and sm.target == "softmax"
        )
        if not is_sm or not _softmax_dim_is_last(sm):
            continue
        scores = sm.args[0]
        mask = None
        if (
            isinstance(scores, fx.Node)
            and scores.op == "call_function"
            and scores.target in (operator.add, torch.add)
        ):
            a, b = scores.args[0], scores.args[1]
            scores, mask = (
                (a, b) if isinstance(a, fx.Node) and (_is_matmul(a) or a.op == "call_function") else (b, a)
            )
        factor: Any = 1.0
        op = "none"
        if (
            isinstance(scores, fx.Node)
            and scores.op == "call_function"
            and scores.target in (operator.mul, operator.truediv, torch.mul, torch.div)
        ):
            op = "mul" if scores.target in (operator.mul, torch.mul) else "div"
            lhs, rhs = scores.args[0], scores.args[1]
            if op == "mul" and not _is_matmul(lhs):
                lhs, rhs = rhs, lhs
            scores, factor = lhs, rhs
        if not _is_matmul(scores):
            continue
        assert isinstance(scores, fx.Node)
        q, kt = scores.args[0], scores.args[1]
        k = _transposed_key(kt)
        if k is None or not isinstance(q, fx.Node):
            continue
        nxt = _only_user(sm)
        drop = gm.get_submodule(str(nxt.target)) if nxt is not None and nxt.op == "call_module" else None
        if nxt is not None and isinstance(drop, nn.Dropout):
            p = float(drop.p)
            if p > 0:
                raise ScheduleError(
                    f"the attention dropout {nxt.target!r} has p={p}; SDPA cannot reproduce it exactly; "
                    "set its p to 0 (e.g. attention dropout off for tuning) or keep 'eager'"
                )
            nxt = _only_user(nxt)
        if nxt is None or not _is_matmul(nxt) or (nxt.args[0] is not sm and nxt.args[0] not in sm.users):
            continue
        v = nxt.args[1]
        with gm.graph.inserting_before(nxt):
            new = gm.graph.call_function(attention_core, (q, k, v, mask, factor, op, backend))
        nxt.replace_all_uses_with(new)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return count


# -- HF transformers models -------------------------------------------------------------------------


def _hf_ancestor(sch: Schedule) -> Schedule | None:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    node: Schedule | None = sch
    while node is not None:
        if isinstance(node.mod, PreTrainedModel):
            return node
        node = node.parent
    return None


def _register_hf_flash_sdpa() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    def flash_sdpa_forward(*args: Any, **kwargs: Any) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register(HF_FLASH_SDPA, flash_sdpa_forward)
    AttentionMaskInterface.register(HF_FLASH_SDPA, sdpa_mask)


def _hf_impl_name(impl: str) -> str:
    if impl != "flash":
        return impl
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    _register_hf_flash_sdpa()
    return HF_FLASH_SDPA


def _apply_hf(sch: Schedule, impl: str) -> None:
    if getattr(getattr(sch.mod, "config", None), "model_type", None) in LOCAL_ATTENTION_MODEL_TYPES:
        # GPT-Neo: its modules keep their own local masks; HF has no SDPA path for them
        apply_local_attention_kernel(sch.mod, impl)
        return
    name = _hf_impl_name(impl)
    try:
        sch.mod.set_attn_implementation(name)  # type: ignore[operator]
    except (ValueError, ImportError, KeyError) as exc:
        raise ScheduleError(
            f"{type(sch.mod).__name__} cannot use attention kernel {impl!r} ({name}): {exc}; pick another of "
            f"{', '.join(ATTN_IMPLS)}"
        ) from exc
    current = sch.mod.config._attn_implementation  # type: ignore[union-attr]
    if current != name:
        raise ScheduleError(
            f"{type(sch.mod).__name__} kept attention kernel {current!r} instead of {name!r}: it does not "
            "support switching (no AttentionInterface); rebuild it with attn_implementation=..."
        )


def attention_kernel(sch: Schedule, impl: str) -> None:
    """Choose the attention implementation for the module at ``sch``: one of ``ATTN_IMPLS``.

    Takes: "eager", "sdpa" or "flash". On an HF model node the choice is model-wide; on another
    module its attention core is rewritten to SDPA (traced with fx), and "eager" restores it.
    Records ``sch.meta["attn_impl"]``.
    Raises: ScheduleError for an unknown name, "flash" without a CUDA flash backend, a node inside
    an HF model (the choice is model-wide: use the model's node), or a generic module in which no
    attention core is found.
    """
    _check_impl(impl, sch.mod, sch.path)
    hf = _hf_ancestor(sch)
    if hf is not None and hf is not sch:
        raise ScheduleError(
            f"the attention kernel of an HF model is model-wide (one mask serves every layer): "
            f"{sch.path!r} is inside {type(hf.mod).__name__} at {hf.path or '<root>'!r}; "
            f"call sch[{hf.path!r}].attention_kernel({impl!r})"
        )
    if hf is sch:
        _apply_hf(sch, impl)
        sch.meta["attn_impl"] = impl
        return
    original = sch.meta.get("attn_original")
    if impl == "eager":
        if original is not None:
            swap_module(sch, original)
            del sch.meta["attn_original"]
        sch.meta["attn_impl"] = "eager"
        return
    base = original if original is not None else sch.mod
    gm = trace_module(base)
    if gm is base:  # already a GraphModule: rewrite a copy so "eager" can restore the original
        gm = fx.GraphModule(base, copy.deepcopy(base.graph))
    n = rewrite_attention(gm, backend=impl)
    if n == 0:
        raise ScheduleError(
            f"no attention core softmax(q @ k.transpose(-2, -1) * scale [+ mask]) @ v found in "
            f"{type(base).__name__} at {sch.path or '<root>'!r}; call attention_kernel on the attention "
            "module itself, or replace() it with an SDPA module"
        )
    swap_module(sch, gm)
    sch.meta["attn_original"] = base
    sch.meta["attn_impl"] = impl
