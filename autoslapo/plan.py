"""``apply_schedule``: the one knob-driven schedule that serves every model family.

Reads the family's :class:`~autoslapo.models.families.FamilyDescription` (where attention, MLP,
norms, embeddings and the layer list live) and a :class:`~autoslapo.config.ScheduleConfig`, and
applies primitives to the schedule tree, in this order:

1. tensor parallelism (Megatron layout): q/k/v (or the fused q|k|v, block-wise) and the MLP's input
   projections column-parallel, the attention output and MLP output projections row-parallel, the
   head counts a forward reads shrunk; the token embedding and LM head vocabulary-parallel (the
   vocabulary padded to a multiple of tp) and, for a call with labels, the loss computed from the
   logits' vocabulary shards (``vocab_parallel_loss``); with ``loss_kernel="chunked"`` (any tp) the
   loss is computed chunk by chunk from the head's input, never holding all the logits;
2. bias + GeLU fusion (``fuse_bias_gelu``), before any hook goes on the traced modules, and the
   RMSNorm kernel (``norm_kernel``: every RMSNorm of the model run as one op);
3. the collectives: at the input of each column-parallel region an identity whose gradient is
   all-reduced, at the output of each row-parallel one an all-reduce. With ``sequence_parallel``
   the residual stream between layers is split along the sequence: the inputs of attention and MLP
   are all-gathered (gradient: reduce-scatter), the outputs reduce-scattered, the norms in a layer
   get their gradients summed, and each pipeline chunk splits the sequence at its first layer and
   gathers it after its last (so a stage boundary carries whole sequences);
4. the attention kernel; activation checkpointing of ``config.checkpointed_layers`` (of each
   pipeline chunk's layers when pp > 1; of a shared layer's calls, ALBERT): the whole layer, or with
   ``ckpt_granularity="selective"``
   its attention module keeping the linear layers' outputs (only the attention core recomputed); ``compile_layers``; the pipeline cuts (pp x virtual stages).

A convolutional family (WideResNet) has no attention, MLP or vocabulary: its schedule (bottleneck
tensor parallelism, block checkpointing) is ``autoslapo.conv_plan.apply_conv_schedule``.

Pure schedule code: it starts no processes and sets up no groups (the runtime, the verify command
and the tests pass the tensor-parallel group in ``groups`` or on the schedule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from autoslapo import layout
from autoslapo.conv_plan import apply_conv_schedule
from autoslapo.errors import ScheduleError
from autoslapo.models.families import FamilyDescription, family_description
from autoslapo.models.spec import is_convolutional
from autoslapo.models.user import USER_FAMILY, load_user_model
from autoslapo.pipeline import STAGE_BUILDER_KEY
from autoslapo.primitives.norm import is_rms_norm
from autoslapo.schedule import Schedule, create_schedule
from autoslapo.user_pipeline import block_output_arity, build_user_stages

#: What a checkpointed module keeps for each ``ckpt_granularity`` (``primitives.checkpoint``'s ``keep``):
#: selective keeps its attention module's linear outputs, op the layer's fused attention output and
#: every other linear output, full nothing but the layer's input.
CKPT_KEEP = {"full": "nothing", "selective": "linear", "op": "alternate"}

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec

__all__ = ["apply_schedule", "checkpointed_layers", "chunk_bounds", "cut_points"]


def chunk_bounds(layers: int, chunks: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``chunks`` pipeline chunks of ``layers`` layers: equal when ``chunks``
    divides ``layers``, else the smaller ones at the pipeline's ends (``autoslapo.layout.chunk_sizes``);
    with one or two chunks more than layers the first, then also the last, holds none (the embeddings
    alone, the head alone: ``layout.pp_problem`` says which families may).

    Raises: ScheduleError unless ``1 <= chunks <= layers + 2``.
    """
    if chunks < 1 or chunks > layers + 2:
        raise ScheduleError(
            f"pipeline chunks must each hold a layer, but the first and the last: got {layers} layers into "
            f"{chunks} chunks; use pp * virtual_stages <= {layers + 2}"
        )
    return layout.chunk_bounds(layers, chunks)


def cut_points(layers: int, chunks: int) -> list[int]:
    """Indices of the layers after which a pipeline stage ends (``chunks - 1`` of them; -1 for a first
    chunk without layers, which ends before layer 0)."""
    return [stop - 1 for _, stop in chunk_bounds(layers, chunks)[:-1]]


def checkpointed_layers(spec: ModelSpec, config: ScheduleConfig) -> list[int]:
    """The layer indices ``apply_schedule`` checkpoints.

    With one pipeline chunk: ``config.checkpointed_layers(spec.layers)``. With several, the ratio and
    placement apply within each chunk (every stage then holds about the same activations). An
    encoder-decoder's blocks are numbered encoder first, then decoder (``spec.blocks`` in all).
    """
    chunks = config.pp * config.virtual_stages
    out: list[int] = []
    for start, stop in chunk_bounds(spec.blocks if spec.encoder_decoder else spec.layers, chunks):
        out.extend(start + i for i in config.checkpointed_layers(stop - start))
    return out


# -- tensor-parallel building blocks -------------------------------------------------------------


def _is_conv1d(mod: nn.Module) -> bool:
    # transformers' Conv1D (GPT-2) stores its weight as [in, out], the transpose of nn.Linear.
    from transformers.pytorch_utils import Conv1D

    return isinstance(mod, Conv1D)


def _shard_column(node: Schedule, chunks: int = 1) -> None:
    """Column-parallel: shard the output features (block-wise for a fused q|k|v)."""
    conv = _is_conv1d(node.mod)
    node.shard("weight", 1 if conv else 0, chunks=chunks)
    if getattr(node.mod, "bias", None) is not None:
        node.shard("bias", 0, chunks=chunks)
    if conv:
        node.shrink_attr("nf")
    elif isinstance(node.mod, nn.Linear):
        node.mod.out_features //= node.group_size


def _shard_row(node: Schedule) -> None:
    """Row-parallel: shard the input features; the bias stays whole (``sync`` counts it once)."""
    conv = _is_conv1d(node.mod)
    node.shard("weight", 0 if conv else 1)
    if conv:
        node.shrink_attr("nx")
    elif isinstance(node.mod, nn.Linear):
        node.mod.in_features //= node.group_size


def _shard_layer(layer: Schedule, desc: FamilyDescription, first: bool = False) -> None:
    for path in desc.qkv:
        _shard_column(layer[path], desc.qkv_chunks)
    if desc.attention_attrs:
        layer[desc.attention].shrink_attr(*desc.attention_attrs)
    _shard_row(layer[desc.attn_out])
    if first and desc.position_bias is not None:
        # T5's relative-position table [buckets, heads]: each rank keeps its heads' columns
        table = layer[desc.position_bias]
        table.shard("weight", 1)
        table.shrink_attr("embedding_dim")
    if desc.cross_attention is not None and desc.cross_attn_out is not None:
        for path in desc.cross_qkv:
            _shard_column(layer[path])
        if desc.attention_attrs:
            layer[desc.cross_attention].shrink_attr(*desc.attention_attrs)
        _shard_row(layer[desc.cross_attn_out])
    for path in desc.mlp_in:
        _shard_column(layer[path])
    _shard_row(layer[desc.mlp_out])


def _sync_layer(layer: Schedule, desc: FamilyDescription, seq_parallel: bool) -> None:
    attn_entries: tuple[tuple[str, int | str], ...] = (
        tuple((path, 0) for path in desc.attention_entries) or ((desc.attention, desc.attention_input),)
    )
    regions = (
        (attn_entries, desc.attn_out, 1),
        (((desc.mlp_input, 0),), desc.mlp_out, desc.mlp_seq_dim),
    )
    for entries, exit_, seq_dim in regions:
        for entry, index in entries:
            if seq_parallel:
                layer[entry].sync("fwd_pre", "all_gather", dim=seq_dim, bwd="reduce_scatter", index=index)
            else:
                # Megatron's "f": identity forward, all-reduced input gradient at the entry
                layer[entry].sync("bwd_post", "all_reduce", index=index)
        # Megatron's "g": the partial sums reduced (or reduce-scattered) at the exit
        if seq_parallel:
            layer[exit_].sync("fwd_post", "reduce_scatter", dim=seq_dim)
        else:
            layer[exit_].sync("fwd_post", "all_reduce")
    if desc.cross_attention is not None and desc.cross_attn_out is not None:
        # q reads the decoder's hidden states, k and v the encoder's output: both inputs' gradients
        # are partial sums over the heads' shards (sequence parallelism is refused for T5)
        layer[desc.cross_attention].sync("bwd_post", "all_reduce", index=0)
        layer[desc.cross_attention].sync("bwd_post", "all_reduce", index=desc.cross_kv_input)
        layer[desc.cross_attn_out].sync("fwd_post", "all_reduce")
    if seq_parallel:
        for path in desc.norms:
            layer[path].allreduce_grads()


def _vocab_parallel(sch: Schedule, desc: FamilyDescription, causal: bool, kernel: str) -> None:
    # A vocabulary tp does not divide (BERT's 30522 on tp=8) is padded to the next multiple, as
    # Megatron does. A call with labels computes the loss from the logits' vocabulary shards
    # (Megatron's vocab-parallel cross-entropy); one without gathers whole logits and drops the pad.
    for stack in desc.stacks():  # an encoder-decoder's two stacks share one table (T5)
        sch[stack.embed_tokens].vocab_parallel()
    sch[desc.lm_head].vocab_parallel_head()
    sch.vocab_parallel_loss(desc.lm_head, causal=causal, kernel=kernel)


# -- fusion ---------------------------------------------------------------------------------------


def _gelu_chain() -> tuple[tuple[type, ...], tuple[Any, ...]]:
    import torch.nn.functional as F
    from transformers.activations import GELUActivation, NewGELUActivation
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D), (nn.GELU, GELUActivation, NewGELUActivation, F.gelu)


def _fuse_bias_gelu(layer: Schedule, desc: FamilyDescription, compiler: str) -> bool:
    if desc.bias_gelu is None:
        return False
    from transformers.activations import GELUActivation, NewGELUActivation
    from transformers.pytorch_utils import Conv1D

    node = layer[desc.bias_gelu]
    # Keep the projections and activations opaque so the sync hooks on them stay callable.
    node.trace(leaf_modules=[Conv1D, GELUActivation, NewGELUActivation])
    matches = node.find(_gelu_chain())
    if len(matches) != 1:
        raise ScheduleError(
            f"fuse_bias_gelu expects one Linear -> GeLU in {node.path!r}: found {len(matches)}; "
            f"check the {desc.name!r} family description's bias_gelu path"
        )
    node.fuse(matches[0], compiler=compiler, name="bias_gelu")
    return True


# -- the schedule ---------------------------------------------------------------------------------


def _root(sch_or_model: Schedule | nn.Module, groups: Any) -> Schedule:
    if isinstance(sch_or_model, Schedule):
        return sch_or_model
    if isinstance(sch_or_model, nn.Module):
        return create_schedule(sch_or_model, group=getattr(groups, "tp_group", None))
    raise ScheduleError(f"apply_schedule needs a Schedule or an nn.Module: got {type(sch_or_model).__name__}")


def apply_schedule(
    sch_or_model: Schedule | nn.Module,
    spec: ModelSpec,
    config: ScheduleConfig,
    groups: Any = None,
    *,
    compiler: str = "inductor",
) -> Schedule:
    """Apply the knob-driven schedule for ``spec``'s family to a model built by ``build_model``.

    Takes: the model or its schedule root; the model's spec; the knobs; ``groups`` (a
    ``ParallelGroups``: its ``tp_group`` becomes the schedule's group when a model is given);
    ``compiler`` for ``fuse_bias_gelu`` and ``compile_layers`` ("inductor"; "eager" rewrites
    without generating code, and compiles layers with "aot_eager").
    Returns: the schedule root; ``root.meta["plan"]`` records what was applied (and what was not,
    under ``skipped``: e.g. ``fuse_bias_gelu`` on a family without bias + GeLU).
    Raises: ConfigError when the knobs do not fit the model (``config.validate``); ScheduleError
    when the model does not match the spec or the schedule's group size differs from ``config.tp``.
    """
    config.validate(spec)
    if is_convolutional(spec.family):
        return apply_conv_schedule(_root(sch_or_model, groups), spec, config, compiler=compiler)
    sch = _root(sch_or_model, groups)
    if sch.group_size != config.tp:
        raise ScheduleError(
            f"the schedule's tensor-parallel group has {sch.group_size} ranks but config.tp={config.tp}; "
            "pass groups=build_groups(tp, pp, dp) or create_schedule(model, group=<tp group>)"
        )
    if spec.family == USER_FAMILY:
        return _apply_user_schedule(sch, spec, config, compiler)
    desc = family_description(spec)
    # every stored block with the description of its stack (an encoder-decoder: encoder blocks, then
    # the decoder's; shared layers (ALBERT): the one layer)
    blocks: list[tuple[Schedule, FamilyDescription]] = []
    for stack, count in zip(desc.stacks(), (spec.stored_layers, spec.decoder_layers), strict=False):
        if stack.layers not in sch:
            raise ScheduleError(
                f"a {spec.family} model keeps its layers at {stack.layers!r}, which this model lacks; "
                f"build it with autoslapo.models.build_model({spec.preset!r})"
            )
        layer_list = sch[stack.layers]
        if len(layer_list.children) != count:
            raise ScheduleError(
                f"the model has {len(layer_list.children)} layers but the spec says {count} (at "
                f"{stack.layers!r}); build the model from the same spec"
            )
        blocks.extend((layer_list[str(i)], stack) for i in range(count))
    # calls[i] is the block layer call i runs: with shared layers (ALBERT) every encoder call is the
    # one layer, which is sharded, synced and compiled once and checkpointed by call.
    stored = spec.stored_layers
    calls = [blocks[min(i, stored - 1)] for i in range(spec.layers)] + blocks[stored:]
    layers = [layer for layer, _ in calls]
    tp = config.tp
    plan: dict[str, Any] = {"family": desc.name, "config": config.to_dict(), "skipped": []}

    # 1. shard parameters (before any hook, so fusion below sees the final parameter objects)
    if tp > 1:
        for n, (layer, stack) in enumerate(blocks):
            _shard_layer(layer, stack, first=n in (0, stored))
    vocab_parallel = tp > 1

    # 2. fusion
    if config.fuse_bias_gelu:
        if desc.bias_gelu is None:
            plan["skipped"].append(f"fuse_bias_gelu: the {desc.name} MLP has no bias + GeLU")
        else:
            for layer, stack in blocks:
                _fuse_bias_gelu(layer, stack, compiler)
    norms = [node for _, node in sch.named_schedules() if is_rms_norm(node.mod)]
    if config.norm_kernel != "eager":  # config.validate refused it above for a family without RMSNorms
        for node in norms:  # every RMSNorm: the layers' and the stacks' final ones
            node.rms_norm_kernel(config.norm_kernel)

    # 3. collectives
    chunks = chunk_bounds(len(layers), config.pp * config.virtual_stages)
    if tp > 1:
        for layer, stack in blocks:
            _sync_layer(layer, stack, config.sequence_parallel)
        if vocab_parallel:
            _vocab_parallel(sch, desc, spec.causal, config.loss_kernel)
        if config.sequence_parallel:
            for start, stop in chunks:
                if start == stop:  # a chunk of the embeddings or the head alone
                    continue
                layers[start].sync("fwd_pre", "split", dim=1)
                layers[stop - 1].sync("fwd_post", "all_gather", dim=1)

    if tp == 1 and config.loss_kernel == "chunked":
        # the chunked loss takes the head's input: no call with labels holds tokens x V logits
        sch.vocab_parallel_loss(desc.lm_head, causal=spec.causal, kernel="chunked")

    # 4. kernel, checkpointing, compilation, pipeline cuts
    sch.attention_kernel(config.attn_kernel)
    ckpt = checkpointed_layers(spec, config)
    if spec.shared_layers and ckpt:
        # one module runs every layer call (ALBERT): checkpoint the chosen calls of it
        selective = config.ckpt_granularity == "selective"
        target = layers[0][desc.attention] if selective else layers[0]
        target.checkpoint(keep=CKPT_KEEP[config.ckpt_granularity], calls=ckpt, period=spec.layers)
    for i in [] if spec.shared_layers else ckpt:
        if config.ckpt_granularity == "selective":
            # Korthikanti et al.'s selective recomputation: only the attention core is recomputed.
            layers[i][calls[i][1].attention].checkpoint(keep="linear")
        else:
            # the whole layer: recomputed from its input (full), or per op (what the policy keeps)
            layers[i].checkpoint(keep=CKPT_KEEP[config.ckpt_granularity])
    if config.compile_layers:
        backend = "aot_eager" if compiler == "eager" else compiler
        for layer, _ in blocks:
            layer.fuse(compiler=backend)
    cuts = cut_points(len(layers), config.pp * config.virtual_stages)
    if cuts and desc.decoder is not None:
        # one layer list over both stacks: cuts within either, or between them
        sch.join_layer_lists([stack.layers for stack in desc.stacks()])
    for i in cuts:
        if spec.shared_layers:  # stages run calls [a, b) of the one layer
            layers[i].cut_pipeline_stage(call=i, calls=spec.layers)
        elif i < 0:  # the first chunk holds the embeddings alone
            layers[0].cut_pipeline_stage(before=True)
        else:
            layers[i].cut_pipeline_stage()

    plan.update(
        tp=tp,
        vocab_parallel=vocab_parallel,
        sequence_parallel=config.sequence_parallel and tp > 1,
        loss_kernel=config.loss_kernel,
        checkpointed=ckpt,
        ckpt_granularity=config.ckpt_granularity,
        pipeline_cuts=cuts,
        stages=[list(b) for b in chunks],
        attn_kernel=config.attn_kernel,
        fused_bias_gelu=config.fuse_bias_gelu and desc.bias_gelu is not None,
        norm_kernel=config.norm_kernel if norms else None,
        compiled_layers=config.compile_layers,
    )
    sch.meta["plan"] = plan
    return sch


# -- the user's own module ------------------------------------------------------------------------


def _apply_user_schedule(sch: Schedule, spec: ModelSpec, config: ScheduleConfig, compiler: str) -> Schedule:
    """The schedule of a user's module (``autoslapo.models.user``): what its file declares allows.

    Its ``family`` (paths inside one block) brings tensor parallelism of the blocks (the embeddings
    and head stay whole on every rank, the loss is the module's own; or its own ``shard_block``), the attention kernel (the
    block's attention core rewritten) and bias + GeLU fusion; its ``layers`` brings checkpointing
    and pipeline cuts between blocks (stages that run its own forward: ``autoslapo.user_pipeline``),
    and with both, selective recomputation (the family's attention module of each checkpointed block,
    keeping its products with weights). Sequence parallelism and the chunked loss are not offered for
    a user's module.
    """
    um = load_user_model(spec)
    desc = um.family
    selective = config.ckpt_granularity == "selective" and config.ckpt_ratio > 0
    unsupported = layout.user_unsupported(config)
    if unsupported:
        raise ScheduleError(f"a user's module ({um.module}.py) cannot take {', '.join(unsupported)}; "
                            "leave those knobs at their defaults")
    needs = [(config.tp > 1 and not um.tensor_parallel, "family", f"tp={config.tp}"),
             (selective and desc is None, "family", "ckpt_granularity=selective"),
             (config.ckpt_ratio > 0 and um.layers is None, "layers", f"ckpt_ratio={config.ckpt_ratio:g}"),
             (config.pp > 1 and um.layers is None, "layers", f"pp={config.pp}")]
    for on, name, what in needs:
        if on:
            raise ScheduleError(f"{what} needs the model file to declare {name}: {um.module}.py has none; "
                                f"add {name} = ... to it (see README, 'Your own model')")
    layers: list[Schedule] = []
    if um.layers is not None:
        if um.layers not in sch:
            raise ScheduleError(f"layers {um.layers!r} is not a submodule of this {type(sch.mod).__name__}; "
                                f"build the model with {um.module}.build()")
        layer_list = sch[um.layers]
        layers = [layer_list[str(i)] for i in range(len(layer_list.children))]
    plan: dict[str, Any] = {"family": USER_FAMILY, "module": um.module, "config": config.to_dict(), "skipped": []}
    if desc is not None and config.tp > 1:
        for layer in layers:
            _shard_layer(layer, desc)
    if um.shard_block is not None and config.tp > 1:
        for layer in layers:  # the file's own tensor parallelism: shards and collectives of one block
            um.shard_block(layer)
    fused = False
    if config.fuse_bias_gelu:
        if desc is None or desc.bias_gelu is None:
            plan["skipped"].append(f"fuse_bias_gelu: {um.module}.py describes no bias + GeLU")
        else:
            for layer in layers:
                fused = _fuse_bias_gelu(layer, desc, compiler)
    core = desc is not None and bool(spec.extra.get("attn_core", True))
    if desc is not None and core:
        # the attention core of each block, rewritten (sdpa/flash) or left as written (eager); before
        # the collectives so their hooks go on the module that runs
        for layer in layers:
            layer[desc.attention].attention_kernel(config.attn_kernel)
    elif config.attn_kernel != "eager":
        why = "describes no attention" if desc is None else "has no softmax(q k^T) v core to rewrite (it runs as written)"
        plan["skipped"].append(f"attn_kernel {config.attn_kernel}: {um.module}.py {why}")
    if desc is not None and config.tp > 1:
        for layer in layers:
            _sync_layer(layer, desc, seq_parallel=False)
    ckpt = checkpointed_layers(spec, config) if layers else []  # within each pipeline chunk
    for i in ckpt:
        if selective and desc is not None:  # only the attention core runs again (Korthikanti et al. 2022)
            layers[i][desc.attention].checkpoint(keep="linear")
        else:
            layers[i].checkpoint()
    chunks = config.pp * config.virtual_stages
    cuts = cut_points(len(layers), chunks) if chunks > 1 else []
    for i in cuts:
        layers[i].cut_pipeline_stage()
    if cuts:
        # every stage runs the file's forward; the batch's tensors travel between stages in this order
        keys, arity = tuple(um.batch(1, 0)), block_output_arity(um)
        sch.meta[STAGE_BUILDER_KEY] = lambda model, path, bounds: build_user_stages(model, path, bounds, keys, arity)
    plan.update(tp=config.tp, vocab_parallel=False, sequence_parallel=False, loss_kernel="eager",
                checkpointed=ckpt, ckpt_granularity=config.ckpt_granularity, pipeline_cuts=cuts,
                stages=[list(b) for b in chunk_bounds(max(len(layers), 1), chunks)] if cuts else [[0, len(layers)]], attn_kernel=config.attn_kernel if core else "as written",
                fused_bias_gelu=fused, compiled_layers=False)
    sch.meta["plan"] = plan
    return sch
