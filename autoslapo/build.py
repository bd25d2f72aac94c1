"""``build``: turn a schedule into the runnable module, materializing meta-device models shard by shard.

Initialization scheme (why a rank can build only its shard yet match the unscheduled model): modules
are visited in ``named_modules`` order; for each module that still has meta tensors, full-size
tensors are allocated on CPU for *that module only*, the global RNG is seeded with
``sha256(f"{seed}/{module_path}")`` (inside ``torch.random.fork_rng``, so the caller's stream is
untouched), the module's initializer runs, and every parameter is then sliced to this rank's shard
(by its ShardSpec) and moved to ``device``. The values depend only on (seed, path, initializer),
never on the tensor-parallel degree or the order of other modules, so the unscheduled model built
with the same seed holds exactly the concatenation of all ranks' shards. Peak extra memory is one
module's full parameters (the largest is usually the embedding table).

Initializer, first that applies: ``init_weights(module)`` if given; the root model's
``_init_weights(module)`` (transformers models); ``module.reset_parameters()``; else normal(0, 0.02)
for parameters with 2+ dims and zeros for the rest (buffers are zeroed).

Pipeline stages: when the schedule has pipeline cuts (``root.meta["pipeline_cuts"]`` non-empty, or a
node with ``meta["pipeline_cut"]``), ``build`` materializes only the modules of this rank's stage(s)
of a meta model (same scheme; other stages stay on meta, so a model larger than one process's memory
builds across the pipeline) and returns ``autoslapo.pipeline.build_pipeline(root,
device=device, **pipeline_options)`` (``pp_group=``, ``grad_accum=``, ``schedule=``, ... pass
through), a PipelineRuntime. A parameter a stage shares with another (BERT's and GPT-2's tied
input/output embeddings) is initialized by its first holder in ``named_modules`` order, so the last
stage's copy equals the first stage's and the unscheduled model's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import nn

from autoslapo import pipeline
from autoslapo.errors import ScheduleError
from autoslapo.primitives.tp import SHARD_ATTR, ShardSpec, copy_param_attrs, slice_shard
from autoslapo.schedule import Schedule, origin_path

__all__ = ["build", "has_pipeline_cuts", "materialize", "path_seed"]

InitFn = Callable[[nn.Module], None]


def path_seed(seed: int, path: str) -> int:
    """Return the RNG seed for the module at ``path`` (stable across processes and machines)."""
    digest = hashlib.sha256(f"{seed}/{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def has_pipeline_cuts(sch: Schedule) -> bool:
    """True when the schedule asks for pipeline stages (see the module docstring)."""
    root = sch.root()
    if root.meta.get("pipeline_cuts"):
        return True
    return any(node.meta.get("pipeline_cut") for _, node in root.named_schedules())


def _fallback_init(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters(recurse=False):
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.zero_()


def _initializer(root: nn.Module, init_weights: InitFn | None) -> InitFn:
    if init_weights is not None:
        return init_weights
    hf_init = getattr(root, "_init_weights", None)

    def init(module: nn.Module) -> None:
        if callable(hf_init):
            hf_init(module)
        elif callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()  # type: ignore[operator]
        else:
            _fallback_init(module)

    return init


def _is_meta(t: torch.Tensor | None) -> bool:
    return t is not None and t.is_meta


def _select(
    modules: Collection[nn.Module] | None,
) -> tuple[set[int], set[int]] | None:
    if modules is None:
        return None
    mods = {id(m) for top in modules for m in top.modules()}
    params = {id(p) for top in modules for p in top.parameters()}
    return mods, params


def materialize(
    model: nn.Module,
    *,
    init_weights: InitFn | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    prefix: str = "",
    modules: Collection[nn.Module] | None = None,
) -> nn.Module:
    """Replace every meta tensor of ``model`` by real values, only this rank's shard of each.

    Takes: the module (a whole model, or a pipeline stage with ``prefix`` = its path in the full
    model so seeds match), the initializer, the seed, the target device and an optional floating
    dtype; ``modules``: submodules of ``model`` to materialize (default: all), e.g. this rank's
    pipeline stages. Everything else stays on meta, except parameters those submodules share with
    others (tied embeddings): such a parameter is initialized by the first module that holds it in
    ``model.named_modules()`` order, exactly as when the whole model is built.
    Returns: ``model`` (changed in place). Tied parameters stay tied.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    init = _initializer(model, init_weights)
    only = _select(modules)
    done: dict[int, nn.Parameter] = {}  # id(meta param) -> materialized param (keeps ties)
    for mpath, module in model.named_modules():
        own = module._parameters.items()
        if only is not None and id(module) not in only[0] and not any(
            p is not None and id(p) in only[1] for _, p in own
        ):
            continue
        metas = {
            n: p
            for n, p in own
            if _is_meta(p) and id(p) not in done and (only is None or id(p) in only[1])
        }
        tied = {n: p for n, p in own if p is not None and id(p) in done}
        bufs = {n: b for n, b in module._buffers.items() if _is_meta(b)}
        if only is not None and id(module) not in only[0]:
            bufs = {}  # a tie owner outside the selection: only the shared parameter is needed
        if not metas and not bufs:
            for n, p in tied.items():
                module._parameters[n] = done[id(p)]
            continue
        # seeded by the path the module had in the unscheduled model, wherever a primitive moved it
        origin = origin_path(module)
        full_path = origin if origin is not None else f"{prefix}.{mpath}".strip(".")
        olds = {**metas, **tied}
        for n, p in olds.items():
            spec: ShardSpec | None = getattr(p, SHARD_ATTR, None)
            shape = spec.full_shape if spec is not None else tuple(p.shape)
            module._parameters[n] = nn.Parameter(
                torch.zeros(shape, dtype=dtype or p.dtype), requires_grad=p.requires_grad
            )
        for n, b in bufs.items():
            module._buffers[n] = torch.zeros(b.shape, dtype=b.dtype)
        # Parameters left out of the selection stay meta while the initializer runs (a no-op there).
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(path_seed(seed, full_path))
            init(module)
        for n, old in olds.items():
            if id(old) in done:  # a tie materialized earlier wins; this module's copy is dropped
                module._parameters[n] = done[id(old)]
                continue
            spec = getattr(old, SHARD_ATTR, None)
            full = module._parameters[n]
            assert full is not None
            with torch.no_grad():
                local = slice_shard(full.data, spec) if spec is not None else full.data
                new = nn.Parameter(local.to(device), requires_grad=old.requires_grad)
            copy_param_attrs(old, new)  # ShardSpec, annotations, grad-sync flags and hooks
            module._parameters[n] = new
            done[id(old)] = new
        for n in bufs:
            buf = module._buffers[n]
            assert buf is not None
            module._buffers[n] = buf.to(device)
    return model


def _local_stages(root: Schedule, options: dict[str, Any]) -> list[nn.Module] | None:
    """This rank's stage modules, or None when the options do not say which rank this is."""
    pp_group = options.get("pp_group")
    if pp_group is None:  # build_pipeline will say what is missing
        return None
    return list(pipeline.local_stage_modules(root, pp_group, options.get("pp_rank"), options.get("adapter")))


def build(
    sch: Schedule,
    *,
    init_weights: InitFn | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **pipeline_options: Any,
) -> nn.Module:
    """Return the runnable module for schedule ``sch``.

    Takes: the schedule (any node; its root is built), an initializer for meta-device models, the
    seed, the device and an optional floating dtype. A model on a real device is returned as is
    (moved to ``device``/``dtype`` if given; its shards were sliced by ``shard``). A meta model is
    materialized as described in the module docstring. With pipeline cuts, the call goes to
    ``autoslapo.pipeline.build_pipeline`` with the same arguments.
    Raises: ScheduleError for options only a pipeline build accepts when there are no cuts.
    """
    root = sch.root()
    model = root.mod
    on_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    if has_pipeline_cuts(root):
        if on_meta:  # values by (seed, path), so every stage sees the same weights as one model would
            mine = _local_stages(root, pipeline_options)
            materialize(model, init_weights=init_weights, seed=seed, device=device, dtype=dtype, modules=mine)
            if dtype is not None:  # other stages' meta tensors too, so shared-parameter buffers agree
                model.to(dtype)
        return pipeline.build_pipeline(root, device=device, **pipeline_options)  # type: ignore[return-value]
    if pipeline_options:
        raise ScheduleError(
            f"build got options {sorted(pipeline_options)} that only a pipelined schedule takes, but the "
            f"schedule has no pipeline cuts; drop them or cut the model with cut_pipeline_stage"
        )
    if on_meta:
        materialize(model, init_weights=init_weights, seed=seed, device=device, dtype=dtype)
    else:
        if device is not None:
            model.to(device)
        if dtype is not None:
            model.to(dtype)
    return model
