"""How each model family runs as a stack of pipeline layers: one :class:`PipelineAdapter` a family.

A pipeline stage sees only hidden states, so a family says which module list holds its layers,
which modules the first and last stages own, how to embed the inputs, what per-layer context
(mask, positions, rotary tables) to rebuild on every stage, and how to apply the final modules.
:class:`PathAdapter` builds one from attribute paths plus a few functions; the families of
``autoslapo.models.families`` get theirs from their descriptions (the LM classes and their base
models alike: ``BertModel`` as well as ``BertForMaskedLM``); an ``nn.Sequential`` model gets the
generic one; another model type adds its own with :func:`register_pipeline_adapter`.
``autoslapo.pipeline.build_pipeline`` picks one with :func:`adapter_for`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from autoslapo.errors import ConfigError, ScheduleError
from autoslapo.models.families import FAMILY_DESCRIPTIONS, FamilyDescription, get_family
from autoslapo.models.hf import HF_MODEL_TYPES
from autoslapo.models.t5_stages import t5_stage_adapter
from autoslapo.models.wideresnet import WideResNet

__all__ = [
    "PathAdapter",
    "PipelineAdapter",
    "adapter_for",
    "pipeline_adapter",
    "register_pipeline_adapter",
    "wideresnet_adapter",
]


@runtime_checkable
class PipelineAdapter(Protocol):
    """How to run one model family as a stack of layers.

    ``layers_path`` is the ModuleList / nn.Sequential holding the layers; ``first_paths`` and
    ``last_paths`` are the modules the first and last stages own (embeddings; final norm and head).
    ``parts`` maps those paths to the modules. ``context`` runs on every stage and returns the
    keyword arguments each layer needs (attention mask, position ids), built from hidden states.
    ``input_keys`` names the batch entries the first stage takes, in order (``("input_ids",)`` for
    a language model); the last stage always takes ``labels`` as the loss's target. What passes
    between stages may be one tensor or a tuple of tensors (``embed``/``layer`` choose).
    Optional: ``layer_lists`` (several layer lists run as one, in order: an encoder-decoder's stacks;
    default ``(layers_path,)``) and ``stage_paths(start, stop)`` (modules a stage holding layers
    ``[start, stop)`` owns besides them), read by ``autoslapo.pipeline.build_stage_modules``.
    """

    @property
    def input_keys(self) -> tuple[str, ...]:
        """Batch keys the first stage's ``embed`` takes, in order."""
        ...

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
        input_keys: batch keys the first stage takes (default ``("input_ids",)``).
    """

    layers_path: str
    first_paths: tuple[str, ...] = ()
    last_paths: tuple[str, ...] = ()
    embed_fn: Callable[..., torch.Tensor] | None = None
    head_fn: Callable[[Mapping[str, nn.Module], torch.Tensor], torch.Tensor] | None = None
    context_fn: Callable[[torch.Tensor], dict[str, Any]] | None = None
    layer_fn: Callable[[nn.Module, torch.Tensor, Mapping[str, Any]], torch.Tensor] | None = None
    input_keys: tuple[str, ...] = ("input_ids",)

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


# -- the described families ------------------------------------------------------------------------


def _positions(hidden: torch.Tensor) -> torch.Tensor:
    return torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)


def _causal_mask(config: Any, hidden: torch.Tensor, pos: torch.Tensor) -> Any:
    from transformers.masking_utils import create_causal_mask

    return create_causal_mask(
        config=config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=pos
    )


def _chain(parts: Mapping[str, nn.Module], paths: tuple[str, ...], hidden: torch.Tensor) -> torch.Tensor:
    for p in paths:
        hidden = parts[p](hidden)
    return hidden


def _exists(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def _rebase(desc: FamilyDescription, model: nn.Module) -> Callable[[str], str | None]:
    """Map a description's path (written for the LM class) onto ``model``.

    The LM classes wrap a base model (``bert``, ``transformer``, ``model``); given the base model
    itself, its paths lose that prefix and the head, which only the LM class has, is gone (None).
    """
    base = desc.layers.split(".")[0]
    if hasattr(model, base):
        return lambda path: path
    return lambda path: path[len(base) + 1:] if path.startswith(f"{base}.") else None


def _adapter_parts(desc: FamilyDescription, model: nn.Module, at: Callable[[str], str | None]) -> dict[str, Any]:
    """The embed / context / head functions of ``desc``'s family, bound to ``model``."""
    config = model.config  # type: ignore[attr-defined]
    embed: Callable[..., torch.Tensor]
    context: Callable[[torch.Tensor], dict[str, Any]] | None = None
    emb = [str(at(p)) for p in desc.embeddings]

    if desc.name in ("bert", "roberta"):

        def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor, *rest: Any) -> torch.Tensor:
            return parts[emb[0]](input_ids=input_ids, token_type_ids=rest[0] if rest else None)

    elif desc.name == "albert":
        # word/position/type tables of width E, then the encoder's E -> hidden map; no mask (no padding)
        table, mapping = emb

        def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor, *rest: Any) -> torch.Tensor:
            return parts[mapping](parts[table](input_ids=input_ids, token_type_ids=rest[0] if rest else None))

    elif desc.name in ("gpt2", "gpt_neo"):
        wte, wpe, drop = emb

        def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
            return parts[drop](parts[wte](input_ids) + parts[wpe](_positions(input_ids)))

        def context(hidden: torch.Tensor) -> dict[str, Any]:
            return {"attention_mask": _causal_mask(config, hidden, _positions(hidden))}

    elif desc.name == "opt":
        tok, pos_emb = emb

        def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
            ones = torch.ones(input_ids.shape, dtype=torch.long, device=input_ids.device)
            return parts[tok](input_ids) + parts[pos_emb](ones, 0)

        def context(hidden: torch.Tensor) -> dict[str, Any]:
            pos = _positions(hidden)
            return {"attention_mask": _causal_mask(config, hidden, pos), "position_ids": pos}

    elif desc.name == "llama":
        # The rotary table has buffers only (no parameters), so every stage may share the module.
        rotary = model.get_submodule(str(at("model.rotary_emb")))

        def embed(parts: Mapping[str, nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
            return parts[emb[0]](input_ids)

        def context(hidden: torch.Tensor) -> dict[str, Any]:
            pos = _positions(hidden)
            return {
                "attention_mask": _causal_mask(config, hidden, pos),
                "position_ids": pos,
                "position_embeddings": rotary(hidden, position_ids=pos),
            }

    else:
        raise ConfigError(f"no pipeline adapter for family {desc.name!r}; describe its embed/context/head")

    # a head the model lacks (a base model, or another head class than the LM one) is not applied
    final = tuple(p for p in map(at, desc.final) if p is not None and _exists(model, p))

    def head(parts: Mapping[str, nn.Module], hidden: torch.Tensor) -> torch.Tensor:
        return _chain(parts, final, hidden)

    return {"embed_fn": embed, "context_fn": context, "head_fn": head, "last_paths": final,
            "first_paths": tuple(emb), "layers_path": str(at(desc.layers))}


def pipeline_adapter(model: nn.Module, family: str | None = None) -> PathAdapter:
    """A :class:`PathAdapter` running ``model`` as embeddings -> layers -> final modules.

    Takes: a model of a described family, its LM class or its base model; the family (default:
    from ``config.model_type``). Raises: ConfigError for an unknown family.
    """
    name = family or str(getattr(getattr(model, "config", None), "model_type", ""))
    desc = get_family(name)
    return PathAdapter(**_adapter_parts(desc, model, _rebase(desc, model)))


def wideresnet_adapter(model: WideResNet) -> PathAdapter:
    """The WideResNet's stages: the stem on the first, bottleneck blocks, pooling and ``fc`` on the last.

    The first stage takes the batch's ``images``; a feature map (its channels and side change from
    group to group, fixed for each cut) passes between stages; the last returns the logits.
    """

    def embed(parts: Mapping[str, nn.Module], images: torch.Tensor) -> torch.Tensor:
        stem = parts["stem"]
        dtype = next(stem.parameters()).dtype  # float32 batches feed a model built in another dtype
        return stem(images.to(dtype))  # type: ignore[no-any-return]

    def head(parts: Mapping[str, nn.Module], hidden: torch.Tensor) -> torch.Tensor:
        return parts["fc"](torch.flatten(nn.functional.adaptive_avg_pool2d(hidden, 1), 1))

    return PathAdapter(layers_path="blocks", first_paths=("stem",), last_paths=("fc",), embed_fn=embed,
                       head_fn=head, input_keys=("images",))


# -- choosing one ----------------------------------------------------------------------------------

AdapterFactory = Callable[[nn.Module, str], PipelineAdapter]
_ADAPTERS: dict[str, AdapterFactory] = {}


def register_pipeline_adapter(model_type: str, factory: AdapterFactory) -> None:
    """Register ``factory(model, layers_path) -> PipelineAdapter`` for HF ``config.model_type``.

    Raises: ScheduleError if ``model_type`` is a described family or already has a different factory.
    """
    described = {d.model_type for d in FAMILY_DESCRIPTIONS.values()}
    old = _ADAPTERS.get(model_type)
    if model_type in described or (old is not None and old is not factory):
        raise ScheduleError(f"a pipeline adapter for model_type {model_type!r} is already registered")
    _ADAPTERS[model_type] = factory


def adapter_for(model: nn.Module, layers_path: str) -> PipelineAdapter:
    """Pick the adapter for ``model``: the WideResNet's, a described family's by HF ``config.model_type``, then a
    registered one, then the generic one when the layer list is an nn.Sequential model's own
    children (``layers_path == ""``).

    An encoder-decoder (T5) gets :func:`autoslapo.models.t5_stages.t5_stage_adapter`'s.
    Raises: ScheduleError naming the known model types when none fits.
    """
    if isinstance(model, WideResNet):
        return wideresnet_adapter(model)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for desc in FAMILY_DESCRIPTIONS.values():
        if desc.model_type == model_type:
            # an encoder-decoder (T5) runs its two stacks as one layer list, a pair of streams
            return t5_stage_adapter(model) if desc.decoder is not None else pipeline_adapter(model, desc.name)
    if model_type in _ADAPTERS:
        return _ADAPTERS[str(model_type)](model, layers_path)
    if model_type in HF_MODEL_TYPES:
        # a family's close relative from a config.json (Mistral, Qwen2: LLaMA's layout)
        family = HF_MODEL_TYPES[str(model_type)].family
        if get_family(family).decoder is not None:
            return t5_stage_adapter(model)
        return pipeline_adapter(model, family)
    if isinstance(model, nn.Sequential) and layers_path == "":
        return PathAdapter(layers_path="")
    known = sorted({d.model_type for d in FAMILY_DESCRIPTIONS.values()} | set(_ADAPTERS) | set(HF_MODEL_TYPES))
    raise ScheduleError(
        f"no pipeline adapter for {type(model).__name__} (model_type={model_type!r}); known: "
        f"{', '.join(known)} and nn.Sequential; pass adapter=PathAdapter(...) or "
        "register_pipeline_adapter(model_type, factory)"
    )
