"""Optimizer-side set-up of a trial: DeepSpeed's engine (DP, ZeRO 0-3) or torch's (pipelines).

Without pipeline stages the model goes to ``deepspeed.initialize`` with a torch ``AdamW`` as the
client optimizer (no DeepSpeed op needs compiling) and an ``mpu`` built from
:func:`autoslapo.dist.build_groups`, so gradient averaging and ZeRO partitioning run over the
data-parallel group only and tensor-parallel shards stay where they are.

With pipeline stages (pp > 1) the stages come from ``torch.distributed.pipelining``, whose
schedule runs forward and backward itself; DeepSpeed's engine expects to own both (its own
``PipelineEngine`` wants a ``PipelineModule``), so the data-parallel part is torch's: gradients are
averaged over the dp group after the pipeline step, and ZeRO-1 is
``torch.distributed.optim.ZeroRedundancyOptimizer`` over that group. ZeRO-2 adds
:class:`GradientOwners`: every micro-batch's gradient of a parameter is reduced to the dp rank that
owns it in that optimizer's partition as soon as backward has accumulated it, and freed everywhere
else, so a rank holds the gradients of only its own parameters between micro-batches (the
gradient sharding of FSDP with pipeline stages, e.g. Llama 3's; DeepSpeed's pipeline engine refuses
ZeRO-2). ZeRO-3 with a pipeline is rejected before launch (see :mod:`autoslapo.runtime.check`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "AUTOCAST_DTYPES",
    "DeepSpeedMPU",
    "GradientOwners",
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

    Precision is not given to DeepSpeed: the runtime runs fp32 weights under ``torch.autocast``,
    which the engine's module enters itself (``build_deepspeed_engine``).
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


#: autocast's compute dtype a precision (fp32 runs without autocast); the weights stay fp32
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_deepspeed_engine(model: nn.Module, config: Any, groups: Any, *, lr: float,
                           device_type: str) -> Any:
    """Wrap ``model`` in a DeepSpeed engine with AdamW and the dp/tp ``mpu``.

    Takes: the built (sharded) model on its device, the ScheduleConfig, this rank's ParallelGroups,
    the learning rate and "cpu" or "cuda". Returns: the engine (call it, ``backward``, ``step``); its
    ``basic_optimizer`` is a :class:`~autoslapo.runtime.scaler.SkippableAdamW` (AdamW that a step
    whose fp16 gradients overflowed can skip).
    """
    from autoslapo.runtime.scaler import SkippableAdamW

    deepspeed = _quiet_deepspeed(device_type)
    if config.precision in AUTOCAST_DTYPES:
        # The module enters its own autocast: DeepSpeed's forward turns off one entered outside it
        # unless its own ``torch_autocast`` is configured (it reads ``torch.is_autocast_enabled()``,
        # CUDA's flag, so on a GPU a bf16 schedule would train in fp32), and that option would also
        # reduce the Linear layers' gradients in 16 bits and bring its own fp16 loss scaling.
        model.forward = torch.autocast(device_type=device_type,  # type: ignore[method-assign]
                                       dtype=AUTOCAST_DTYPES[config.precision])(model.forward)
    optimizer = SkippableAdamW(model.parameters(), lr=lr)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        config=deepspeed_config(config),
        mpu=DeepSpeedMPU(groups),
        dist_init_required=False,
    )
    return engine


def build_pipeline_optimizer(params: list[nn.Parameter], config: Any, groups: Any, *, lr: float,
                             tied: list[nn.Parameter] | None = None) -> Any:
    """AdamW for a pipeline stage's parameters; ZeRO-1 shards its state over the dp group, ZeRO-2 its
    gradients too (``gradient_owners``, a :class:`GradientOwners`, on the optimizer; ``tied``: the
    parameters shared with other stages, whose gradients stay whole).

    Returns: ``torch.optim.AdamW`` (ZeRO 0) or ``ZeroRedundancyOptimizer`` wrapping it (ZeRO 1 and 2;
    ZeRO-2's gradients go to their owners through :class:`GradientOwners`).
    """
    if config.zero_stage in (1, 2) and config.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=groups.dp_group, lr=lr)
        if config.zero_stage == 2:
            opt.gradient_owners = GradientOwners(params, opt, groups.dp_group, config.dp,  # type: ignore[attr-defined]
                                                 skip={id(p) for p in tied or []})
        return opt
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


class GradientOwners:
    """ZeRO-2 for a pipeline stage: each parameter's gradient lives on its owner only.

    ``optimizer`` is the stage's ``ZeroRedundancyOptimizer``: its partition says which dp rank
    updates (owns) each parameter. A hook after backward accumulates a micro-batch's gradient into
    ``p.grad`` reduces it (summed over the dp group) to the owner, which adds it to its own sum,
    and frees it on every rank, so between micro-batches a rank holds only its own parameters'
    gradients (1/dp of them) and in backward no more than the parameters whose hooks are pending.
    ``sharded``: the parameters so handled (``sharded_ids``: their ids); ``skip``: those left to the
    caller (tied across stages: their gradients are summed over the pipeline after the schedule,
    then averaged over dp as in ZeRO-1). :meth:`finish` hands each owner its mean gradient after the
    pipeline's step.
    """

    def __init__(self, params: list[nn.Parameter], optimizer: Any, group: Any, world: int,
                 skip: set[int] | None = None) -> None:
        owner_of = optimizer._param_to_rank  # the optimizer's own partition (torch 2.x)
        self.group, self.world = group, world
        self.me = dist.get_rank(group)
        self.sharded = [p for p in params if id(p) not in (skip or set())]
        self.sharded_ids = {id(p) for p in self.sharded}
        self.owner = {id(p): owner_of[p] for p in self.sharded}
        # the owner's global rank, which ``dist.reduce`` takes as its destination
        self.owner_rank = {key: dist.get_global_rank(group, r) for key, r in self.owner.items()}
        self.sums: dict[int, torch.Tensor] = {}
        for p in self.sharded:
            p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p: torch.Tensor) -> None:
        grad, owner = p.grad, self.owner[id(p)]
        if grad is None:
            return
        dist.reduce(grad, dst=self.owner_rank[id(p)], group=self.group)
        if owner == self.me:
            held = self.sums.get(id(p))
            self.sums[id(p)] = grad if held is None else held.add_(grad)
        p.grad = None

    def finish(self, micro_batches: int) -> None:
        """After a step's ``micro_batches``: give each owned parameter its gradient, the mean over the
        micro-batches and dp ranks (their sum divided by both counts); the others keep none."""
        for p in self.sharded:
            held = self.sums.pop(id(p), None)
            p.grad = held.div_(micro_batches * self.world) if held is not None else None
