"""Pipeline parallelism, the runtime: build this rank's stages from the cuts and run them.

``cut_pipeline_stage`` (a primitive) records the cuts; ``build_pipeline`` builds this rank's stage
module(s) and a ``torch.distributed.pipelining`` schedule (GPipe, 1F1B or interleaved 1F1B).

Stages are built by hand rather than with torch's export-based ``pipeline()``: HF models do not
export cleanly (data-dependent masks, output dataclasses), and a hand-built stage keeps the very
parameter objects of the unchanged model, so names, tied tensors and optimizers line up with the
unpipelined run. What a model family must say is a ``PipelineAdapter`` (``autoslapo.models.adapters``).

The layers see only the hidden states: per-layer context (attention mask, position ids) is rebuilt
on every stage from the hidden states by ``adapter.context``, so padding masks are not carried
between stages (full-length batches, as in pre-training).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autoslapo.config import PIPELINE_SCHEDULES
from autoslapo.errors import ScheduleError
from autoslapo.models.adapters import PipelineAdapter, adapter_for
from autoslapo.primitives.checkpoint import set_call_index
from autoslapo.primitives.pipeline import layer_cuts, layer_lists, stage_bounds
from autoslapo.schedule import Schedule

__all__ = [
    "SCHEDULES",
    "STAGE_BUILDER_KEY",
    "PipelineRuntime",
    "StageModule",
    "TiedParam",
    "build_pipeline",
    "build_stage_modules",
    "find_tied",
    "local_stage_indices",
    "local_stage_modules",
]

SCHEDULES = PIPELINE_SCHEDULES
# root.meta: ``builder(model, layers_path, bounds) -> (stages, adapter)`` for a model whose stages are not
# embed -> layers -> head (a user's own module: ``autoslapo.user_pipeline``); used when no adapter is given
STAGE_BUILDER_KEY = "pipeline_stage_builder"

# -- stages -----------------------------------------------------------------------------------------


class StageModule(nn.Module):
    """One pipeline stage: layers ``[start, stop)`` of the layer list, plus the parts it owns.

    With ``shared`` the positions are calls of one module (ALBERT): ``layers`` holds it once a call
    (``parameters()`` still yields each parameter once) and the stage tells it the call's index.
    Holds the original submodules (same parameter objects as the model). Parts are kept in a
    ModuleDict under keys with "." replaced by "__"; :attr:`parts` maps the real paths.
    """

    def __init__(
        self,
        adapter: PipelineAdapter,
        layers: list[nn.Module],
        parts: dict[str, nn.Module],
        *,
        first: bool,
        last: bool,
        bounds: tuple[int, int],
        shared: bool = False,
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.layers = nn.ModuleList(layers)
        self.owned = nn.ModuleDict({p.replace(".", "__"): m for p, m in parts.items()})
        self.first = first
        self.last = last
        self.bounds = bounds
        self.shared = shared
        # set by build_pipeline: the next forward is torch's shape inference (see there)
        self.probe_next = False

    @property
    def parts(self) -> dict[str, nn.Module]:
        """The parts this stage owns, by their path in the model."""
        return {k.replace("__", "."): m for k, m in self.owned.items()}

    def forward(self, *args: Any) -> torch.Tensor:
        if self.probe_next:
            # torch.distributed.pipelining runs each stage once on the first micro-batch (the first
            # stage) or on uninitialized tensors (the others) to learn what passes between stages;
            # that run must leave the buffers (BatchNorm's running statistics) as they were
            # (put back as new tensors: the probe's backward still reads the ones it saw)
            self.probe_next = False
            saved = [(m, k, b.detach().clone()) for m in self.modules() for k, b in m._buffers.items()
                     if b is not None]
            try:
                return self.forward(*args)
            finally:
                for m, k, b in saved:
                    m._buffers[k] = b
        # a later stage receives a tuple of tensors (an encoder-decoder's two streams) as its arguments
        hidden: Any = self.adapter.embed(self.parts, *args) if self.first else args[0] if len(args) == 1 else args
        ctx = self.adapter.context(hidden)
        for call, layer in enumerate(self.layers, start=self.bounds[0]):
            if self.shared:
                # a module checkpointed by call (ALBERT's shared layer) learns which call this is: the
                # ranks and microbatches interleave its calls, so counting them would not tell
                set_call_index(layer, call)
            hidden = self.adapter.layer(layer, hidden, ctx)
        if self.last:
            hidden = self.adapter.head(self.parts, hidden)
        return hidden

    def extra_repr(self) -> str:
        return f"layers=[{self.bounds[0]}, {self.bounds[1]}), first={self.first}, last={self.last}"


def build_stage_modules(
    sch: Schedule, adapter: PipelineAdapter | None = None
) -> tuple[list[StageModule], PipelineAdapter]:
    """Build every stage module of the model under ``sch`` from its recorded cuts.

    Returns: (all stages in order, the adapter used). Raises: ScheduleError when there are no cuts,
    or the cuts are not in the adapter's layer list, or a part path does not exist.
    """
    root = sch.root()
    cuts = layer_cuts(root)
    if cuts is None:
        raise ScheduleError(
            "build_pipeline needs pipeline cuts: none recorded; call sch['<layers>.<i>'].cut_pipeline_stage()"
        )
    # the layer lists the positions run (one; T5's two joined; a shared layer's list of calls)
    lists = [cuts.parent] if cuts.shared else layer_lists(root)
    builder = root.meta.get(STAGE_BUILDER_KEY)
    if adapter is None and builder is not None:  # a schedule that builds its own stages (a user's module)
        return builder(root.mod, lists[0], stage_bounds(len(cuts.layers), list(cuts.cuts)))  # type: ignore[no-any-return]
    if adapter is None:
        adapter = adapter_for(root.mod, lists[0])
    # an adapter may run several layer lists as one (``layer_lists``; an encoder-decoder's stacks)
    wanted = list(getattr(adapter, "layer_lists", (adapter.layers_path,)))
    if wanted != lists:
        where = " + ".join(p or "<root>" for p in lists)
        raise ScheduleError(
            f"the pipeline cuts are in {where!r} but the adapter's layer list is "
            f"{' + '.join(p or '<root>' for p in wanted)!r}; cut after children of "
            f"{adapter.layers_path or '<root>'!r}" + (" (join_layer_lists first)" if len(wanted) > 1 else "")
        )
    # a shared layer (ALBERT) is one module at every position: each stage holds it once a call
    layers = [root[p].mod for p in cuts.layers]
    bounds = stage_bounds(len(layers), list(cuts.cuts))

    def part(path: str) -> nn.Module:
        if path not in root:
            raise ScheduleError(f"pipeline adapter names {path!r}, which is not a submodule of the model")
        return root[path].mod

    first_parts = {p: part(p) for p in adapter.first_paths}
    last_parts = {p: part(p) for p in adapter.last_paths}
    # modules a stage owns by the layers it holds (T5: a stack's relative-position table, used by
    # every stage with blocks of that stack; find_tied then sums its gradients over those ranks)
    stage_paths = getattr(adapter, "stage_paths", None)

    def held(a: int, b: int) -> dict[str, nn.Module]:
        return {} if stage_paths is None else {p: part(p) for p in stage_paths(a, b)}

    n = len(bounds)
    stages = [
        StageModule(
            adapter,
            layers[a:b],
            {**(first_parts if i == 0 else {}), **held(a, b), **(last_parts if i == n - 1 else {})},
            first=i == 0,
            last=i == n - 1,
            bounds=(a, b),
            shared=cuts.shared,
        )
        for i, (a, b) in enumerate(bounds)
    ]
    return stages, adapter


def local_stage_indices(num_stages: int, pp_size: int, pp_rank: int) -> list[int]:
    """Global indices of the stages pipeline rank ``pp_rank`` holds (stage ``s`` on ``s % pp_size``)."""
    return [s for s in range(num_stages) if s % pp_size == pp_rank]


def local_stage_modules(
    sch: Schedule, pp_group: Any, pp_rank: int | None = None, adapter: PipelineAdapter | None = None
) -> list[StageModule]:
    """This rank's stage modules, as :func:`build_pipeline` will place them (no communication).

    Takes: the schedule, the pipeline group, this rank's index in it (default: its rank there) and
    the adapter. Raises: ScheduleError as :func:`build_stage_modules` does.
    """
    pp_size = int(dist.get_world_size(pp_group))
    rank = int(dist.get_rank(pp_group)) if pp_rank is None else pp_rank
    stages, _ = build_stage_modules(sch, adapter)
    return [stages[s] for s in local_stage_indices(len(stages), pp_size, rank)]


@dataclass(frozen=True)
class TiedParam:
    """A parameter used by stages on more than one pipeline rank (e.g. tied input/output embeddings).

    ``param`` is ``None`` on ranks that hold none of those stages.
    """

    name: str
    shape: torch.Size
    dtype: torch.dtype
    param: nn.Parameter | None


def find_tied(stages: list[StageModule], pp_size: int, rank: int) -> list[TiedParam]:
    """Return the parameters shared by stages that live on different ranks, in a fixed order."""
    owners: dict[int, set[int]] = {}
    params: dict[int, tuple[str, nn.Parameter]] = {}
    for s, mod in enumerate(stages):
        for name, p in mod.named_parameters(remove_duplicate=False):
            owners.setdefault(id(p), set()).add(s % pp_size)
            params.setdefault(id(p), (f"stage{s}.{name}", p))
    out = []
    for pid, ranks in owners.items():
        if len(ranks) > 1:
            name, p = params[pid]
            out.append(TiedParam(name, p.shape, p.dtype, p if rank in ranks else None))
    return sorted(out, key=lambda t: t.name)


@dataclass
class PipelineRuntime:
    """What :func:`build_pipeline` returns for one rank.

    Attributes:
        schedule: the torch.distributed.pipelining schedule; call :meth:`step`.
        input_keys: the batch keys the first stage takes, in order (the adapter's).
        target_key: the batch key the last stage's loss function takes as its target.
        stages: this rank's PipelineStage objects; modules: their stage modules (same order).
        stage_indices: global stage indices held by this rank; num_stages: all stages.
        grad_divisor: what :meth:`step` divides every gradient by after the schedule (the
            micro-batch count when this rank's stages share parameters, else 1: torch did it).
    """

    schedule: Any
    stages: list[Any]
    modules: list[StageModule]
    stage_indices: list[int]
    num_stages: int
    has_first: bool = field(default=False)
    has_last: bool = field(default=False)
    tied: list[TiedParam] = field(default_factory=list)
    group: Any = None
    input_keys: tuple[str, ...] = ("input_ids",)
    target_key: str = "labels"
    grad_divisor: int = 1
    _params: list[nn.Parameter] | None = field(default=None, repr=False)

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters (for its optimizer), each once; collected on the first call (the
        stages are fixed once built), so a training step may ask for them every time."""
        if self._params is None:
            seen: dict[int, nn.Parameter] = {}
            for m in self.modules:
                for p in m.parameters():
                    seen.setdefault(id(p), p)
            self._params = list(seen.values())
        return list(self._params)

    def tied_params(self) -> list[nn.Parameter]:
        """This rank's parameters that stages on other ranks share (summed by :meth:`sync_tied_grads`)."""
        return [t.param for t in self.tied if t.param is not None]

    def sync_tied_grads(self) -> None:
        """Sum the gradients of parameters shared by stages on different ranks (tied embeddings).

        Every rank of the pipeline group takes part, in the same order; ranks without the
        parameter add zeros. :meth:`step` calls it; call it yourself after ``schedule.step``.
        """
        for tp in self.tied:
            p = tp.param
            if p is None:
                buf = torch.zeros(tp.shape, dtype=tp.dtype)
            else:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                buf = p.grad
            dist.all_reduce(buf, group=self.group)

    def step(self, *args: Any, target: torch.Tensor | None = None) -> torch.Tensor | None:
        """Run one pipelined forward+backward on the whole batch ``args`` (split in microbatches).

        Returns: on the rank holding the last stage, the mean microbatch loss (if a loss_fn was
        given) or the merged output; ``None`` elsewhere.
        """
        losses: list[torch.Tensor] = []
        kw: dict[str, Any] = {"target": target, "losses": losses} if self.has_last else {}
        out = self.schedule.step(*args, **kw) if self.has_first else self.schedule.step(**kw)
        if self.grad_divisor != 1:  # the schedule left the micro-batch mean to us (see build_pipeline)
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.div_(self.grad_divisor)
        self.sync_tied_grads()
        if self.has_last and losses:
            return torch.stack([x.detach() for x in losses]).mean()
        return out if self.has_last else None


def build_pipeline(
    sch: Schedule,
    *,
    pp_group: Any,
    grad_accum: int,
    pp_rank: int | None = None,
    schedule: str = "gpipe",
    virtual_stages: int = 1,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    adapter: PipelineAdapter | None = None,
    device: torch.device | str | None = None,
) -> PipelineRuntime:
    """Build this rank's pipeline stages and their schedule.

    Takes: the schedule (its root carries the cuts); the pipeline ProcessGroup; the number of
    microbatches; this rank's index in the group (default: its rank there); ``schedule`` one of
    ``SCHEDULES`` ("interleaved" needs ``virtual_stages >= 2``); the loss function
    ``loss_fn(output, target)`` (needed for training); an adapter (default: by model family);
    the device (default: CPU). Stage ``s`` lives on pipeline rank ``s % pp_size``.
    Returns: a :class:`PipelineRuntime`.
    Raises: ScheduleError if the stage count is not pp_size * virtual_stages, the schedule name is
    unknown, or the microbatch count does not suit the schedule.
    """
    # imported here: it takes seconds, and only a pipelined schedule needs it
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    if schedule not in SCHEDULES:
        raise ScheduleError(f"unknown pipeline schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if virtual_stages < 1 or (schedule == "interleaved") != (virtual_stages > 1):
        raise ScheduleError(
            f"schedule={schedule!r} with virtual_stages={virtual_stages}: 'interleaved' needs "
            "virtual_stages >= 2 and the others need 1; change one of them"
        )
    if grad_accum < 1:
        raise ScheduleError(f"grad_accum (the pipeline's micro-batches) must be >= 1: got {grad_accum}")
    pp_size = int(dist.get_world_size(pp_group))
    rank = int(dist.get_rank(pp_group)) if pp_rank is None else pp_rank
    stages_all, used = build_stage_modules(sch, adapter)
    n = len(stages_all)
    if n != pp_size * virtual_stages:
        raise ScheduleError(
            f"pipeline stages must equal pp_size * virtual_stages: got {n} stages ({n - 1} cuts) for "
            f"pp_size={pp_size}, virtual_stages={virtual_stages}; make {pp_size * virtual_stages - 1} cuts"
        )
    if schedule == "interleaved" and grad_accum % pp_size != 0:
        raise ScheduleError(
            f"interleaved 1F1B needs grad_accum divisible by pp_size: got {grad_accum} for pp_size={pp_size}"
        )
    dev = torch.device(device) if device is not None else torch.device("cpu")
    mine = local_stage_indices(n, pp_size, rank)
    modules = [stages_all[s] for s in mine]
    class Stage(PipelineStage):  # type: ignore[misc]
        # Shape inference runs each stage once on tensors made from the received metadata, which
        # torch leaves uninitialised; integer inputs (token ids a user's stage embeds again: see
        # autoslapo.user_pipeline) must be valid indices, so they are zeros here.
        def _to_tensor(self, arg: Any) -> torch.Tensor:
            t = super()._to_tensor(arg)
            if not isinstance(arg, torch.Tensor) and not t.is_floating_point():
                t.zero_()
            return t  # type: ignore[no-any-return]

    pstages: list[Any] = [Stage(stages_all[s], s, n, dev, group=pp_group) for s in mine]
    for m in modules:  # their first forward is torch's shape inference (StageModule.forward)
        m.probe_next = True
    # torch divides a stage's gradients by the micro-batch count after that stage's last backward;
    # two local stages holding one module (ALBERT's shared layer, interleaved) would divide it twice,
    # the second time mid-accumulation, so then the runtime divides each gradient once after the step
    held = [id(p) for m in modules for p in m.parameters()]
    own_scale = len(held) != len(set(held))
    sched: Any
    if schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(pstages, n_microbatches=grad_accum, loss_fn=loss_fn,
                                        scale_grads=not own_scale)
    else:
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        sched = cls(pstages[0], n_microbatches=grad_accum, loss_fn=loss_fn)
    sch.root().meta["pipeline_built"] = {"schedule": schedule, "stages": n, "pp_size": pp_size}
    return PipelineRuntime(
        schedule=sched,
        stages=pstages,
        modules=modules,
        stage_indices=mine,
        num_stages=n,
        has_first=0 in mine,
        has_last=n - 1 in mine,
        tied=find_tied(stages_all, pp_size, rank),
        group=pp_group,
        input_keys=tuple(used.input_keys),
        # a stage builder's stages compute their own loss (the target is not read): any batch key
        target_key="labels" if "labels" in used.input_keys or sch.root().meta.get(STAGE_BUILDER_KEY) is None
        else used.input_keys[0],
        grad_divisor=grad_accum if own_scale else 1,
    )
