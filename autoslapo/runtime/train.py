"""Training steps of a scheduled model on one rank, and the unscheduled reference they must match.

``train(ctx, spec, config, ...)`` runs on every rank of a launch (``autoslapo.runtime.worker``): it
builds the model on the meta device, applies the knob-driven schedule
(``autoslapo.plan.apply_schedule``: TP/SP shards and collectives, kernel, fusion, checkpointing,
pipeline cuts), materializes this rank's shards with ``autoslapo.build`` (values depend only on the
seed and the module path, so every layout starts from the same weights), and trains:

* pp == 1: DeepSpeed's engine (DP and ZeRO 0-3 over the dp group, gradient accumulation of
  ``grad_accum`` micro-batches per optimizer step);
* pp > 1: ``torch.distributed.pipelining`` stages (``build_pipeline``; ``grad_accum`` is the number
  of micro-batches), gradients averaged over the dp group, AdamW or ZeRO-1's
  ZeroRedundancyOptimizer (ZeRO-2: each micro-batch's gradients reduced to their owners,
  ``autoslapo.runtime.engine.GradientOwners``).

Data: step ``k`` uses ``example_batch(spec, global_batch, seed=mix(seed, k))``; data-parallel rank
``d`` takes rows ``[d*B/dp, (d+1)*B/dp)`` and splits them into micro-batches in order, so the loss of
a step is the mean of the micro-batch losses of the whole global batch, whatever the layout.
Dropout is off by default so that the layouts can be compared step by step.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec, is_convolutional
from autoslapo.models.user import USER_FAMILY, user_loss
from autoslapo.runtime.engine import AUTOCAST_DTYPES
from autoslapo.runtime.scaler import DynamicLossScaler

__all__ = ["loss_function", "reference_losses", "scaled_loss", "step_batch", "train", "train_entry",
           "train_many_entry"]


def _mix(seed: int, step: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/data/{step}".encode()).digest()[:4], "little")


def step_batch(spec: ModelSpec, global_batch: int, step: int, seed: int) -> dict[str, torch.Tensor]:
    """The whole global batch of optimizer step ``step`` (same on every rank)."""
    from autoslapo.models.build import example_batch

    return example_batch(spec, global_batch, seed=_mix(seed, step))


def _micro_batches(batch: dict[str, torch.Tensor], dp_rank: int, dp: int, micro: int,
                   accum: int, device: str) -> Iterator[dict[str, torch.Tensor]]:
    rows = micro * accum
    for i in range(accum):
        a = dp_rank * rows + i * micro
        yield {k: v[a:a + micro].to(device) for k, v in batch.items()}


def _own_loss(loss: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
    return loss.float().mean()  # the one-element loss a user's last stage returns


def loss_function(spec: ModelSpec, sch: Any = None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``loss(logits, labels)`` as the family's transformers class computes it (mean over labelled
    tokens; causal models predict the next token; a convolutional family's: mean over images, as
    its forward computes it). The pipeline's last stage uses it.

    With ``sch``, a schedule whose head is vocabulary-parallel (tp > 1): the vocab-parallel loss of
    the logits' shards (``autoslapo.primitives.loss``), the head then never gathering them.
    A user's module (family ``user``): its last stage's output is the loss its forward computed
    (``autoslapo.user_pipeline``), taken as it is.
    """
    if spec.family == USER_FAMILY:
        return _own_loss
    vocab_parallel = None if sch is None else sch.root().meta.get("vocab_parallel_loss")
    if vocab_parallel is not None:
        return vocab_parallel.for_pipeline()  # type: ignore[no-any-return]
    if is_convolutional(spec.family):
        def images(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.float(), labels)
        return images
    if spec.causal:
        def causal(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return causal

    def masked(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
    return masked


def scaled_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                scaler: DynamicLossScaler) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A pipeline's last-stage loss, multiplied by the scaler's current loss scale (fp16)."""
    def scaled(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return scaler.scale_loss(loss_fn(out, target))
    return scaled


def _autocast(device: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=AUTOCAST_DTYPES[precision])


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_scheduled(spec: ModelSpec, config: ScheduleConfig, groups: Any, *, seed: int,
                     device: str, dropout: float | None) -> tuple[Any, nn.Module]:
    """Meta-device model -> schedule -> this rank's shards on ``device``. Returns (schedule, model)."""
    from autoslapo.build import materialize
    from autoslapo.models.build import build_model
    from autoslapo.plan import apply_schedule

    with torch.device("meta"):
        model = build_model(spec, attn_kernel=config.attn_kernel, seed=seed, dropout=dropout)
    sch = apply_schedule(model, spec, config, groups)
    # Materialize here rather than through build(): with pipeline cuts build() hands over to
    # build_pipeline, which expects a model with real tensors.
    materialize(sch.root().mod, seed=seed, device=device)
    return sch, sch.root().mod


def reference_losses(spec: ModelSpec, *, global_batch: int, micro_batch: int, steps: int, seed: int = 0,
                     lr: float = 1e-3, dropout: float | None = 0.0, attn_kernel: str = "sdpa",
                     precision: str = "fp32", loss_scale: float = 2.0**16) -> list[float]:
    """Losses of the unscheduled model trained in this process on the same data and weights.

    One optimizer step = every micro-batch of the global batch, each loss scaled by 1/count and
    its gradient accumulated, then AdamW (what DP x gradient accumulation computes). ``precision``
    bf16 or fp16: the forward under autocast, as the runtime runs it; fp16 with the same dynamic
    loss scaling (initial scale ``loss_scale``), its overflowing steps skipped.
    """
    from autoslapo.build import build
    from autoslapo.models.build import build_model
    from autoslapo.schedule import create_schedule

    with torch.device("meta"):
        model = build_model(spec, attn_kernel=attn_kernel, seed=seed, dropout=dropout)
    model = build(create_schedule(model), seed=seed, device="cpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = None
    if precision == "fp16":
        scaler = DynamicLossScaler("cpu", init_scale=loss_scale, distributed=False)
        scaler.attach(model.parameters())
    n = global_batch // micro_batch
    out = []
    for step in range(steps):
        batch = step_batch(spec, global_batch, step, seed)
        total = 0.0
        for mb in _micro_batches(batch, 0, 1, micro_batch, n, "cpu"):
            with _autocast("cpu", precision):
                loss = user_loss(model(**mb))
            (loss / n if scaler is None else scaler.scale_loss(loss / n)).backward()
            total += float(loss.detach())
        if scaler is None or not scaler.end_step():
            opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(total / n)
    return out


def train_step(rows: dict[str, torch.Tensor], config: ScheduleConfig, groups: Any, device: str, *,
               engine: Any = None, pipeline: Any = None, optimizer: Any = None,
               scaler: DynamicLossScaler | None = None) -> torch.Tensor:
    """One optimizer step on this data-parallel replica's rows of the global batch.

    Takes: the replica's rows (``grad_accum`` equal micro-batches of them, normally
    ``micro_batch`` rows each; on any device), the knobs,
    the ``ParallelGroups``, this rank's device, and either DeepSpeed's ``engine`` (pp == 1: one
    forward/backward/``engine.step()`` a micro-batch, the engine updating every ``grad_accum``) or
    the ``pipeline`` runtime with its ``optimizer`` (pp > 1: the pipeline runs every micro-batch,
    then the gradients are averaged over the data-parallel group and the optimizer steps).
    ``scaler`` (fp16): back-propagates the scaled loss (the pipeline's ``loss_fn`` already scales
    it) and skips the optimizer step on every rank when any rank's gradients overflowed.
    Returns: this rank's share of the global batch's mean loss (a 0-dim float tensor on
    ``device``): summed over every rank (``dist.all_reduce``) it is that mean.
    """
    n_ranks = config.dp * config.tp  # ranks whose shares add up (the loss-holding stage's, with pp)
    if engine is not None:
        micro = int(next(iter(rows.values())).shape[0]) // config.grad_accum
        total = torch.zeros((), device=device)
        for i in range(config.grad_accum):
            mb = {k: v[i * micro:(i + 1) * micro].to(device) for k, v in rows.items()}
            loss = user_loss(engine(**mb))  # the engine's module enters the precision's autocast itself
            engine.backward(loss if scaler is None else scaler.scale_loss(loss))
            if scaler is not None and i == config.grad_accum - 1:  # the engine updates at this step()
                engine.basic_optimizer.skip = scaler.end_step()
            engine.step()
            total += loss.detach().float()
        return total / config.grad_accum / n_ranks
    from autoslapo.runtime.engine import average_gradients

    inputs = [rows[k].to(device) for k in pipeline.input_keys] if pipeline.has_first else []
    labels = rows[pipeline.target_key].to(device) if pipeline.has_last else None
    scale = 1.0 if scaler is None else scaler.scale  # the pipeline's loss_fn returned loss x scale
    with _autocast(device, config.precision):
        out = pipeline.step(*inputs, target=labels)
    params = pipeline.parameters()
    owners = getattr(optimizer, "gradient_owners", None)
    if owners is not None:  # ZeRO-2: each owner has its parameters' gradient sums; the tied ones are whole
        owners.finish(config.grad_accum)
        params = [p for p in params if id(p) not in owners.sharded_ids]
    if scaler is None or not scaler.end_step():
        average_gradients(params, groups.dp_group, config.dp)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if pipeline.has_last and out is not None:
        return out.detach().float() / scale / n_ranks
    return torch.zeros((), device=device)


def train(ctx: Any, spec: ModelSpec, config: ScheduleConfig, *, steps: int, warmup: int, seed: int = 0,
          lr: float = 1e-3, dropout: float | None = 0.0, loss_scale: float = 2.0**16) -> dict[str, Any]:
    """Train ``steps`` optimizer steps of the scheduled model on this rank and time them.

    Takes: the worker context (rank, device), the spec and knobs, the step counts, seed, learning
    rate and dropout; ``loss_scale``: fp16's initial loss scale. Returns (JSON-safe): ``losses``
    (global mean loss per step, on every rank; with fp16 also ``loss_scale`` and ``skipped_steps``),
    ``step_times_s`` (the steps after ``warmup``, barrier to barrier), ``peak_memory_bytes`` (CUDA:
    max allocated since set-up began; CPU: 0, the launcher reads the process's peak RSS),
    ``setup_s`` and the applied ``plan``.
    Raises: FloatingPointError when the loss stops being finite (``loss became nan at step k``).
    """
    from autoslapo.dist import build_groups
    from autoslapo.runtime.engine import build_deepspeed_engine, build_pipeline_optimizer

    device = ctx.device
    dev_type = device.split(":")[0]
    t_setup = time.perf_counter()
    if dev_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    groups = build_groups(config.tp, config.pp, config.dp, device_type=dev_type)
    sch, model = build_scheduled(spec, config, groups, seed=seed, device=device, dropout=dropout)
    plan = dict(sch.root().meta.get("plan", {}))
    plan.pop("config", None)
    engine: Any = None
    runtime: Any = None
    optimizer: Any = None
    # fp16: dynamic loss scaling (``autoslapo.runtime.scaler``); bf16 and fp32 need none
    scaler = DynamicLossScaler(device, init_scale=loss_scale) if config.precision == "fp16" else None
    if config.pp == 1:
        model.train()
        engine = build_deepspeed_engine(model, config, groups, lr=lr, device_type=dev_type)
        if scaler is not None:
            scaler.attach(engine.module.parameters())
    else:
        from autoslapo.pipeline import build_pipeline

        loss_fn = loss_function(spec, sch)
        if scaler is not None:
            loss_fn = scaled_loss(loss_fn, scaler)
        runtime = build_pipeline(
            sch, pp_group=groups.pp_group, grad_accum=config.grad_accum, schedule=config.pipeline_schedule,
            virtual_stages=config.virtual_stages, loss_fn=loss_fn, device=device,
        )
        for m in runtime.modules:
            m.train()
        optimizer = build_pipeline_optimizer(runtime.parameters(), config, groups, lr=lr, tied=runtime.tied_params())
        if scaler is not None:
            scaler.attach(runtime.parameters())
    del sch, model  # a pipeline rank keeps only its own stages' parameters
    gc.collect()
    setup_s = time.perf_counter() - t_setup

    losses: list[float] = []
    times: list[float] = []
    rows = config.micro_batch * config.grad_accum  # this data-parallel replica's share of a batch
    for step in range(steps):
        batch = step_batch(spec, config.global_batch, step, seed)
        dist.barrier()
        t0 = time.perf_counter()
        mine = {k: v[groups.dp_rank * rows:(groups.dp_rank + 1) * rows] for k, v in batch.items()}
        local = train_step(mine, config, groups, device, engine=engine, pipeline=runtime, optimizer=optimizer,
                           scaler=scaler)
        _sync(device)
        dist.barrier()
        t1 = time.perf_counter()
        # Outside the timed region: the global loss for the record and the finiteness check.
        value = local.to(device).reshape(1)
        dist.all_reduce(value)
        v = float(value.item())
        if not math.isfinite(v):
            raise FloatingPointError(f"loss became {v} at step {step}")
        losses.append(v)
        if step >= warmup:
            times.append(t1 - t0)
    peak = int(torch.cuda.max_memory_allocated()) if dev_type == "cuda" else 0
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()
    del engine, runtime, optimizer
    gc.collect()
    return {
        "rank": ctx.rank,
        "losses": losses,
        "step_times_s": times,
        "peak_memory_bytes": peak,
        "setup_s": setup_s,
        "plan": plan if ctx.rank == 0 else {},
        **({} if scaler is None else scaler.state()),
    }


def _unpack(payload: dict[str, Any]) -> tuple[ModelSpec, ScheduleConfig, dict[str, Any]]:
    spec = ModelSpec.from_dict(payload["spec"])
    config = ScheduleConfig.from_dict(payload["config"])
    keys = ("steps", "warmup", "seed", "lr", "dropout", "loss_scale")
    kw: dict[str, Any] = {k: payload[k] for k in keys if k in payload}
    return spec, config, kw


def train_entry(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Launcher entry for one trial: payload ``{spec, config, steps, warmup, seed, lr, dropout}``."""
    spec, config, kw = _unpack(payload)
    return train(ctx, spec, config, **kw)


def train_many_entry(ctx: Any, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Launcher entry for several configurations on one world, one after the other (for tests).

    Payload: ``{"runs": [one train_entry payload per configuration]}``; every configuration must
    use the launch's whole world. Returns each run's ``train`` result, in order.
    """
    out = []
    for run in payload["runs"]:
        spec, config, kw = _unpack(run)
        out.append(train(ctx, spec, config, **kw))
    return out
