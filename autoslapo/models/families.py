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

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    pass

__all__ = [
    "FAMILY_DESCRIPTIONS",
    "FamilyDescription",
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
    attention_entries: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.qkv_chunks not in (1, 3):
            raise ConfigError(f"qkv_chunks must be 1 (separate q, k, v) or 3 (fused): got {self.qkv_chunks}")
        if self.qkv_chunks == 3 and len(self.qkv) != 1:
            raise ConfigError(f"a fused q|k|v (qkv_chunks=3) is one module: got qkv={self.qkv}")
        if self.qkv_chunks == 1 and len(self.qkv) != 3:
            raise ConfigError(f"separate projections need three paths (q, k, v): got qkv={self.qkv}")
        if not self.mlp_in:
            raise ConfigError(f"family {self.name!r} needs at least one MLP input projection")

    @property
    def mlp_input(self) -> str:
        """The module whose input is the MLP's input (where the tensor-parallel region begins)."""
        return self.mlp if self.mlp is not None else self.mlp_in[0]

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
        qkv=("attention.self.query", "attention.self.key", "attention.self.value"),
        qkv_chunks=1,
        attn_out="attention.output.dense",
        attention_attrs=("num_attention_heads", "all_head_size"),
        mlp="intermediate",
        mlp_in=("intermediate.dense",),
        mlp_out="output.dense",
        norms=("attention.output.LayerNorm", "output.LayerNorm"),
        bias_gelu="intermediate",
    )


BERT = register_family(_bert_like("bert", "bert", "cls.predictions"))
ROBERTA = register_family(_bert_like("roberta", "roberta", "lm_head"))
GPT2 = register_family(
    FamilyDescription(
        name="gpt2",
        model_type="gpt2",
        layers="transformer.h",
        embed_tokens="transformer.wte",
        lm_head="lm_head",
        head_tied=True,
        embeddings=("transformer.wte", "transformer.wpe", "transformer.drop"),
        final=("transformer.ln_f", "lm_head"),
        attention="attn",
        attention_input=0,
        qkv=("attn.c_attn",),
        qkv_chunks=3,
        attn_out="attn.c_proj",
        attention_attrs=("num_heads", "split_size", "embed_dim"),
        mlp="mlp",
        mlp_in=("mlp.c_fc",),
        mlp_out="mlp.c_proj",
        norms=("ln_1", "ln_2"),
        bias_gelu="mlp",
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
        qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
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
        qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
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
# ALBERT: one AlbertLayer (one group of one layer) is run ``num_hidden_layers`` times, so the layer
# list has a single entry that the schedule shards once and checkpoints by call (see
# ``autoslapo.plan``). Its embeddings have width E and are mapped to hidden by the encoder's first
# Linear, which the first pipeline stage would own; a pipeline is refused (``autoslapo.layout``).
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
        qkv=("attention.query", "attention.key", "attention.value"),
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
        attention_entries=("attention.query", "attention.key", "attention.value"),
    )
)
# GPT-Neo: q/k/v without biases; each attention module holds its own causal (global) or banded
# (local) mask as a buffer, so sharding heads leaves the masks valid.
GPT_NEO = register_family(
    FamilyDescription(
        name="gpt_neo",
        model_type="gpt_neo",
        layers="transformer.h",
        embed_tokens="transformer.wte",
        lm_head="lm_head",
        head_tied=True,
        embeddings=("transformer.wte", "transformer.wpe", "transformer.drop"),
        final=("transformer.ln_f", "lm_head"),
        attention="attn.attention",
        attention_input=0,
        qkv=("attn.attention.q_proj", "attn.attention.k_proj", "attn.attention.v_proj"),
        qkv_chunks=1,
        attn_out="attn.attention.out_proj",
        attention_attrs=("num_heads", "embed_dim"),
        mlp="mlp",
        mlp_in=("mlp.c_fc",),
        mlp_out="mlp.c_proj",
        norms=("ln_1", "ln_2"),
        bias_gelu="mlp",
    )
)
