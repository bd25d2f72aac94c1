"""The public API for using tuning results: look up the best schedule, and apply it in a training job.

    import autoslapo
    config = autoslapo.best("bert", gpus=64)                      # a ScheduleConfig
    job = autoslapo.apply_best("bert", gpus=64)                    # on each rank of a 64-rank job
    loss = job.engine(**micro_batch).loss; job.engine.backward(loss); job.engine.step()

``best`` only reads the store. ``apply_best`` builds the model, applies the recorded schedule and
builds the training engine through the same functions the tuner's trials use (the runtime), so
what trains is what was measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoslapo.best_batch import batch_list, best_at_batch, stored_global_batches, that_one
from autoslapo.cluster import MAX_GPUS, cli_flag, link_overrides
from autoslapo.errors import ConfigError, UsageError
from autoslapo.storage import require_store

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec
    from store import Store, TrialRecord

__all__ = ["TrainingJob", "apply_best", "best", "best_trial"]


def _model_key(model: str | ModelSpec) -> tuple[str, str]:
    """What the store matches (a model signature or name) and a label for messages."""
    from autoslapo.models.resolve import is_model_file, resolve_model
    from autoslapo.models.spec import ModelSpec

    if isinstance(model, ModelSpec):
        return model.signature(), model.preset
    if not isinstance(model, str) or not model:
        raise UsageError(f"model must be a preset name or a ModelSpec: got {model!r}")
    if is_model_file(model):
        spec = resolve_model(model)
        return spec.signature(), spec.preset
    try:
        spec = ModelSpec.from_name(model)
    except UsageError:
        # Not a preset: a custom study's model name or a signature, matched as given.
        return model, model
    return spec.signature(), spec.preset


def best_trial(
    model: str | ModelSpec,
    *,
    gpus: int,
    gpu_type: str | None = None,
    storage: str | Store | None = None,
    metric: str = "samples_per_s",
    measured_only: bool = False,
    min_headroom_bytes: int | None = None,
    min_headroom_fraction: float | None = None,
    links: Mapping[str, float] | None = None,
    gpus_per_node: int | None = None,
    global_batch: int | None = None,
) -> TrialRecord:
    """The best recorded complete trial for ``model`` on ``gpus`` devices (of ``gpu_type``, or any).

    Takes: a preset name (``"bert"``, matched by the preset's shape) or a ``ModelSpec``; the filters
    of ``Store.best`` (``links``: only studies of a cluster with those link bandwidths, e.g.
    ``{"inter_node_gbps": 6.25}``; ``gpus_per_node``: only studies of nodes that size, None any);
    ``global_batch``: only trials that ran at that global batch (micro_batch x grad_accum x dp; None any);
    ``storage`` a URL (default $AUTOSLAPO_STORAGE, else
    ``sqlite:///autoslapo.db``) or an open ``Store``.
    Returns: the trial record (``.config``, ``.samples_per_s``, ``.study``, ``.measured`` ...).
    Raises: UsageError when nothing matches (saying which filters to relax or what to tune),
    StorageError for a bad or missing store.
    """
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise UsageError(f"gpus must be a positive integer: got {gpus!r}")
    if gpus > MAX_GPUS:  # also beyond what a database integer holds
        raise UsageError(f"gpus must be at most {MAX_GPUS:,} (2**20, beyond the largest machines built): got {gpus:,}")
    if gpus_per_node is not None and (not isinstance(gpus_per_node, int) or gpus_per_node < 1):
        raise UsageError(f"gpus_per_node must be a positive integer: got {gpus_per_node!r}")
    if gpu_type is not None:
        from autoslapo.cluster import DEVICES

        if gpu_type not in DEVICES:
            raise UsageError(f"gpu_type must be one of {', '.join(DEVICES)}: got {gpu_type!r}")
    _check_batch(global_batch)
    key, label = _model_key(model)
    links = link_overrides(links or {}, lambda k: k)
    store, owned = _store(storage)
    cluster_filters: dict[str, Any] = {"metric": metric, "links": links, "gpus_per_node": gpus_per_node}
    try:
        found = best_at_batch(store, key, gpus, gpu_type, global_batch, measured_only=measured_only,
                              min_headroom_bytes=min_headroom_bytes, min_headroom_fraction=min_headroom_fraction,
                              **cluster_filters)
        if found:
            return found[0]
        any_found = best_at_batch(store, key, gpus, gpu_type, global_batch, **cluster_filters)
        batches = ([] if global_batch is None or any_found else
                   stored_global_batches(store, key, gpus, gpu_type, **cluster_filters))
        where = store.url
        tuned = isinstance(model, str) and any(model in (s.model_name, s.model_signature) for s in store.list_studies())
    finally:
        if owned:
            store.close()
    cluster = f"{gpus} x {gpu_type or 'any device'}" + "".join(f" with {k} {v:g}" for k, v in links.items())
    cluster += f" ({gpus_per_node} a node)" if gpus_per_node is not None else ""
    cluster += f" at global batch {global_batch}" if global_batch is not None else ""
    flags = (f" --gpu-type {gpu_type}" if gpu_type else "") + "".join(f" {cli_flag(k)} {v:g}" for k, v in links.items())
    flags += f" --gpus-per-node {gpus_per_node}" if gpus_per_node is not None else ""
    flags += f" --global-batch {global_batch}" if global_batch is not None else ""
    if batches:  # the model and cluster were tuned, at other global batches
        raise UsageError(f"no recorded schedule for {label} on {cluster} in {where} (its trials ran at "
                         f"global batch {batch_list(batches)}: pass {that_one(batches)} as global_batch); run "
                         f"`autoslapo tune {label} --gpus {gpus}{flags}` first")
    if any_found:
        raise UsageError(
            f"no recorded schedule for {label} on {cluster} passes the filters (measured_only="
            f"{measured_only}, min_headroom_bytes={min_headroom_bytes}, min_headroom_fraction="
            f"{min_headroom_fraction}) in {where}; relax them or tune with a measuring backend"
        )
    from autoslapo.models.resolve import is_model_file

    if isinstance(model, str) and key == model and not is_model_file(model) and not tuned:  # matched as a stored name only
        raise UsageError(
            f"model must be a preset, a model file or a model a stored study tuned: got {model!r}, none of them "
            f"in {where}; `autoslapo models` lists the presets"
        )
    raise UsageError(f"no recorded schedule for {label} on {cluster} in {where}; run "
                     f"`autoslapo tune {label} --gpus {gpus}{flags}` first")


def _check_batch(global_batch: object) -> None:
    """UsageError unless ``global_batch`` is None or a batch ``tune`` could have run (``check_global_batch``),
    named as the argument (``global_batch``), not as the flag."""
    from autoslapo.layout import check_global_batch

    if global_batch is not None:
        try:
            check_global_batch(global_batch)
        except ConfigError as err:
            raise UsageError(str(err).replace("--global-batch", "global_batch", 1)) from None


def best(
    model: str | ModelSpec,
    *,
    gpus: int,
    gpu_type: str | None = None,
    storage: str | Store | None = None,
    metric: str = "samples_per_s",
    measured_only: bool = False,
    min_headroom_bytes: int | None = None,
    min_headroom_fraction: float | None = None,
    server: str | None = None,
    links: Mapping[str, float] | None = None,
    gpus_per_node: int | None = None,
    global_batch: int | None = None,
) -> ScheduleConfig:
    """The best recorded schedule for ``model`` on ``gpus`` devices, as a ``ScheduleConfig``.

    Same arguments and errors as ``best_trial``; returns only the knobs. With ``server`` (the URL
    of an ``autoslapo serve``, token from $AUTOSLAPO_TOKEN) the service is asked instead of a store
    (the headroom filters and ``storage`` are refused with it: the service takes neither).
    """
    if server is not None:
        _not_sent(storage=storage, min_headroom_bytes=min_headroom_bytes,
                  min_headroom_fraction=min_headroom_fraction)
        return _config(_remote_best_trial(model, gpus=gpus, gpu_type=gpu_type, metric=metric,
                                          measured_only=measured_only, server=server, links=links,
                                          gpus_per_node=gpus_per_node, global_batch=global_batch))
    trial = best_trial(model, gpus=gpus, gpu_type=gpu_type, storage=storage, metric=metric,
                       measured_only=measured_only, min_headroom_bytes=min_headroom_bytes,
                       min_headroom_fraction=min_headroom_fraction, links=links, gpus_per_node=gpus_per_node,
                       global_batch=global_batch)
    return _config(trial)


def _not_sent(**filters: object) -> None:
    """UsageError naming the filters given with ``server=``: the service answers from its own store and
    takes none of them (they were dropped without a word, so a filtered answer was not filtered)."""
    given = [k for k, v in filters.items() if v is not None]
    if given:
        raise UsageError(f"with server= the service answers from its store: {', '.join(given)} cannot be sent; "
                         f"drop {'it' if len(given) == 1 else 'them'}, or ask a store (storage=) instead")


def _remote_best_trial(model: str | ModelSpec, *, gpus: int, gpu_type: str | None, metric: str,
                       measured_only: bool, server: str, links: Mapping[str, float] | None = None,
                       gpus_per_node: int | None = None, global_batch: int | None = None) -> TrialRecord:
    """The best trial as the server at ``server`` answers ``GET /v1/best`` (what it sends of the record)."""
    from autoslapo.config import config_hash
    from autoslapo.remote import Client, model_query
    from store import TrialRecord

    _check_batch(global_batch)
    doc = Client(server).get("/v1/best", model=model_query(model), gpus=gpus, gpu_type=gpu_type, metric=metric,
                             measured_only=measured_only or None, gpus_per_node=gpus_per_node,
                             global_batch=global_batch, **link_overrides(links or {}, lambda k: k))
    config = dict(doc["config"])
    return TrialRecord(study=str(doc["study"]), number=int(doc["trial"]), config=config,
                       config_hash=config_hash(config), status=str(doc["status"]),
                       samples_per_s=doc.get("samples_per_s"), tokens_per_s=doc.get("tokens_per_s"),
                       tflops_per_device=doc.get("tflops_per_device"),
                       peak_memory_bytes=doc.get("peak_memory_bytes"), measured=bool(doc.get("measured")),
                       reason=str(doc.get("reason") or ""), result={"model_spec": doc.get("model_spec")})


def _store(storage: str | Store | None) -> tuple[Store, bool]:
    """An open store and whether this call opened it (and so must close it)."""
    from store import Store

    if isinstance(storage, Store):
        return storage, False
    if storage is not None and not isinstance(storage, str | Path):
        raise UsageError(f"storage must be a URL or a Store: got {type(storage).__name__}")
    return require_store(None if storage is None else str(storage), read_only=True), True


def _trial_spec(model: str | ModelSpec, trial: TrialRecord, storage: str | Store | None) -> ModelSpec:
    """The model to build for ``trial``: ``model`` resolved, or, for a model named by its signature (the
    service's ``apply_best`` line for a config.json or a model file), the model its study tuned."""
    from autoslapo.models.spec import ModelSpec

    try:
        return _spec(model)
    except UsageError:
        if not isinstance(model, str):
            raise
        stored = (trial.result or {}).get("model_spec")  # the server sends its study's model with its answer
        if stored is None:
            db, opened = _store(storage)
            try:
                stored = db.get_study(trial.study).model
            finally:
                if opened:
                    db.close()
        spec = ModelSpec.from_dict(dict(stored))
        if spec.signature() != model:  # a name, not this study's signature: the resolver's error stands
            raise
        return spec


def _spec(model: str | ModelSpec) -> ModelSpec:
    from autoslapo.models.resolve import resolve_model
    from autoslapo.models.spec import ModelSpec

    return model if isinstance(model, ModelSpec) else resolve_model(model)


@dataclass
class TrainingJob:
    """What ``apply_best`` hands a training script on one rank: the scheduled model, ready to train.

    ``engine`` is DeepSpeed's engine when the schedule has no pipeline stages (``pp == 1``): call
    it on a micro-batch, then ``engine.backward(loss)`` and ``engine.step()`` (it accumulates
    ``config.grad_accum`` micro-batches per optimizer step). With ``pp > 1``, ``pipeline`` is the
    ``torch.distributed.pipelining`` runtime of this rank's stages (``pipeline.step(...)`` runs a
    whole batch's micro-batches) and ``optimizer`` updates its parameters; gradients must be
    averaged over ``groups.dp_group`` before ``optimizer.step()``. Weights stay fp32: the engine's
    module enters the autocast of ``config.precision`` itself; run a pipeline's steps under
    ``autocast()``. With fp16, ``scaler`` (``autoslapo.runtime.scaler.DynamicLossScaler``, its
    hooks on the parameters; a pipeline's loss already scaled) scales the loss: back-propagate
    ``scaler.scale_loss(loss)`` and skip the step when ``scaler.end_step()``; ``step`` does it all.
    """

    spec: ModelSpec
    config: ScheduleConfig
    trial: TrialRecord
    groups: Any
    device: str
    engine: Any = None
    pipeline: Any = None
    optimizer: Any = None
    plan: dict[str, Any] = field(default_factory=dict)
    scaler: Any = None

    @property
    def model(self) -> Any:
        """The scheduled module of this rank (``engine.module``; None with pipeline stages)."""
        return None if self.engine is None else self.engine.module

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for ``config.precision`` on this rank's device (none for fp32)."""
        import torch

        from autoslapo.runtime.engine import AUTOCAST_DTYPES

        if self.config.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.split(":")[0], dtype=AUTOCAST_DTYPES[self.config.precision])

    def local_rows(self, global_batch: int) -> slice:
        """The rows of a global batch that this rank's data-parallel replica trains on."""
        if global_batch % self.config.dp:
            raise UsageError(
                f"the global batch must split evenly over dp={self.config.dp} replicas: got {global_batch}; "
                f"use a multiple of {self.config.dp} (the tuned schedule used {self.config.global_batch})"
            )
        rows = global_batch // self.config.dp
        return slice(self.groups.dp_rank * rows, (self.groups.dp_rank + 1) * rows)

    def step(self, batch: dict[str, Any]) -> float:
        """One optimizer step on a global batch (``input_ids``, ``labels``, ...; the same on every rank).

        Runs this rank's replica rows through the engine or the pipeline exactly as the tuner's
        trials do (``autoslapo.runtime.train.train_step``) and returns the global batch's mean
        loss, the same on every rank. Raises UsageError when the batch does not split into the
        schedule's micro-batches.
        """
        import torch.distributed as dist

        from autoslapo.runtime.train import train_step

        size = int(batch["labels"].shape[0])
        per_step = self.config.dp * self.config.grad_accum
        if size % per_step:
            raise UsageError(
                f"a global batch must split into dp x grad_accum = {per_step} equal micro-batches: got {size} "
                f"rows; use a multiple of {per_step} (the tuned schedule used {self.config.global_batch})"
            )
        rows = {k: v[self.local_rows(size)] for k, v in batch.items()}
        local = train_step(rows, self.config, self.groups, self.device, engine=self.engine, pipeline=self.pipeline,
                           optimizer=self.optimizer, scaler=self.scaler)
        value = local.reshape(1)
        dist.all_reduce(value)
        return float(value.item())


def _device() -> str:
    import os

    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(1, torch.cuda.device_count())))
        torch.cuda.set_device(local)
        return f"cuda:{local}"
    return "cpu"


def apply_best(
    model: str | ModelSpec,
    *,
    gpus: int,
    gpu_type: str | None = None,
    storage: str | Store | None = None,
    measured_only: bool = False,
    min_headroom_bytes: int | None = None,
    min_headroom_fraction: float | None = None,
    lr: float = 1e-4,
    seed: int = 0,
    dropout: float | None = None,
    server: str | None = None,
    links: Mapping[str, float] | None = None,
    gpus_per_node: int | None = None,
    global_batch: int | None = None,
) -> TrainingJob:
    """Build ``model`` with its best recorded schedule on this rank of a launched distributed job.

    Takes: a preset name or ``ModelSpec``; the look-up filters of ``best`` (``links``, ``gpus_per_node`` and
    ``global_batch`` too); the learning rate, the weight seed and dropout (None: the model's own). Call it
    on every rank of a job of ``gpus`` ranks (``torchrun --nproc-per-node``, ``autoslapo.dist.spawn``, a
    Slurm launch), after the default process group is initialized (nccl on GPUs, gloo on CPU).
    Returns: a ``TrainingJob`` holding the DeepSpeed engine (pp == 1) or the pipeline runtime and
    its optimizer (pp > 1), built by the same runtime functions the tuner's trials use.
    With ``server`` (an ``autoslapo serve`` URL, token from $AUTOSLAPO_TOKEN) the schedule is asked
    of the service as ``best(..., server=)`` does (no store needed; the headroom filters and
    ``storage`` are refused with it).
    Raises: UsageError when no schedule is recorded or the job's world size is not ``gpus``;
    ConfigError/ScheduleError when the schedule does not fit the model.
    """
    import torch.distributed as dist

    if server is not None:
        _not_sent(storage=storage, min_headroom_bytes=min_headroom_bytes,
                  min_headroom_fraction=min_headroom_fraction)
        trial = _remote_best_trial(model, gpus_per_node=gpus_per_node, gpus=gpus, gpu_type=gpu_type, metric="samples_per_s",
                                   measured_only=measured_only, server=server, links=links, global_batch=global_batch)
    else:
        trial = best_trial(model, gpus=gpus, gpu_type=gpu_type, storage=storage, measured_only=measured_only,
                           min_headroom_bytes=min_headroom_bytes, min_headroom_fraction=min_headroom_fraction,
                           links=links, gpus_per_node=gpus_per_node, global_batch=global_batch)
    spec = _trial_spec(model, trial, storage)
    config = _config(trial)
    if not dist.is_initialized():
        raise UsageError(
            f"apply_best runs inside a launched job of {gpus} ranks, on an initialized process group: none is; "
            f"call torch.distributed.init_process_group() first (nccl on GPUs, gloo on CPU), in a job launched with "
            f"`torchrun --nproc-per-node {gpus} script.py` (or autoslapo.dist.spawn)"
        )
    world = dist.get_world_size()
    if world != config.world_size:
        raise UsageError(
            f"the best schedule for {spec.preset} needs {config.world_size} ranks (tp={config.tp}, "
            f"pp={config.pp}, dp={config.dp}): this job has {world}; launch {config.world_size} ranks"
        )
    from autoslapo.dist import build_groups
    from autoslapo.runtime.engine import build_deepspeed_engine, build_pipeline_optimizer
    from autoslapo.runtime.scaler import DynamicLossScaler
    from autoslapo.runtime.train import build_scheduled, loss_function, scaled_loss

    device = _device()
    dev_type = device.split(":")[0]
    groups = build_groups(config.tp, config.pp, config.dp, device_type=dev_type)
    sch, module = build_scheduled(spec, config, groups, seed=seed, device=device, dropout=dropout)
    plan = dict(sch.root().meta.get("plan", {}))
    job = TrainingJob(spec=spec, config=config, trial=trial, groups=groups, device=device, plan=plan)
    if config.precision == "fp16":
        job.scaler = DynamicLossScaler(device)
    if config.pp == 1:
        module.train()
        job.engine = build_deepspeed_engine(module, config, groups, lr=lr, device_type=dev_type)
        if job.scaler is not None:
            job.scaler.attach(job.engine.module.parameters())
        return job
    from autoslapo.pipeline import build_pipeline

    loss_fn = loss_function(spec, sch)
    job.pipeline = build_pipeline(
        sch, pp_group=groups.pp_group, grad_accum=config.grad_accum, schedule=config.pipeline_schedule,
        virtual_stages=config.virtual_stages, device=device,
        loss_fn=loss_fn if job.scaler is None else scaled_loss(loss_fn, job.scaler),
    )
    if job.scaler is not None:
        job.scaler.attach(job.pipeline.parameters())
    for m in job.pipeline.modules:
        m.train()
    job.optimizer = build_pipeline_optimizer(job.pipeline.parameters(), config, groups, lr=lr,
                                             tied=job.pipeline.tied_params())
    return job


def _config(trial: TrialRecord) -> ScheduleConfig:
    from autoslapo.config import ScheduleConfig

    return ScheduleConfig.from_dict(dict(trial.config))
