"""Pipeline parallelism: ``cut_pipeline_stage`` marks stage boundaries, ``build_pipeline`` runs them.

``sch["encoder.layer.1"].cut_pipeline_stage()`` records, in the root's ``meta["pipeline_cuts"]``,
that a stage ends after that child of a ModuleList / nn.Sequential. ``build_pipeline`` then builds
this rank's stage module(s) and a ``torch.distributed.pipelining`` schedule.

Stages are built by hand rather than with torch's export-based ``pipeline()``: HF models do not
export cleanly (data-dependent masks, output dataclasses), and a hand-built stage keeps the very
parameter objects of the unchanged model, so names, tied tensors and optimizers line up with the
unpipelined run. What a model family must say is small: a :class:`PipelineAdapter` (the layer
list's path, which modules the first and last stages own, and how to embed / run a layer / apply the
head). :class:`PathAdapter` builds one from attribute paths plus a few functions; adapters for
nn.Sequential, BERT and GPT-2 are registered, and a family adds its own with
:func:`register_pipeline_adapter`.

The layers see only the hidden states: per-layer context (attention mask, position ids) is rebuilt
on every stage from the hidden states by ``adapter.context``, so padding masks are not carried
between stages (full-length batches, as in pre-training).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from autoslapo.errors import ScheduleError

if TYPE_CHECKING:
    from autoslapo.schedule import Schedule

__all__ = [
    "SCHEDULES",
    "PathAdapter",
    "PipelineAdapter",
    "PipelineRuntime",
    "StageModule",
    "TiedParam",
    "adapter_for",
    "build_pipeline",
    "build_stage_modules",
    "cut_pipeline_stage",
    "local_stage_indices",
    "local_stage_modules",
    "pipeline_cuts",
    "register_pipeline_adapter",
    "stage_bounds",
]

SCHEDULES = ("gpipe", "1f1b", "interleaved")
CUTS_KEY = "pipeline_cuts"


# -- cut --------------------------------------------------------------------------------------------


def _index(node: Schedule) -> int:
    assert node.parent is not None
    return list(node.parent.children).index(node.name)


def cut_pipeline_stage(sch: Schedule) -> None:
    """Mark a pipeline-stage boundary right after the module at ``sch``.

    Takes: a node that is a child (not the last) of an nn.ModuleList or nn.Sequential; every cut of
    one model must lie in the same container. Records the path in ``root.meta["pipeline_cuts"]``
    (kept in layer order) and sets ``sch.meta["pipeline_cut"]``.
    Raises: ScheduleError for the root, a child of another kind of module, the last child, a
    second cut at the same place, or cuts in two different containers.
    """
    parent = sch.parent
    if parent is None:
        raise ScheduleError(
            "cut_pipeline_stage needs a child of a ModuleList or nn.Sequential: got the root; "
            "cut after a layer, e.g. sch['encoder.layer.1'].cut_pipeline_stage()"
        )
    if not isinstance(parent.mod, nn.ModuleList | nn.Sequential):
        raise ScheduleError(
            f"cut_pipeline_stage cuts only between children of a ModuleList or nn.Sequential: "
            f"{sch.path!r} is a child of {type(parent.mod).__name__} {parent.path!r}; "
            "cut after one of the layers of the model's layer list instead"
        )
    names = list(parent.children)
    if sch.name == names[-1]:
        raise ScheduleError(
            f"cut_pipeline_stage after the last child leaves an empty stage: {sch.path!r} is the last of "
            f"{len(names)} children of {parent.path or '<root>'!r}; cut after an earlier one"
        )
    root = sch.root()
    cuts: list[str] = root.meta.setdefault(CUTS_KEY, [])
    if sch.path in cuts:
        raise ScheduleError(f"{sch.path!r} is already a pipeline cut; each boundary is cut once")
    if cuts:
        other = root[cuts[0]].parent
        if other is not parent:
            raise ScheduleError(
                f"all pipeline cuts must lie in one layer list: {sch.path!r} is in {parent.path or '<root>'!r} "
                f"but earlier cuts are in {other.path if other is not None else '<root>'!r}"
            )
    cuts.append(sch.path)
    cuts.sort(key=lambda p: _index(root[p]))
    sch.meta["pipeline_cut"] = True


def pipeline_cuts(sch: Schedule) -> list[str]:
    """Return the cut paths recorded on the root of ``sch``, in layer order (empty if none)."""
    return list(sch.root().meta.get(CUTS_KEY, []))


def stage_bounds(num_layers: int, cut_indices: list[int]) -> list[tuple[int, int]]:
    """Split ``range(num_layers)`` after each cut index into ``[start, stop)`` slices.

    Raises: ScheduleError if the cut indices are not increasing and inside ``[0, num_layers - 1)``.
    """
    if any(b <= a for a, b in itertools.pairwise(cut_indices)):
        raise ScheduleError(f"pipeline cuts must be increasing: got layer indices {cut_indices}")
    if cut_indices and (cut_indices[0] < 0 or cut_indices[-1] >= num_layers - 1):
        raise ScheduleError(f"pipeline cuts {cut_indices} do not fit {num_layers} layers")
    starts = [0, *[c + 1 for c in cut_indices]]
    stops = [*[c + 1 for c in cut_indices], num_layers]
    return list(zip(starts, stops, strict=True))


# -- adapters ---------------------------------------------------------------------------------------


@runtime_checkable
class PipelineAdapter(Protocol):
    """How to run one model family as a stack of layers.

    ``layers_path`` is the ModuleList / nn.Sequential holding the layers; ``first_paths`` and
    ``last_paths`` are the modules the first and last stages own (embeddings; final norm and head).
    ``parts`` maps those paths to the modules. ``context`` runs on every stage and returns the
    keyword arguments each layer needs (attention mask, position ids), built from hidden states.
    """

    @property
    def layers_path(self) -> str:
        """Dotted path of the layer list ("" when the model is the nn.Sequential itself)."""
        ...

    @property
    def first_paths(self) -> tuple[str, ...]:
        """Paths of the modules the first stage owns (embeddings)."""
        ...

    @property
    def last_paths(self) -> tuple[str, ...]:
        """Paths of the modules the last stage owns (final norm, head)."""
        ...

    def embed(self, parts: Mapping[str, nn.Module], *inputs: Any) -> torch.Tensor:
        """Turn the model inputs into the first layer's hidden states."""
        ...

    def context(self, hidden: torch.Tensor) -> dict[str, Any]:
        """Keyword arguments for every layer, built from the hidden states."""
        ...

    def layer(self, layer: nn.Module, hidden: torch.Tensor, context: Mapping[str, Any]) -> torch.Tensor:
        """Run one layer and return its hidden states."""
        ...

    def head(self, parts: Mapping[str, nn.Module], hidden: torch.Tensor) -> torch.Tensor:
        """Turn the last layer's hidden states into the model output (e.g. logits)."""
        ...


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ScheduleError(
        f"a pipeline layer must return a tensor or a tuple starting with one: got {type(out).__name__}; "
        "give the adapter a layer function that picks the hidden states"
    )


@dataclass(frozen=True)
class PathAdapter:
    """A :class:`PipelineAdapter` from attribute paths and up to four functions.

    Attributes:
        layers_path: dotted path of the layer list ("" if the model is the nn.Sequential itself).
        first_paths / last_paths: modules the first / last stage owns.
        embed_fn: ``(parts, *inputs) -> hidden``; default: the single input passes through.
        head_fn: ``(parts, hidden) -> output``; default: call each of ``last_paths`` in order.
        context_fn: ``hidden -> kwargs for layers``; default: none.
        layer_fn: ``(layer, hidden, context) -> hidden``; default: ``layer(hidden, **context)``,
            first element if it returns a tuple.
    """

    layers_path: str
    first_paths: tuple[str, ...] = ()
    last_paths: tuple[str, ...] = ()
    embed_fn: Callable[..., torch.Tensor] | None = None
    head_fn: Callable[[Mapping[str, nn.Module], torch.Tensor], torch.Tensor] | None = None
    context_fn: Callable[[torch.Tensor], dict[str, Any]] | None = None
    layer_fn: Callable[[nn.Module, torch.Tensor, Mapping[str, Any]], torch.Tensor] | None = None

    def embed(self, parts: Mapping[str, nn.Module], *inputs: Any) -> torch.Tensor:
        """See :class:`PipelineAdapter`."""
        if self.embed_fn is not None:
            return self.embed_fn(parts, *inputs)
        hidden = inputs[0] if len(inputs) == 1 else inputs
        for p in self.first_paths:
            hidden = _first(parts[p](hidden))
        return hidden  # type: ignore[return-value]

    def context(self, hidden: torch.Tensor) -> dict[str, Any]:
        """See :class:`PipelineAdapter`."""
        return {} if self.context_fn is None else self.context_fn(hidden)

    def layer(self, layer: nn.Module, hidden: torch.Tensor, context: Mapping[str, Any]) -> torch.Tensor:
        """See :class:`PipelineAdapter`."""
        if self.layer_fn is not None:
            return self.layer_fn(layer, hidden, context)
        return _first(layer(hidden, **context))

    def head(self, parts: Mapping[str, nn.Module], hidden: torch.Tensor) -> torch.Tensor:
        """See :class:`PipelineAdapter`."""
        if self.head_fn is not None:
            return self.head_fn(parts, hidden)
        for p in self.last_paths:
            hidden = _first(parts[p](hidden))
        return hidden


def _sequential_adapter(model: nn.Module, layers_path: str) -> PipelineAdapter:
    return PathAdapter(layers_path=layers_path)


def _bert_adapter(model: nn.Module, layers_path: str) -> PipelineAdapter:
    pre = "bert." if hasattr(model, "bert") else ""
    last = ("cls",) if hasattr(model, "cls") else ()

    def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor, *rest: Any) -> torch.Tensor:
        token_type_ids = rest[0] if rest else None
        return parts[f"{pre}embeddings"](input_ids=input_ids, token_type_ids=token_type_ids)

    return PathAdapter(
        layers_path=f"{pre}encoder.layer",
        first_paths=(f"{pre}embeddings",),
        last_paths=last,
        embed_fn=embed,
    )


def _gpt2_adapter(model: nn.Module, layers_path: str) -> PipelineAdapter:
    pre = "transformer." if hasattr(model, "transformer") else ""
    config = model.config  # type: ignore[attr-defined]
    last = (f"{pre}ln_f", "lm_head") if hasattr(model, "lm_head") else (f"{pre}ln_f",)

    def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        hidden = parts[f"{pre}wte"](input_ids) + parts[f"{pre}wpe"](pos)
        return parts[f"{pre}drop"](hidden)

    def context(hidden: torch.Tensor) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask

        pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(
            config=config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=pos
        )
        return {"attention_mask": mask}

    return PathAdapter(
        layers_path=f"{pre}h",
        first_paths=(f"{pre}wte", f"{pre}wpe", f"{pre}drop"),
        last_paths=last,
        embed_fn=embed,
        context_fn=context,
    )


AdapterFactory = Callable[[nn.Module, str], PipelineAdapter]
_ADAPTERS: dict[str, AdapterFactory] = {"bert": _bert_adapter, "gpt2": _gpt2_adapter}


def register_pipeline_adapter(model_type: str, factory: AdapterFactory) -> None:
    """Register ``factory(model, layers_path) -> PipelineAdapter`` for HF ``config.model_type``.

    Raises: ScheduleError if ``model_type`` already has a different factory.
    """
    old = _ADAPTERS.get(model_type)
    if old is not None and old is not factory:
        raise ScheduleError(f"a pipeline adapter for model_type {model_type!r} is already registered")
    _ADAPTERS[model_type] = factory


def adapter_for(model: nn.Module, layers_path: str) -> PipelineAdapter:
    """Pick the adapter for ``model``: by HF ``config.model_type``, or the generic one when the
    layer list is an nn.Sequential model's own children (``layers_path == ""``).

    Raises: ScheduleError naming the registered model types when none fits.
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in _ADAPTERS:
        return _ADAPTERS[str(model_type)](model, layers_path)
    if isinstance(model, nn.Sequential) and layers_path == "":
        return _sequential_adapter(model, layers_path)
    raise ScheduleError(
        f"no pipeline adapter for {type(model).__name__} (model_type={model_type!r}); registered: "
        f"{', '.join(sorted(_ADAPTERS))} and nn.Sequential; pass adapter=PathAdapter(...) or "
        "register_pipeline_adapter(model_type, factory)"
    )


# -- stages -----------------------------------------------------------------------------------------


class StageModule(nn.Module):
    """One pipeline stage: layers ``[start, stop)`` of the layer list, plus the parts it owns.

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
    ) -> None:
        super().__init__()
        self.adapter = adapter
        self.layers = nn.ModuleList(layers)
        self.owned = nn.ModuleDict({p.replace(".", "__"): m for p, m in parts.items()})
        self.first = first
        self.last = last
        self.bounds = bounds

    @property
    def parts(self) -> dict[str, nn.Module]:
        """The parts this stage owns, by their path in the model."""
        return {k.replace("__", "."): m for k, m in self.owned.items()}

    def forward(self, *args: Any) -> torch.Tensor:
        hidden = self.adapter.embed(self.parts, *args) if self.first else args[0]
        ctx = self.adapter.context(hidden)
        for layer in self.layers:
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
    cuts = pipeline_cuts(root)
    if not cuts:
        raise ScheduleError(
            "build_pipeline needs pipeline cuts: none recorded; call sch['<layers>.<i>'].cut_pipeline_stage()"
        )
    parent = root[cuts[0]].parent
    assert parent is not None
    if adapter is None:
        adapter = adapter_for(root.mod, parent.path)
    if adapter.layers_path != parent.path:
        raise ScheduleError(
            f"the pipeline cuts are in {parent.path or '<root>'!r} but the adapter's layer list is "
            f"{adapter.layers_path or '<root>'!r}; cut after children of {adapter.layers_path or '<root>'!r}"
        )
    layers = list(parent.mod.children())
    bounds = stage_bounds(len(layers), [_index(root[c]) for c in cuts])

    def part(path: str) -> nn.Module:
        if path not in root:
            raise ScheduleError(f"pipeline adapter names {path!r}, which is not a submodule of the model")
        return root[path].mod

    first_parts = {p: part(p) for p in adapter.first_paths}
    last_parts = {p: part(p) for p in adapter.last_paths}
    n = len(bounds)
    stages = [
        StageModule(
            adapter,
            layers[a:b],
            {**(first_parts if i == 0 else {}), **(last_parts if i == n - 1 else {})},
            first=i == 0,
            last=i == n - 1,
            bounds=(a, b),
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
    import torch.distributed as dist

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
        stages: this rank's PipelineStage objects; modules: their stage modules (same order).
        stage_indices: global stage indices held by this rank; num_stages: all stages.
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

    def sync_tied_grads(self) -> None:
        """Sum the gradients of parameters shared by stages on different ranks (tied embeddings).

        Every rank of the pipeline group takes part, in the same order; ranks without the
        parameter add zeros. :meth:`step` calls it; call it yourself after ``schedule.step``.
        """
        import torch.distributed as dist

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
        self.sync_tied_grads()
        if self.has_last and losses:
            return torch.stack([x.detach() for x in losses]).mean()
        return out if self.has_last else None


def build_pipeline(
    sch: Schedule,
    *,
    pp_group: Any,
    n_microbatches: int,
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
    import torch.distributed as dist
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
    if n_microbatches < 1:
        raise ScheduleError(f"n_microbatches must be >= 1: got {n_microbatches}")
    pp_size = int(dist.get_world_size(pp_group))
    rank = int(dist.get_rank(pp_group)) if pp_rank is None else pp_rank
    stages_all, _ = build_stage_modules(sch, adapter)
    n = len(stages_all)
    if n != pp_size * virtual_stages:
        raise ScheduleError(
            f"pipeline stages must equal pp_size * virtual_stages: got {n} stages ({n - 1} cuts) for "
            f"pp_size={pp_size}, virtual_stages={virtual_stages}; make {pp_size * virtual_stages - 1} cuts"
        )
    if schedule == "interleaved" and n_microbatches % pp_size != 0:
        raise ScheduleError(
            f"interleaved 1F1B needs n_microbatches divisible by pp_size: got {n_microbatches} for pp_size={pp_size}"
        )
    dev = torch.device(device) if device is not None else torch.device("cpu")
    mine = local_stage_indices(n, pp_size, rank)
    modules = [stages_all[s] for s in mine]
    pstages: list[Any] = [PipelineStage(stages_all[s], s, n, dev, group=pp_group) for s in mine]
    sched: Any
    if schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(pstages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        sched = cls(pstages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
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
    )
