"""Where each model family keeps its parts: one short :class:`FamilyDescription` per family.

The one knob-driven schedule (``autoslapo.plan.apply_schedule``) reads these descriptions instead
of knowing any model class: the layer list, and inside a layer the attention (q/k/v or a fused
q|k|v), its output projection, the MLP's input and output projections, the norms, the integer
attributes a forward uses after its heads were sharded, the embeddings and the LM head. Paths are
those of the transformers 5 LM classes ``autoslapo.models.build`` constructs. Adding a family is one
more description here (and its config in ``build``), not another schedule.

Pure data. How a family runs as pipeline stages is read from these descriptions by
``autoslapo.models.adapters``.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.models.spec import ModelSpec

__all__ = [
    "FAMILY_DESCRIPTIONS",
    "FamilyDescription",
    "family_description",
    "get_family",
    "list_families",
    "register_family",
]


@dataclass(frozen=True)
class FamilyDescription:
    """Where one family's parts live, as dotted paths.

    Whole-model paths: ``layers`` (the ModuleList of transformer layers), ``embed_tokens`` (the token
    embedding), ``lm_head`` (the vocabulary projection; ``head_tied`` when it shares the embedding's
    weight), ``embeddings`` (every module the first pipeline stage owns), ``final`` (every module
    the last stage owns, in order).

    Paths inside one layer: ``attention`` (the attention module; ``attention_input`` is how the layer
    passes it the hidden states: a position or a keyword), ``qkv`` (its column-parallel projections:
    q, k, v, or one fused q|k|v with ``qkv_chunks=3``), ``attn_out`` (row-parallel output
    projection), ``attention_attrs`` (integer attributes of ``attention`` its forward uses and that
    shrink by tp), ``mlp`` (the module whose input is the MLP's input; ``None``: the first of
    ``mlp_in``), ``mlp_in`` (column-parallel: fc1, or gate and up), ``mlp_out`` (row-parallel),
    ``mlp_seq_dim`` (the sequence dimension of the MLP's activations: OPT flattens tokens to 2-D
    there), ``norms`` (the norms inside a layer), ``bias_gelu`` (the module holding Linear -> GeLU
    that ``fuse_bias_gelu`` rewrites; ``None``: the family has no bias + GeLU to fuse),
    ``attention_entries`` (where the attention's tensor-parallel region begins when it is not the
    attention module's input: ALBERT's attention module adds its input back as a residual, so the
    region begins at each of q, k, v; empty: at ``attention``).
    """

    name: str
    model_type: str
    layers: str
    embed_tokens: str
    lm_head: str
    head_tied: bool
    embeddings: tuple[str, ...]
    final: tuple[str, ...]
    attention: str
    attention_input: int | str
    qkv: tuple[str, ...]
    qkv_chunks: int
    attn_out: str
    attention_attrs: tuple[str, ...]
    mlp: str | None
    mlp_in: tuple[str, ...]
    mlp_out: str
    norms: tuple[str, ...]
    mlp_seq_dim: int = 1
    bias_gelu: str | None = None
    # An encoder-decoder (T5): ``decoder`` describes the second stack (its ``layers``, ``embed_tokens``
    # and paths inside a layer are read); ``cross_attention`` (its input is the decoder's hidden
    # states at position 0 and the encoder's output at keyword ``cross_kv_input``), ``cross_qkv``
    # (column-parallel) and ``cross_attn_out`` (row-parallel) are a decoder layer's attention over the
    # encoder output; ``position_bias`` is the relative-position table (rows: buckets, columns: heads)
    # in a stack's first layer, which tensor parallelism shards by heads like q/k/v.
    decoder: FamilyDescription | None = None
    cross_attention: str | None = None
    cross_qkv: tuple[str, ...] = ()
    cross_attn_out: str | None = None
    cross_kv_input: str = "key_value_states"
    position_bias: str | None = None
    attention_entries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.qkv_chunks not in (1, 3):
            raise ConfigError(f"qkv_chunks must be 1 (separate q, k, v) or 3 (fused): got {self.qkv_chunks!r}")
        if self.qkv_chunks == 3 and len(self.qkv) != 1:
            raise ConfigError(f"a fused q|k|v (qkv_chunks=3) is one module: got qkv={self.qkv}")
        if self.qkv_chunks == 1 and len(self.qkv) != 3:
            raise ConfigError(f"separate projections need three paths (q, k, v): got qkv={self.qkv}")
        if not self.mlp_in:
            raise ConfigError(f"family {self.name!r} needs at least one MLP input projection")
        if (self.cross_attention is None) != (self.cross_attn_out is None) or (
                self.cross_attention is not None and len(self.cross_qkv) != 3):
            raise ConfigError(
                f"a cross-attention needs its module, three projections (q, k, v) and an output: got "
                f"cross_attention={self.cross_attention}, cross_qkv={self.cross_qkv}, "
                f"cross_attn_out={self.cross_attn_out} for family {self.name!r}"
            )

    @property
    def mlp_input(self) -> str:
        """The module whose input is the MLP's input (where the tensor-parallel region begins)."""
        return self.mlp if self.mlp is not None else self.mlp_in[0]

    def stacks(self) -> tuple[FamilyDescription, ...]:
        """The descriptions of the model's layer stacks in forward order: itself, then its decoder."""
        return (self,) if self.decoder is None else (self, self.decoder)

    def layer_path(self, i: int) -> str:
        """The path of layer ``i``."""
        return f"{self.layers}.{i}"


FAMILY_DESCRIPTIONS: dict[str, FamilyDescription] = {}


def register_family(desc: FamilyDescription) -> FamilyDescription:
    """Add a family description to the registry; returns it.

    Raises: ConfigError if another description already has that name.
    """
    old = FAMILY_DESCRIPTIONS.get(desc.name)
    if old is not None and old != desc:
        raise ConfigError(f"model family {desc.name!r} is already described; pick another name")
    FAMILY_DESCRIPTIONS[desc.name] = desc
    return desc


def get_family(name: str) -> FamilyDescription:
    """The description of family ``name``.

    Raises: ConfigError naming the valid families (and the closest one) for an unknown name.
    """
    if name in FAMILY_DESCRIPTIONS:
        return FAMILY_DESCRIPTIONS[name]
    close = difflib.get_close_matches(name, list(FAMILY_DESCRIPTIONS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"unknown model family {name!r}: valid families are {', '.join(sorted(FAMILY_DESCRIPTIONS))}{hint}"
    )


def list_families() -> list[str]:
    """The described family names, sorted."""
    return sorted(FAMILY_DESCRIPTIONS)


# -- the built-in families -------------------------------------------------------------------------
# Written through a few builders: what a group of families shares is said once, what one family
# has of its own stays at its entry.


def _paths(prefix: str, *names: str) -> tuple[str, ...]:
    """``prefix.name`` for each name: a module's q, k, v projections."""
    return tuple(f"{prefix}.{n}" for n in names)


def _bert_like(name: str, base: str, head: str) -> FamilyDescription:
    # BERT and RoBERTa share the encoder layout; only the base attribute and the head differ.
    return FamilyDescription(
        name=name,
        model_type=name,
        layers=f"{base}.encoder.layer",
        embed_tokens=f"{base}.embeddings.word_embeddings",
        lm_head=f"{head}.decoder",
        head_tied=True,
        embeddings=(f"{base}.embeddings",),
        final=(head.split(".")[0],),
        attention="attention.self",
        attention_input=0,
        qkv=_paths("attention.self", "query", "key", "value"),
        qkv_chunks=1,
        attn_out="attention.output.dense",
        attention_attrs=("num_attention_heads", "all_head_size"),
        mlp="intermediate",
        mlp_in=("intermediate.dense",),
        mlp_out="output.dense",
        norms=("attention.output.LayerNorm", "output.LayerNorm"),
        bias_gelu="intermediate",
    )


def _gpt_like(
    name: str, *, attention: str, qkv: tuple[str, ...], attn_out: str, attention_attrs: tuple[str, ...]
) -> FamilyDescription:
    # GPT-2 and GPT-Neo share the layout (transformer.h, learned positions, ln_f, the c_fc -> GeLU ->
    # c_proj MLP, a head tied to wte); only the attention module differs. One path in ``qkv``: fused.
    return FamilyDescription(
        name=name,
        model_type=name,
        layers="transformer.h",
        embed_tokens="transformer.wte",
        lm_head="lm_head",
        head_tied=True,
        embeddings=("transformer.wte", "transformer.wpe", "transformer.drop"),
        final=("transformer.ln_f", "lm_head"),
        attention=attention,
        attention_input=0,
        qkv=qkv,
        qkv_chunks=3 if len(qkv) == 1 else 1,
        attn_out=attn_out,
        attention_attrs=attention_attrs,
        mlp="mlp",
        mlp_in=("mlp.c_fc",),
        mlp_out="mlp.c_proj",
        norms=("ln_1", "ln_2"),
        bias_gelu="mlp",
    )


BERT = register_family(_bert_like("bert", "bert", "cls.predictions"))
ROBERTA = register_family(_bert_like("roberta", "roberta", "lm_head"))
GPT2 = register_family(
    _gpt_like(
        "gpt2",
        attention="attn",
        qkv=("attn.c_attn",),
        attn_out="attn.c_proj",
        attention_attrs=("num_heads", "split_size", "embed_dim"),
    )
)
OPT = register_family(
    FamilyDescription(
        name="opt",
        model_type="opt",
        layers="model.decoder.layers",
        embed_tokens="model.decoder.embed_tokens",
        lm_head="lm_head",
        head_tied=True,
        embeddings=("model.decoder.embed_tokens", "model.decoder.embed_positions"),
        final=("model.decoder.final_layer_norm", "lm_head"),
        attention="self_attn",
        attention_input="hidden_states",
        qkv=_paths("self_attn", "q_proj", "k_proj", "v_proj"),
        qkv_chunks=1,
        attn_out="self_attn.out_proj",
        attention_attrs=("num_heads", "embed_dim"),
        mlp=None,
        mlp_in=("fc1",),
        mlp_out="fc2",
        # OPTDecoderLayer flattens (batch, seq) into one token dimension before fc1.
        mlp_seq_dim=0,
        norms=("self_attn_layer_norm", "final_layer_norm"),
        bias_gelu=None,  # ReLU MLP
    )
)
LLAMA = register_family(
    FamilyDescription(
        name="llama",
        model_type="llama",
        layers="model.layers",
        embed_tokens="model.embed_tokens",
        lm_head="lm_head",
        head_tied=False,
        embeddings=("model.embed_tokens",),
        final=("model.norm", "lm_head"),
        attention="self_attn",
        attention_input="hidden_states",
        qkv=_paths("self_attn", "q_proj", "k_proj", "v_proj"),
        qkv_chunks=1,
        attn_out="self_attn.o_proj",
        # LlamaAttention infers the head count from the projection width (view(..., -1, head_dim))
        # and keeps heads // kv_heads, which sharding both by tp leaves unchanged.
        attention_attrs=(),
        mlp="mlp",
        mlp_in=("mlp.gate_proj", "mlp.up_proj"),
        mlp_out="mlp.down_proj",
        norms=("input_layernorm", "post_attention_layernorm"),
        bias_gelu=None,  # SwiGLU, no biases
    )
)


def _t5_stack(stack: str, decoder: bool, mlp_in: tuple[str, ...]) -> FamilyDescription:
    # T5Block: layer.0 self-attention, (decoder) layer.1 cross-attention, then the feed-forward layer.
    # The whole-model paths (head, embeddings, final) are the same in both stacks' descriptions.
    ff = f"layer.{2 if decoder else 1}.DenseReluDense"
    cross = "layer.1.EncDecAttention"
    return FamilyDescription(
        name="t5",
        model_type="t5",
        layers=f"{stack}.block",
        embed_tokens=f"{stack}.embed_tokens",
        lm_head="lm_head",
        head_tied=True,
        embeddings=("shared",),
        final=("decoder.final_layer_norm", "lm_head"),
        attention="layer.0.SelfAttention",
        attention_input=0,
        qkv=_paths("layer.0.SelfAttention", "q", "k", "v"),
        qkv_chunks=1,
        attn_out="layer.0.SelfAttention.o",
        attention_attrs=("n_heads", "inner_dim"),  # n_heads shapes the zero bias of a block without a table
        mlp=ff,
        mlp_in=_paths(ff, *mlp_in),
        mlp_out=f"{ff}.wo",
        norms=tuple(f"layer.{i}.layer_norm" for i in range(3 if decoder else 2)),
        bias_gelu=None,  # no biases
        cross_attention=cross if decoder else None,
        cross_qkv=_paths(cross, "q", "k", "v") if decoder else (),
        cross_attn_out=f"{cross}.o" if decoder else None,
        position_bias="layer.0.SelfAttention.relative_attention_bias",
    )


def _t5(mlp_in: tuple[str, ...]) -> FamilyDescription:
    enc = _t5_stack("encoder", False, mlp_in)
    return dataclasses.replace(enc, decoder=_t5_stack("decoder", True, mlp_in))


# T5 (T5ForConditionalGeneration): encoder.block and decoder.block; q/k/v/o and wi/wo without biases;
# the encoder's and decoder's relative-position tables in block 0 of each stack. T5 v1.1's gated MLP
# (wi_0, wi_1) is the same family with other MLP paths: ``family_description`` picks it.
T5 = register_family(_t5(("wi",)))
T5_GATED = _t5(("wi_0", "wi_1"))
# ALBERT: one AlbertLayer (one group of one layer) is run ``num_hidden_layers`` times, so the layer
# list has a single entry that the schedule shards once and checkpoints by call (see
# ``autoslapo.plan``). Its embeddings have width E and are mapped to hidden by the encoder's first
# Linear, which the first pipeline stage owns; pipeline stages run calls [a, b) of the one layer, each
# rank holding a copy whose gradients the pipeline sums (``autoslapo.pipeline.find_tied``).
_ALBERT_QKV = _paths("attention", "query", "key", "value")
ALBERT = register_family(
    FamilyDescription(
        name="albert",
        model_type="albert",
        layers="albert.encoder.albert_layer_groups.0.albert_layers",
        embed_tokens="albert.embeddings.word_embeddings",
        lm_head="predictions.decoder",
        head_tied=True,
        embeddings=("albert.embeddings", "albert.encoder.embedding_hidden_mapping_in"),
        final=("predictions",),
        attention="attention",
        attention_input=0,
        qkv=_ALBERT_QKV,
        qkv_chunks=1,
        attn_out="attention.dense",
        # AlbertAttention infers its heads from the projection width; the attributes are kept true.
        attention_attrs=("num_attention_heads", "all_head_size"),
        mlp=None,
        mlp_in=("ffn",),
        mlp_out="ffn_output",
        norms=("attention.LayerNorm", "full_layer_layer_norm"),
        bias_gelu=None,  # the GeLU runs inside ff_chunk, not a module of its own
        # AlbertAttention ends with LayerNorm(input + dense(...)): its input is also the residual
        attention_entries=_ALBERT_QKV,
    )
)
# GPT-Neo: q/k/v without biases; each attention module holds its own causal (global) or banded
# (local) mask as a buffer, so sharding heads leaves the masks valid.
GPT_NEO = register_family(
    _gpt_like(
        "gpt_neo",
        attention="attn.attention",
        qkv=_paths("attn.attention", "q_proj", "k_proj", "v_proj"),
        attn_out="attn.attention.out_proj",
        attention_attrs=("num_heads", "embed_dim"),
    )
)


def family_description(spec: ModelSpec) -> FamilyDescription:
    """The description of ``spec``'s model: its family's, or a variant its ``extra`` selects (T5 v1.1).

    Raises: ConfigError for an unknown family (as ``get_family``).
    """
    if spec.encoder_decoder and spec.t5("gated"):
        return T5_GATED
    return get_family(spec.family)
