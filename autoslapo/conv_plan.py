"""``apply_conv_schedule``: the knob-driven schedule of a convolutional family (WideResNet).

``autoslapo.plan.apply_schedule`` hands a convolutional family's model here (``FAMILIES[...]
["convolutional"]``). What it applies, after Slapo's WideResNet schedule:

1. tensor parallelism in every bottleneck block: ``conv1``'s output channels split over the tp group
   together with ``bn1`` (weight, bias, running mean and variance: each rank normalizes its own
   channels over the whole batch, so nothing changes), ``conv2``'s input channels split (row-parallel:
   each rank's partial sums are all-reduced before ``bn2``); the collectives of a column/row-parallel
   pair: identity forward and all-reduced input gradient at ``conv1``, all-reduce of ``conv2``'s
   output. The stem, ``conv3``, ``bn2``, ``bn3``, the shortcut and the classifier stay replicated;
2. ``channels_last``: the stem and every block run on NHWC feature maps (``Schedule.channels_last``),
   a pipeline stage's last block handing its output back in NCHW for the send;
3. activation checkpointing of ``config.checkpointed_layers(blocks)`` (ratio and placement over the
   blocks, within each pipeline chunk when pp > 1); ``compile_layers`` runs each block as a
   torch.compile region;
4. the pipeline cuts: pp x virtual stages chunks of blocks, as even as they can be (the stem on the first
   stage, pooling and the classifier on the last: ``autoslapo.models.adapters.wideresnet_adapter``).

Knobs that act on attention, tokens or a vocabulary (``Knob.transformer_only``) are refused for the
family by ``config.validate``.
Pure schedule code: no processes, no groups set up here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from autoslapo import layout
from autoslapo.errors import ScheduleError
from autoslapo.primitives.tp import ShardSpec, slice_shard

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec
    from autoslapo.schedule import Schedule

__all__ = ["BLOCKS_PATH", "apply_conv_schedule", "shard_batchnorm"]

#: Where a convolutional family keeps its blocks (``autoslapo.models.wideresnet.WideResNet.blocks``).
BLOCKS_PATH = "blocks"
_RUNNING_STATS = ("running_mean", "running_var")


def shard_batchnorm(node: Schedule) -> None:
    """Split a BatchNorm's channels over the group: weight and bias (``shard``) and running statistics.

    The running statistics are buffers (not trained, no gradient): each rank keeps the slice of its
    channels. Raises: ScheduleError when the node is not a BatchNorm.
    """
    mod = node.mod
    if not isinstance(mod, nn.modules.batchnorm._BatchNorm):
        raise ScheduleError(f"shard_batchnorm needs a BatchNorm: {node.path!r} is a {type(mod).__name__}")
    if mod.affine:
        node.shard("weight", 0)
        node.shard("bias", 0)
    for name in _RUNNING_STATS:
        buf = mod._buffers.get(name)
        if buf is not None:
            spec = ShardSpec(0, 1, tuple(buf.shape), node.group_size, node.rank, node.group)
            mod._buffers[name] = slice_shard(buf.detach(), spec)
    mod.num_features //= node.group_size


def _shard_conv(node: Schedule, axis: int) -> None:
    mod = node.mod
    if not isinstance(mod, nn.Conv2d) or mod.groups != 1:
        raise ScheduleError(f"a tensor-parallel conv must be an ungrouped nn.Conv2d: {node.path!r} is {mod!r}")
    node.shard("weight", axis)
    if axis == 0:
        mod.out_channels //= node.group_size
    else:
        mod.in_channels //= node.group_size


def _shard_block(block: Schedule) -> None:
    _shard_conv(block["conv1"], 0)
    shard_batchnorm(block["bn1"])
    _shard_conv(block["conv2"], 1)
    # Megatron's "f" and "g": conv1's input gradient summed over the group (the shortcut's part of
    # the block input's gradient is replicated and added outside), conv2's partial sums summed.
    block["conv1"].sync("bwd_post", "all_reduce")
    block["conv2"].sync("fwd_post", "all_reduce")


def apply_conv_schedule(sch: Schedule, spec: ModelSpec, config: ScheduleConfig, *,
                        compiler: str = "inductor") -> Schedule:
    """Apply the convolutional family's schedule (see the module docstring) to ``sch`` (the model's root).

    Takes: the root schedule (its group is the tp group), the spec, the knobs (already validated
    against the spec), the compiler for ``compile_layers``. Returns: the root; ``root.meta["plan"]``
    records what was applied. Raises: ScheduleError when the model lacks ``blocks`` or has another
    number of them than the spec, or when the group size differs from ``config.tp``.
    """
    if sch.group_size != config.tp:
        raise ScheduleError(
            f"the schedule's tensor-parallel group has {sch.group_size} ranks but config.tp={config.tp}; "
            "pass groups=build_groups(tp, pp, dp) or create_schedule(model, group=<tp group>)"
        )
    if BLOCKS_PATH not in sch or len(sch[BLOCKS_PATH].children) != spec.layers:
        raise ScheduleError(
            f"a {spec.family} model keeps its {spec.layers} blocks at {BLOCKS_PATH!r}, which this model lacks; "
            f"build it from the same spec with autoslapo.models.build_model"
        )
    blocks = [sch[BLOCKS_PATH][str(i)] for i in range(spec.layers)]
    if config.tp > 1:
        for block in blocks:
            _shard_block(block)
    # pipeline chunks as even as they can be, the smaller at the ends (layout.chunk_sizes)
    bounds = layout.chunk_bounds(spec.layers, config.pp * config.virtual_stages)
    cuts = [b - 1 for _, b in bounds[:-1]]
    if config.channels_last:  # every block's input made NHWC; a stage's last block sends NCHW
        sch["stem"].channels_last()
        for i, block in enumerate(blocks):
            block.channels_last(contiguous_output=i in cuts)
    # the ratio and placement within each chunk, as autoslapo.plan does for transformer layers
    ckpt = [a + i for a, b in bounds for i in config.checkpointed_layers(b - a)]
    for i in ckpt:
        blocks[i].checkpoint()
    if config.compile_layers:
        backend = "aot_eager" if compiler == "eager" else compiler
        for block in blocks:
            block.fuse(compiler=backend)
    for i in cuts:  # a stage ends after these blocks (autoslapo.models.adapters.wideresnet_adapter)
        blocks[i].cut_pipeline_stage()
    plan: dict[str, Any] = {
        "family": spec.family, "config": config.to_dict(), "skipped": [], "tp": config.tp,
        "sharded": ["conv1", "bn1", "conv2"] if config.tp > 1 else [], "checkpointed": ckpt,
        "compiled_layers": config.compile_layers, "pipeline_cuts": cuts, "channels_last": config.channels_last,
        "stages": [[a, b] for a, b in bounds],
    }
    sch.meta["plan"] = plan
    return sch
