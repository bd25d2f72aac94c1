"""Optimizer-side set-up of a trial: DeepSpeed's engine (DP, ZeRO 0-3) or torch's (pipelines).

Without pipeline stages the model goes to ``deepspeed.initialize`` with a torch ``AdamW`` as the
client optimizer (no DeepSpeed op needs compiling) and an ``mpu`` built from
:func:`autoslapo.dist.build_groups`, so gradient averaging and ZeRO partitioning run over the
data-parallel group only and tensor-parallel shards stay where they are.

With pipeline stages (pp > 1) the stages come from ``torch.distributed.pipelining``, whose
schedule runs forward and backward itself; DeepSpeed's engine expects to own both (its own
``PipelineEngine`` wants a ``PipelineModule``), so the data-parallel part is torch's: gradients are
averaged over the dp group after the pipeline step, and ZeRO-1 is
``torch.distributed.optim.ZeroRedundancyOptimizer`` over that group. ZeRO-2/3 with a pipeline is
rejected before launch (see :mod:`autoslapo.runtime.check`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "DeepSpeedMPU",
    "average_gradients",
    "build_deepspeed_engine",
    "build_pipeline_optimizer",
    "deepspeed_config",
]


class DeepSpeedMPU:
    """The ``mpu`` object DeepSpeed asks for: model-parallel (= tensor-parallel) and data-parallel
    groups of this rank, from a :class:`autoslapo.dist.ParallelGroups`."""

    def __init__(self, groups: Any) -> None:
        self.groups = groups

    # model parallel == tensor parallel here (pipelines do not go through DeepSpeed's engine)
    def get_model_parallel_rank(self) -> int:
        return int(self.groups.tp_rank)

    def get_model_parallel_world_size(self) -> int:
        return int(self.groups.tp)

    def get_model_parallel_group(self) -> Any:
        return self.groups.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self) -> int:
        return int(self.groups.dp_rank)

    def get_data_parallel_world_size(self) -> int:
        return int(self.groups.dp)

    def get_data_parallel_group(self) -> Any:
        return self.groups.dp_group

    def get_pipeline_model_parallel_world_size(self) -> int:
        return int(self.groups.pp)

    def get_pipeline_model_parallel_rank(self) -> int:
        return int(self.groups.pp_rank)

    def get_pipeline_model_parallel_group(self) -> Any:
        return self.groups.pp_group


def deepspeed_config(config: Any, *, zero_stage: int | None = None) -> dict[str, Any]:
    """The DeepSpeed config dict for a ScheduleConfig (batch sizes, ZeRO stage, quiet logging).

    Precision is not given to DeepSpeed: the runtime runs fp32 weights under ``torch.autocast``.
    """
    stage = config.zero_stage if zero_stage is None else zero_stage
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        # Gather small tensors eagerly; tiny test models would otherwise fetch every bias one by one.
        zero["stage3_param_persistence_threshold"] = 0
        # DeepSpeed's "memory-efficient" linear replaces torch.nn.functional.linear for the rest of
        # the process, and adds the bias in place to the product's output. Selective recomputation
        # keeps that product (``checkpoint(keep="linear")``), so its recomputation would add the bias
        # a second time: wrong gradients for every Linear with a bias in a recomputed attention.
        zero["memory_efficient_linear"] = False
    return {
        "train_micro_batch_size_per_gpu": config.micro_batch,
        "gradient_accumulation_steps": config.grad_accum,
        "train_batch_size": config.micro_batch * config.grad_accum * config.dp,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _quiet_deepspeed(device_type: str) -> Any:
    import deepspeed

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    with_logger = getattr(deepspeed.utils, "logger", None)
    if with_logger is not None:
        with_logger.setLevel(logging.WARNING)
    if device_type == "cpu":
        # DeepSpeed's CPU all-reduce through /dev/shm is a C++ op compiled on first use (30-85 s)
        # that leaves shared-memory files behind; gloo's all-reduce does the same job.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


def build_deepspeed_engine(model: nn.Module, config: Any, groups: Any, *, lr: float,
                           device_type: str) -> Any:
    """Wrap ``model`` in a DeepSpeed engine with AdamW and the dp/tp ``mpu``.

    Takes: the built (sharded) model on its device, the ScheduleConfig, this rank's ParallelGroups,
    the learning rate and "cpu" or "cuda". Returns: the engine (call it, ``backward``, ``step``).
    """
    deepspeed = _quiet_deepspeed(device_type)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config=deepspeed_config(config),
        mpu=DeepSpeedMPU(groups),
        dist_init_required=False,
    )
    return engine


def build_pipeline_optimizer(params: list[nn.Parameter], config: Any, groups: Any, *, lr: float) -> Any:
    """AdamW for a pipeline stage's parameters; ZeRO-1 shards its state over the dp group.

    Returns: ``torch.optim.AdamW`` (ZeRO 0) or ``ZeroRedundancyOptimizer`` wrapping it (ZeRO 1).
    """
    if config.zero_stage == 1 and config.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.AdamW, process_group=groups.dp_group, lr=lr
        )
    return torch.optim.AdamW(params, lr=lr)


def average_gradients(params: list[nn.Parameter], group: Any, world: int) -> None:
    """Average the gradients of ``params`` over ``group`` (``world`` ranks), in flat buckets."""
    if world <= 1:
        return
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    grads = [p.grad for p in params if p.grad is not None]
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault((g.dtype, g.device), []).append(g)
    for bucket in by_dtype.values():
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat, group=group)
        flat.div_(world)
        for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            g.copy_(synced)
