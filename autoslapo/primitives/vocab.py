"""Tensor parallelism over the vocabulary: a vocab-parallel embedding and output layer.

``vocab_parallel`` shards an embedding's rows (padding the vocabulary to a multiple of the group
size, as Megatron does) and all-reduces the masked lookups; ``vocab_parallel_head`` shards the
output layer and gathers the logits, unless ``vocab_parallel_loss`` computes the loss from shards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autoslapo.errors import ScheduleError
from autoslapo.primitives import comm
from autoslapo.primitives.sync import map_output
from autoslapo.primitives.tp import ShardSpec, shard, shard_spec

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = ["vocab_parallel", "vocab_parallel_head"]


def vocab_parallel(sch: Schedule, param_name: str = "weight", *, pad: bool = True) -> ShardSpec:
    """Make an embedding vocab-parallel: shard rows, zero ids owned by other ranks, all-reduce.

    Takes: the embedding table's parameter name (rows = vocabulary); ``pad``: a vocabulary that
    the group size does not divide (BERT's 30522 on tp=8) is padded with zero rows to the next
    multiple, Megatron's ``make_vocab_size_divisible_by``; no id ever selects them, and a tied
    output layer drops their logits (:func:`vocab_parallel_head`). ``pad=False`` makes such a
    vocabulary an error instead. The module must look rows up by its first input
    (``nn.Embedding``); a ``padding_idx`` is moved to local numbering.
    A table tied to one already made vocab-parallel (T5's encoder and decoder share one) keeps that
    shard and gets the lookup hooks. Returns: the ShardSpec. Raises: ScheduleError as ``shard`` does,
    for a tied table sharded along another axis, or for a module already made vocab-parallel.
    """
    if "vocab_parallel" in sch.meta:
        raise ScheduleError(f"{sch.path or '<root>'!r} is already vocab-parallel; call vocab_parallel once a module")
    param = sch.mod._parameters.get(param_name)
    spec = (shard_spec(param) if param is not None else None) or shard(sch, param_name, 0, pad=pad)
    if spec.axis != 0:
        raise ScheduleError(
            f"vocab_parallel needs the table sharded along the vocabulary (axis 0): {sch.path!r} is "
            f"sharded along axis {spec.axis}"
        )
    mod, group, world = sch.mod, sch.group, sch.group_size
    part = (spec.full_shape[0] + spec.pad) // world
    start = sch.rank * part
    if hasattr(mod, "num_embeddings"):
        setattr(mod, "num_embeddings", part)  # noqa: B010  (an int attribute, not a submodule)
    pad_idx = getattr(mod, "padding_idx", None)
    if isinstance(pad_idx, int):
        setattr(mod, "padding_idx", pad_idx - start if start <= pad_idx < start + part else None)  # noqa: B010
    sch.meta["vocab_parallel"] = {"start": start, "size": part, "vocab": spec.full_shape[0], "pad": spec.pad}
    if world == 1:
        return spec
    masks: list[torch.Tensor] = []

    def pre_hook(_m: nn.Module, args: tuple[Any, ...]) -> Any:
        ids = args[0]
        mask = (ids < start) | (ids >= start + part)
        masks.append(mask)
        return ((ids - start).masked_fill(mask, 0), *args[1:])

    def post_hook(_m: nn.Module, _args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
        mask = masks.pop()
        out = out.masked_fill(mask.unsqueeze(-1), 0.0)
        return comm.apply(out, "all_reduce", group=group)

    sch.meta.setdefault("hooks", []).extend(
        [mod.register_forward_pre_hook(pre_hook), mod.register_forward_hook(post_hook)]
    )
    return spec


def vocab_parallel_head(sch: Schedule, *, pad: bool = True) -> ShardSpec:
    """Make an output layer (``nn.Linear``, weight ``[vocab, hidden]``) vocab-parallel.

    Shards the weight and bias rows (a weight tied to a ``vocab_parallel`` embedding already is),
    padded like :func:`vocab_parallel`; all-gathers the logits over the group and drops the padded
    columns, so the output has the true vocabulary size (unless ``vocab_parallel_loss`` on the
    model computes the loss from the shards); sums the input gradient over the group.
    Returns: the weight's ShardSpec. Raises: ScheduleError for a module without a 2-D weight, or a
    weight sharded along another axis.
    """
    mod = sch.mod
    weight = mod._parameters.get("weight")
    if weight is None or weight.dim() != 2:
        raise ScheduleError(
            f"vocab_parallel_head needs a module with a 2-D weight [vocab, hidden]: {type(mod).__name__} at "
            f"{sch.path or '<root>'!r} has {None if weight is None else tuple(weight.shape)}"
        )
    spec = shard_spec(weight) or shard(sch, "weight", 0, pad=pad)
    if spec.axis != 0:
        raise ScheduleError(
            f"vocab_parallel_head needs the weight sharded along the vocabulary (axis 0): {sch.path!r} "
            f"is sharded along axis {spec.axis}"
        )
    bias = mod._parameters.get("bias")
    if bias is not None and shard_spec(bias) is None:
        shard(sch, "bias", 0, pad=pad)
    local = mod._parameters["weight"]  # the shard (``shard`` swapped the parameter object)
    if isinstance(getattr(mod, "out_features", None), int) and local is not None:
        setattr(mod, "out_features", local.shape[0])  # noqa: B010  (an int attribute)
    vocab, group = spec.full_shape[0], sch.group
    # ``gather`` is switched off by ``vocab_parallel_loss`` for a call whose loss it computes itself
    info = {"vocab": vocab, "pad": spec.pad, "gather": True}
    sch.meta["vocab_parallel_head"] = info
    if sch.group_size == 1:
        return spec

    def post_hook(_m: nn.Module, _args: tuple[Any, ...], out: Any) -> Any:
        if not info["gather"]:
            return out

        def gather(t: torch.Tensor) -> torch.Tensor:
            full = comm.apply(t, "all_gather", dim=-1, group=group)
            return full.narrow(-1, 0, vocab) if spec.pad else full

        return map_output(out, 0, gather)

    sch.sync("bwd_post", "all_reduce")
    sch.meta.setdefault("hooks", []).append(mod.register_forward_hook(post_hook))
    return spec
