"""The user's own model: a Python file with ``build()`` and ``batch()``, as a ``ModelSpec``.

The file defines ``build() -> nn.Module`` (the unchanged model; it must honour the ambient device,
so ``with torch.device("meta"): build()`` allocates nothing), ``batch(micro_batch, seed) -> dict``
(the forward's keyword inputs, labels included; the forward returns a loss or an object with
``.loss``), optionally ``layers = "blocks"`` (dotted path of the ModuleList of repeated blocks:
checkpointing and pipeline stages, ``autoslapo.user_pipeline``) and ``family = autoslapo.FamilyDescription(...)`` (paths inside one block:
tensor parallelism and kernels), or instead of a family ``shard_block`` (a function applying tensor
parallelism to one block's Schedule node) with ``tp_divisor`` (the width every tp must divide).

A spec of family ``user`` names the file by content, not path: ``extra`` holds (keys of this
family) ``module`` (the file's stem), ``digest`` (sha256 of its bytes), ``layers`` (the path or
None), ``tp`` (whether a family description or a ``shard_block`` is given), ``kernels`` (whether a
family description is: the attention kernel and fusion need its paths), and the shape measured once
by a trace on the meta device (cached by digest): ``params``, ``layer_params`` (one block's), ``fwd_flops`` and
``layer_fwd_flops`` (forward FLOPs per sample of the whole model / of one block, from
``torch.utils.flop_counter``), ``act_bytes`` and ``layer_act_bytes`` (fp32 bytes saved for backward
per sample outside the blocks / by one block), ``layer_input_bytes`` (one block's input per
sample: what a checkpointed block keeps), ``ops`` and ``layer_ops`` (aten ops of one forward / of
one block: kernel launches), ``tensors`` and ``layer_tensors`` (parameter tensors of the model / of
one block: what the fp16 loss scaler hooks); with a ``family``, what selective recomputation of a
block's attention module (``family.attention``) changes, per sample and block: ``attn_act_bytes`` (saved inside it),
``attn_kept_bytes`` (what selective recomputation keeps of it: its input and the outputs of its
matrix products with weights, ``mm``/``addmm``), ``attn_core_flops`` and ``attn_core_ops`` (its
other FLOPs and aten ops: what runs again). The transformer fields say what the generic rules need:
``layers`` the block count (1 without ``layers``); ``heads`` = ``kv_heads`` = ``hidden`` = ``ffn`` the
largest tensor-parallel degree every sharded size divides (``tp_divisor`` with ``shard_block``; 1 without either); ``seq_len`` the
batch's ``input_ids`` length (1 without it); ``vocab`` 1.

The file is copied into a content-addressed cache (``$AUTOSLAPO_MODEL_CACHE``, default
``~/.cache/autoslapo/models``) when a command resolves it, and the rank processes load it from there
by digest: the code a trial runs is the code whose digest the study records. Only the processes
that run or measure the model execute it (the CLI, the ranks, and a service's trace child process and
workers when it was started with ``--allow-module-files``; never the server process or the store).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.families import FamilyDescription
from autoslapo.models.modcache import cache_root, ensure_entry, mark_used, read_entry
from autoslapo.models.spec import USER_ATTENTION_KEYS as ATTENTION_KEYS
from autoslapo.models.spec import USER_FAMILY, ModelSpec
from autoslapo.models.user_tp import (
    CHECK_TP,
    Call,
    attrs_value_problem,
    capture_calls,
    resolve_path,
    split_attention_problem,
    split_mlp_problem,
    tp_unit,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "USER_FAMILY",
    "UserModel",
    "load_user_file",
    "load_user_model",
    "model_cache_dir",
    "trace_user_model",
    "user_loss",
    "user_spec",
]

TRACE_VERSION = 6  # bump when the trace measures differently, so old cached traces are redone
TRACE_MICRO_BATCH = 2
TRACE_KEYS = ("layers", "tp_unit", "seq_len", "params", "layer_params", "fwd_flops", "layer_fwd_flops", "act_bytes",
              "layer_act_bytes", "layer_input_bytes", "ops", "layer_ops", "tensors", "layer_tensors", "attn_core",
              *ATTENTION_KEYS)


@dataclass(frozen=True)
class UserModel:
    """A loaded model file: its entry points and what it declares."""

    path: Path
    digest: str
    module: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, int], dict[str, Any]]
    layers: str | None
    family: FamilyDescription | None
    shard_block: Callable[[Any], None] | None = None
    tp_divisor: int = 1

    @property
    def tensor_parallel(self) -> bool:
        """Whether the file says how to shard its blocks (a ``family`` or a ``shard_block``)."""
        return self.family is not None or self.shard_block is not None


def model_cache_dir() -> Path:
    """Where model files are kept by digest: ``$AUTOSLAPO_MODEL_CACHE`` or ``~/.cache/autoslapo/models``
    (entries unused for a while are pruned: ``autoslapo.models.modcache``)."""
    return cache_root()


_LOADED: dict[str, UserModel] = {}  # "digest/module" -> the loaded file (each is executed once a process)


def _check_file(path: Path) -> None:
    if path.suffix != ".py":
        raise UsageError(f"a model file must be a Python file (.py): got {str(path)!r}; "
                         "give a .py file that defines build() and batch()")
    if not path.is_file():
        raise UsageError(f"model file not found: {str(path)!r}; check the path")


def _execute(path: Path, digest: str) -> ModuleType:
    name = f"autoslapo_user_{path.stem}_{digest[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import the model file {str(path)!r} as a Python module; check its name")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UsageError(f"the model file {str(path)!r} failed to import: {type(exc).__name__}: {exc}; "
                         "fix the file (it runs as a plain Python module)") from exc
    return mod


def _entry(mod: ModuleType, path: Path, name: str, signature: str, args: tuple[int, ...]) -> Callable[..., Any]:
    fn = getattr(mod, name, None)
    if not callable(fn):
        got = "nothing" if fn is None else type(fn).__name__
        raise UsageError(f"a model file must define {signature}: {str(path)!r} has {got} named {name!r}; "
                         f"add def {signature} to it")
    try:  # called with len(args) positional arguments (batch(2, 0)): its signature must take them
        inspect.signature(fn).bind(*args)
    except ValueError:  # a callable without a signature (a builtin): its call says
        pass
    except TypeError as exc:
        raise UsageError(f"a model file must define {signature}: {path.name}'s is {name}{inspect.signature(fn)}, which "
                         f"{name}{args} cannot call ({exc}); define it as def {signature}") from None
    return fn  # type: ignore[no-any-return]


def _read(path: Path, digest: str) -> UserModel:
    mod = _execute(path, digest)
    build = _entry(mod, path, "build", "build() -> nn.Module", ())
    batch = _entry(mod, path, "batch", "batch(micro_batch, seed) -> dict", (TRACE_MICRO_BATCH, 0))
    layers = getattr(mod, "layers", None)
    if layers is not None and (not isinstance(layers, str) or not layers):
        raise UsageError(f"layers must be the dotted path of the model's ModuleList of blocks: got {layers!r} in "
                         f"{str(path)!r}; write e.g. layers = \"blocks\" or leave it out")
    family = getattr(mod, "family", None)
    if family is not None and not isinstance(family, FamilyDescription):
        raise UsageError(f"family must be an autoslapo.FamilyDescription: got {type(family).__name__} in "
                         f"{str(path)!r}; build one with the paths inside a block, or leave it out")
    if family is not None and layers is None:
        raise UsageError(f"family needs layers (its paths are inside one block): {str(path)!r} has no layers; "
                         "add layers = \"<path of the ModuleList>\"")
    shard_block = getattr(mod, "shard_block", None)
    tp_divisor = getattr(mod, "tp_divisor", None)
    if shard_block is not None:
        if not callable(shard_block) or family is not None or layers is None:
            raise UsageError(f"shard_block must be a function of one block's Schedule node, given with layers and "
                             f"without family: got shard_block={type(shard_block).__name__}, family="
                             f"{type(family).__name__}, layers={layers!r} in {str(path)!r}; keep one way to shard")
        if not isinstance(tp_divisor, int) or isinstance(tp_divisor, bool) or tp_divisor < 1:
            raise UsageError(f"shard_block needs tp_divisor, the positive integer every tp must divide: got "
                             f"{tp_divisor!r} in {str(path)!r}; add tp_divisor = <the sharded width>")
    return UserModel(path=path, digest=digest, module=path.stem, build=build, batch=batch, layers=layers,
                     family=family, shard_block=shard_block, tp_divisor=tp_divisor or 1)


def load_user_file(path: str | os.PathLike[str]) -> UserModel:
    """Execute a model file and return its entry points; copy it into the cache by digest.

    Raises: UsageError (one line: rule, value, fix) for a missing file, a failed import, a missing
    ``build``/``batch``, a ``layers`` that is not a path, a ``family`` that is not a FamilyDescription.
    """
    p = Path(path).expanduser().resolve()
    _check_file(p)
    data = p.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    ensure_entry(digest, p.name, data)  # what the ranks load: the bytes whose digest the spec records
    key = f"{digest}/{p.stem}"
    if key not in _LOADED:
        _LOADED[key] = _read(p, digest)
    return _LOADED[key]


def load_user_model(spec: ModelSpec) -> UserModel:
    """The model file a ``user`` spec names, loaded from the cache by its digest (what ranks do).

    Raises: ConfigError when the spec is not a user model or its file is not in this machine's cache.
    """
    if spec.family != USER_FAMILY:
        raise ConfigError(f"load_user_model needs a spec of family {USER_FAMILY!r}: got {spec.family!r}")
    digest, module = spec.extra.get("digest"), spec.extra.get("module")
    key = f"{digest}/{module}"
    mark_used(str(digest))
    if key in _LOADED:
        return _LOADED[key]
    path = model_cache_dir() / str(digest) / f"{module}.py"
    if hashlib.sha256(read_entry(str(digest), path.name)).hexdigest() != digest:
        raise ConfigError(f"the cached model file {str(path)!r} does not match its digest {str(digest)[:12]}; "
                          "delete it and run the command with the .py path again")
    _LOADED[key] = _read(path, str(digest))
    return _LOADED[key]


def user_loss(out: Any) -> torch.Tensor:
    """The loss a forward returned: the tensor itself, or its ``.loss``.

    Raises: ConfigError when it is neither.
    """
    import torch

    loss = out if isinstance(out, torch.Tensor) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        if loss.dim() != 0:  # logits, or a loss per token: backward() needs one number
            raise ConfigError(f"a model's forward must return the loss, one number: got a tensor of shape "
                              f"{tuple(loss.shape)}; reduce it (e.g. its mean) or compute the loss from the labels")
        return loss
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor) and out[0].numel() == 1:
        # (loss, logits): the loss is computed, and returned with more
        raise ConfigError(f"a model's forward must return the loss alone or an object with .loss: got a "
                          f"{type(out).__name__} of {len(out)} whose first element is a one-number tensor, the loss; "
                          "return the loss alone (a tensor of one number, shape ()), not a tuple, or an object with .loss")
    raise ConfigError(f"a model's forward must return the loss or an object with .loss: got {type(out).__name__}; "
                      "compute the loss from the labels in forward")


def user_blocks(model: nn.Module, um: UserModel) -> list[nn.Module]:
    """The repeated blocks ``layers`` names. Raises UsageError for a bad path or a non-list module."""
    from torch import nn

    if um.layers is None:
        return []
    mod = resolve_path(model, um.layers, "layers")
    if not isinstance(mod, nn.ModuleList | nn.Sequential) or len(mod) == 0:
        raise UsageError(f"layers must name a non-empty ModuleList (or nn.Sequential) of blocks: {um.layers!r} is a "
                         f"{type(mod).__name__} in {um.module}.py; point it at the list of repeated blocks")
    return list(mod)


def _tp_unit(blocks: list[nn.Module], desc: FamilyDescription | None, um: UserModel) -> int:
    """The largest tensor-parallel degree every size the schedule shards divides (1 without a family)."""
    if um.shard_block is not None:
        return um.tp_divisor
    return 1 if desc is None else tp_unit(blocks, desc, um.module)


def forward_keys_problem(model: nn.Module, keys: list[str], module: str) -> str:
    """Why ``model(**batch)`` cannot bind a batch of ``keys`` to its forward's parameters, as a one-line
    rule naming the key and the parameters with its fix; "" when it can (or the forward has no signature)."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return ""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = ", ".join(n for n, p in params.items() if p.kind in kinds) or "none"
    where = f"{type(model).__name__}.forward in {module}.py"
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in keys if k not in params or params[k].kind not in kinds]
        if unknown:
            return (f"batch()'s keys must be the keyword arguments of the model's forward: {unknown[0]!r} is not one "
                    f"of {where} (its parameters: {named}); rename the key in batch() or the forward's parameter")
    missing = [n for n, p in params.items() if p.kind in kinds and p.default is p.empty and n not in keys]
    if missing:
        return (f"batch()'s keys must give every argument the model's forward requires: {where} requires "
                f"{missing[0]!r}, which batch() does not give (its keys: {', '.join(keys)}); add it to the dict "
                "batch() returns, or give the parameter a default")
    return ""


def _has_attention_core(attn: nn.Module) -> bool:
    """Whether ``attn``'s forward holds the core ``attention_kernel`` rewrites, softmax(q k^T * scale) v,
    rather than its own (``F.scaled_dot_product_attention``, a fused kernel): then the kernel knob is inert."""
    import copy

    from torch import fx

    from autoslapo.primitives.kernel import rewrite_attention
    from autoslapo.primitives.trace import trace_module

    try:
        gm = trace_module(attn)
        return rewrite_attention(fx.GraphModule(gm, copy.deepcopy(gm.graph))) > 0
    except Exception:  # untraceable: attention_kernel could not rewrite it either
        return False


def _numel(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


def _measure(um: UserModel, micro_batch: int) -> dict[str, Any]:
    """Build on meta, run one forward of ``micro_batch`` samples: parameters, FLOPs, saved activations."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = um.build()
    if isinstance(model, type):  # return Net instead of return Net()
        raise UsageError(f"build() must return an nn.Module instance: {um.module}.py's returned the class "
                         f"{model.__name__}; return an instance ({model.__name__}(...))")
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"build() must return an nn.Module: got {type(model).__name__} from {um.module}.py; "
                         "return the model (an instance of an nn.Module subclass)")
    blocks = user_blocks(model, um)
    tp_unit = _tp_unit(blocks, um.family, um)
    params = _numel(model)
    batch = um.batch(micro_batch, 0)
    if not isinstance(batch, dict) or not batch:
        raise UsageError(f"batch(micro_batch, seed) must return a non-empty dict of the forward's keyword inputs: "
                         f"got {type(batch).__name__} from {um.module}.py")
    rows = {k: int(v.shape[0]) for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim()}
    if not rows or set(rows.values()) != {micro_batch}:
        raise UsageError(f"batch({micro_batch}, seed) must return tensors of {micro_batch} rows (dim 0): got "
                         f"{rows} from {um.module}.py; slice its tensors by micro_batch")
    seq = batch.get("input_ids")
    seq_len = int(seq.shape[1]) if isinstance(seq, torch.Tensor) and seq.dim() >= 2 else 1
    meta_batch = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if problem := forward_keys_problem(model, list(batch), um.module):
        raise UsageError(problem)
    # Saved tensors per block: forward hooks say which block runs, a saved-tensor hook counts bytes.
    current: list[int] = [-1]
    saved = [0] * (len(blocks) + 1)  # the last slot: outside every block
    inputs = [0] * len(blocks)
    handles = []
    for i, block in enumerate(blocks):
        def pre(_m: Any, args: tuple[Any, ...], i: int = i) -> None:
            current[0] = i
            if args and isinstance(args[0], torch.Tensor):
                inputs[i] = args[0].numel() * args[0].element_size()

        def post(_m: Any, _a: Any, _o: Any) -> None:
            current[0] = -1
        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post)]

    # inside a block's attention module (the family's): saved bytes, what selective recomputation
    # keeps of them (the module's input, its products with weights) and the ops it would run again
    attn = {"in": False, "saved": 0, "kept": 0, "core_ops": 0}
    attn_paths = []
    calls: dict[str, Call] = {}  # the first block's attention and MLP inputs (the split checks)

    def attn_pre(_m: Any, args: tuple[Any, ...]) -> None:
        attn["in"] = True
        attn["kept"] += sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))

    def attn_post(_m: Any, _a: Any, _o: Any) -> None:
        attn["in"] = False
    if um.family is not None:
        for i, block in enumerate(blocks):
            mod = resolve_path(block, um.family.attention, "family.attention")
            handles += [mod.register_forward_pre_hook(attn_pre), mod.register_forward_hook(attn_post)]
            attn_paths.append(f"{um.layers}.{i}.{um.family.attention}")
        handles += capture_calls(blocks[0], um.family, calls) if blocks else []

    ops = [0] * (len(blocks) + 1)
    from autoslapo.primitives.checkpoint import LINEAR_OPS as linear  # what selective recomputation keeps

    class OpCount(TorchDispatchMode):
        # aten ops run per block: the kernel launches the cost model charges a fixed latency each
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            ops[current[0]] += 1
            out = func(*args, **(kwargs or {}))
            if attn["in"]:
                if func in linear:
                    attn["kept"] += out.numel() * out.element_size()
                else:
                    attn["core_ops"] += 1
            return out

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not (base.is_leaf and base.requires_grad):  # a parameter (or a view of one) is not an activation
            saved[current[0]] += t.numel() * t.element_size()
            if attn["in"]:
                attn["saved"] += t.numel() * t.element_size()
        return t

    counter = FlopCounterMode(display=False)
    try:
        with counter, OpCount(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(**meta_batch)
        user_loss(out)
    except ConfigError as exc:  # what the forward returned
        raise UsageError(f"{exc} (in {um.module}.py)") from exc
    except Exception as exc:
        raise UsageError(f"tracing {um.module}.py on the meta device failed: {type(exc).__name__}: {exc}; build() "
                         "must honour the ambient device and forward must avoid data-dependent Python control flow"
                         ) from exc
    finally:
        for h in handles:
            h.remove()
    counts = counter.get_flop_counts()
    total = sum(counter.get_flop_counts().get("Global", {}).values())
    block_flops = 0
    if um.layers is not None:
        for name, by_op in counts.items():
            tail = name.split(".", 1)[1] if "." in name else ""
            prefix, _, idx = tail.rpartition(".")
            if prefix == um.layers and idx.isdigit():
                block_flops += sum(by_op.values())
    n = max(len(blocks), 1)
    attn_flops = 0
    for name, by_op in counts.items():
        if name.split(".", 1)[-1] in attn_paths:
            attn_flops += sum(f for op, f in by_op.items() if all(op is not k.overloadpacket for k in linear))
    per = n * micro_batch
    if um.family is not None and um.shard_block is None and blocks and (
            wrong := attrs_value_problem(blocks[0], um.family, calls.get("attention"), um.module)):
        raise UsageError(wrong)  # a named integer that is no head count: divided, the ranks fail or run wrong
    split = ""  # whether tensor parallelism can split the attention and the MLP as the family describes them
    if um.family is not None and um.shard_block is None and blocks and tp_unit % CHECK_TP == 0:
        split = (split_attention_problem(blocks[0].get_submodule(um.family.attention), um.family,
                                         calls.get("attention"), um.module)
                 or split_mlp_problem(blocks[0], um.family, calls.get("mlp"), um.module))
    return {
        "tp_problem": split,
        "attn_core": int(um.family is not None and bool(blocks) and _has_attention_core(
            resolve_path(blocks[0], um.family.attention, "family.attention"))),
        "attn_act_bytes": attn["saved"] // per, "attn_kept_bytes": attn["kept"] // per,
        "attn_core_flops": attn_flops // per, "attn_core_ops": attn["core_ops"] // n,
        "layers": len(blocks) or 1, "tp_unit": tp_unit, "seq_len": seq_len, "params": params,
        "layer_params": sum(_numel(b) for b in blocks) // n if blocks else 0,
        "fwd_flops": total // micro_batch, "layer_fwd_flops": block_flops // n // micro_batch,
        "act_bytes": saved[-1] // micro_batch, "layer_act_bytes": sum(saved[:-1]) // n // micro_batch,
        "layer_input_bytes": sum(inputs) // n // micro_batch,
        "ops": sum(ops), "layer_ops": sum(ops[:-1]) // n,
        "tensors": len(list(model.parameters())),
        "layer_tensors": sum(len(list(b.parameters())) for b in blocks) // n if blocks else 0,
    }


def trace_user_model(um: UserModel) -> dict[str, Any]:
    """The measured shape of a model file (see the module docstring), cached by digest.

    Raises: UsageError when the model cannot be built or run on the meta device, or its batch is malformed.
    """
    path = model_cache_dir() / um.digest / f"trace-v{TRACE_VERSION}.json"
    if path.is_file():
        cached = dict(json.loads(path.read_text()))
        if set(TRACE_KEYS) <= set(cached):
            return cached
    shape = _measure(um, TRACE_MICRO_BATCH)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(shape, sort_keys=True))
    tmp.replace(path)
    return shape


def user_spec(path: str | os.PathLike[str]) -> ModelSpec:
    """The ``ModelSpec`` of a model file: loads it, traces it once (cached), names it by content.

    Raises: UsageError for a file that breaks a rule (see ``load_user_file`` and ``trace_user_model``).
    """
    um = load_user_file(path)
    shape = trace_user_model(um)
    unit = int(shape["tp_unit"])
    extra = {
        "module": um.module, "digest": um.digest, "layers": um.layers, "tp": um.tensor_parallel,
        "kernels": um.family is not None,
        # what the attention and fusion knobs can change: an attention core to rewrite, a bias + GeLU to fuse
        "attn_core": bool(shape["attn_core"]), "bias_gelu": um.family is not None and um.family.bias_gelu is not None,
        "tp_problem": str(shape.get("tp_problem", "")),  # the attention's split failed: tp > 1 refused
        **{k: int(shape[k]) for k in TRACE_KEYS if k not in ("layers", "tp_unit", "seq_len", "attn_core")},
    }
    return ModelSpec(family=USER_FAMILY, hidden=unit, layers=int(shape["layers"]), heads=unit, ffn=unit,
                     seq_len=int(shape["seq_len"]), vocab=1, preset=um.module, extra=extra)
