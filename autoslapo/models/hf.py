"""Hugging Face ``config.json`` -> ``ModelSpec``: one small registry, ``model_type`` -> how to read it.

A config whose ``model_type`` is a family autoslapo schedules, or a close relative that keeps that
family's module layout (Mistral and Qwen2 are LLaMA's), becomes a ``ModelSpec`` of that family:
the shape (hidden, layers, heads, key/value heads, MLP width, vocabulary, positions) goes into the
spec's fields, and the rest of the config into ``spec.extra`` so that ``build_model`` gives exactly
the transformers model of that config and a study records the config's contents, not its path.

Keys this module writes into ``ModelSpec.extra`` (part of the spec's signature):

* ``hf_config``: the config.json without its shape keys (the spec's fields hold those, so shape
  flags override them) and without bookkeeping (``architectures``, ``transformers_version``,
  ``torch_dtype`` ...). It holds ``model_type``. ``build_model`` builds transformers' own class
  for that ``model_type`` from it plus the spec's shape.
* ``tie_word_embeddings``: whether the LM head shares the token embedding's weight.
* ``qkv_bias`` / ``out_bias`` / ``mlp_bias`` (gated-MLP families only): which projections of a
  layer carry biases (Qwen2: q, k, v; LLaMA's ``attention_bias``: q, k, v and o).
* T5 (``model_type`` "t5"): its ``T5_EXTRA`` keys (``decoder_layers``, ``d_kv``, ``gated``,
  ``tied``, ``buckets``) from ``num_decoder_layers``, ``d_kv``, ``feed_forward_proj`` ("gated-..."),
  ``tie_word_embeddings`` and ``relative_attention_num_buckets``. A config gives no target length:
  the decoder trains on as many tokens as the encoder (``extra["decoder_seq_len"]`` unset).

A relative that differs from its family in a way the schedule or the cost model does not follow
is refused with the reason (a sliding attention window shorter than the sequence; a head width
other than hidden / heads; OPT's projected embeddings). Another family adds its model types with
:func:`register_hf_model_type`.

Pure: no torch or transformers import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.hf_t5 import T5_KEYS, check_t5, config_bool, t5_derived, t5_extra
from autoslapo.models.spec import FAMILIES, ModelSpec, mlp_width

__all__ = [
    "DEFAULT_SEQ_LEN",
    "HF_CONFIG_KEY",
    "HF_MODEL_TYPES",
    "HFModelType",
    "check_hf_spec",
    "hf_config_kwargs",
    "register_hf_model_type",
    "spec_from_hf_config",
]

HF_CONFIG_KEY = "hf_config"

# A config gives the position table's size, not the training length: train on the table, up to
# this many tokens (LLaMA-2's length; Mistral's 32k table would make every estimate a long-context
# one). ``--seq-len`` picks another.
DEFAULT_SEQ_LEN = 4096

# Bookkeeping keys of a config.json that do not change the model: dropped from the record so two
# copies of a config saved by different transformers versions are the same study.
_BOOKKEEPING = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "_attn_implementation",
        "attn_implementation",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "id2label",
        "label2id",
        "quantization_config",
    }
)

# ModelSpec field -> the config key most configs of a family name it.
_DECODER_KEYS: dict[str, str] = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "ffn": "intermediate_size",
    "vocab": "vocab_size",
    "max_positions": "max_position_embeddings",
}
_BERT_KEYS = {k: v for k, v in _DECODER_KEYS.items() if k != "kv_heads"}
_GPT2_KEYS: dict[str, str] = {
    "hidden": "n_embd",
    "layers": "n_layer",
    "heads": "n_head",
    "ffn": "n_inner",
    "vocab": "vocab_size",
    "max_positions": "n_positions",
}
_OPT_KEYS = {**_BERT_KEYS, "ffn": "ffn_dim"}


@dataclass(frozen=True)
class HFModelType:
    """How to read one ``model_type``'s config.json into a family's ``ModelSpec``.

    ``keys`` maps ModelSpec fields to the config's keys (a missing ``kv_heads`` means no GQA, a
    missing ``ffn`` the family's width rule; a family without a position table, e.g. relative
    positions, names no ``max_positions`` and gives ``positions`` instead); ``lm_class`` is the
    transformers class built (the family's LM head: causal or masked); ``position_offset`` is how many rows the position table has
    beyond the positions (RoBERTa: 2); ``dropout_keys`` are the config's dropout probabilities;
    ``derived`` gives config keys that follow from the shape (OPT's ``word_embed_proj_dim``);
    ``check`` refuses a config whose structure the family's schedule or cost model does not
    follow (it raises ConfigError); ``extra`` gives the cost-model keys of ``ModelSpec.extra``.
    """

    model_type: str
    family: str
    lm_class: str
    keys: Mapping[str, str]
    dropout_keys: tuple[str, ...]
    position_offset: int = 0
    positions: int = 0
    tied_default: bool = True
    derived: Callable[[ModelSpec], dict[str, Any]] = field(default=lambda spec: {})
    check: Callable[[Mapping[str, Any], ModelSpec], None] = field(default=lambda config, spec: None)
    extra: Callable[[Mapping[str, Any]], dict[str, Any]] = field(default=lambda config: {})

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(
                f"model_type {self.model_type!r} maps to unknown family {self.family!r}; "
                f"valid families: {', '.join(sorted(FAMILIES))}"
            )
        missing = sorted({"hidden", "layers", "heads", "vocab"} - set(self.keys))
        if missing:
            raise ConfigError(f"model_type {self.model_type!r} must name the config keys of {missing}")
        if ("max_positions" in self.keys) == (self.positions > 0):
            raise ConfigError(
                f"model_type {self.model_type!r} must give either a max_positions config key or "
                f"positions > 0: got keys={dict(self.keys)}, positions={self.positions}"
            )


HF_MODEL_TYPES: dict[str, HFModelType] = {}


def register_hf_model_type(entry: HFModelType) -> HFModelType:
    """Add a ``model_type`` reader to the registry; returns it.

    Raises: ConfigError if that ``model_type`` already has a different reader.
    """
    old = HF_MODEL_TYPES.get(entry.model_type)
    if old is not None and old != entry:
        raise ConfigError(f"model_type {entry.model_type!r} already has a config reader")
    HF_MODEL_TYPES[entry.model_type] = entry
    return entry


def _int(config: Mapping[str, Any], key: str, model_type: str) -> int:
    v = config.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        got = "null" if v is None else repr(v)  # as the JSON reads
        fix = ("add it to the config" if key not in config else
               "write a whole number" if v is None else f"write it as a whole number (it is a {type(v).__name__})")
        raise ConfigError(f"a {model_type} config.json needs an integer {key!r}: got {got}; {fix}")
    return v


def _config_words(message: str, entry: HFModelType) -> str:
    """``message`` of a shape rule, which names the CLI's shape flags (``--heads``), with the config's
    keys instead (``num_attention_heads``): the shape came from the config.json, not from flags."""
    names = {f"--{f.replace('_', '-')}": k for f, k in entry.keys.items()}
    if "max_positions" in entry.keys:
        names["--seq-len"] = entry.keys["max_positions"]  # the sequence trained: up to the position table
    for flag in sorted(names, key=len, reverse=True):  # --kv-heads before --heads
        message = re.sub(rf"{re.escape(flag)}(?![\w-])", names[flag], message)
    return message


def spec_from_hf_config(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """The ``ModelSpec`` of a Hugging Face config (the parsed config.json).

    Takes: the config dict; the spec's display name (default: its ``model_type``).
    Returns: a spec of the family that schedules that ``model_type``, trained on
    ``min(positions, DEFAULT_SEQ_LEN)`` tokens, the rest of the config in ``extra``.
    Raises: UsageError for a missing or unsupported ``model_type`` (naming the supported ones);
    ConfigError for a missing shape key or a structure the family does not follow.
    """
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise UsageError(
            f"config.json model_type must be one of {', '.join(sorted(HF_MODEL_TYPES))}: got {model_type!r}; "
            "use a config of one of those or a preset (`autoslapo models`)"
        )
    entry = HF_MODEL_TYPES[str(model_type)]
    shape: dict[str, Any] = {}
    for fname, key in entry.keys.items():
        # transformers' own defaults: no GQA; GPT-2's n_inner=None is 4 x hidden (a gated MLP has no
        # such rule in transformers, so its width must be given)
        if config.get(key) is None and (
            fname == "kv_heads" or (fname == "ffn" and not FAMILIES[entry.family]["gated_mlp"])
        ):
            continue
        shape[fname] = _int(config, key, entry.model_type)
    shape["max_positions"] = shape.get("max_positions", entry.positions) - entry.position_offset
    if "ffn" not in shape:
        shape["ffn"] = mlp_width(entry.family, shape["hidden"])
    shape["seq_len"] = min(shape["max_positions"], DEFAULT_SEQ_LEN)
    rest = {k: v for k, v in sorted(config.items()) if k not in _BOOKKEEPING and k not in entry.keys.values()}
    rest.pop("head_dim", None)  # a derived key: checked against hidden / heads, rebuilt from the shape
    rest.pop("tie_word_embeddings", None)  # recorded once, in extra
    tied = config_bool(config, "tie_word_embeddings", entry.tied_default)
    extra = {HF_CONFIG_KEY: rest, "tie_word_embeddings": tied, **entry.extra(config)}
    try:
        spec = ModelSpec(family=entry.family, preset=name or entry.model_type, extra=extra, **shape)
    except ConfigError as e:  # a shape rule: named by the config's keys, which the user wrote
        raise ConfigError(_config_words(str(e), entry)) from None
    _check_head_dim(config, spec)
    entry.check(config, spec)
    return spec


def _check_head_dim(config: Mapping[str, Any], spec: ModelSpec) -> None:
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != spec.head_dim:
        raise ConfigError(
            f"head_dim must equal hidden / heads for autoslapo's {spec.family} family: got "
            f"head_dim={head_dim}, hidden={spec.hidden}, heads={spec.heads} ({spec.head_dim}); use a config "
            "whose heads span the width"
        )


def check_hf_spec(spec: ModelSpec) -> None:
    """Check a spec read from a config again after shape overrides (``--seq-len`` past a window ...).

    Raises: ConfigError naming the rule; nothing for a spec that is not from a config.
    """
    rest = spec.extra.get(HF_CONFIG_KEY)
    if rest is None:
        return
    entry = HF_MODEL_TYPES.get(str(rest.get("model_type")))
    if entry is None:
        raise ConfigError(
            f"the spec's config has model_type {rest.get('model_type')!r}, which no reader "
            f"knows; supported: {', '.join(sorted(HF_MODEL_TYPES))}"
        )
    entry.check(rest, spec)


def hf_config_kwargs(spec: ModelSpec, dropout: float | None = None) -> tuple[HFModelType, dict[str, Any]]:
    """The keyword arguments of transformers' config for a spec read from a config.json.

    Returns: the reader's entry and the config's contents with the spec's shape (overrides
    included) and the given dropout. Raises: ConfigError when the spec is not from a config.
    """
    rest = dict(spec.extra.get(HF_CONFIG_KEY) or {})
    model_type = rest.pop("model_type", None)
    if model_type not in HF_MODEL_TYPES:
        raise ConfigError(
            f"spec {spec.preset!r} does not come from a supported config.json (model_type "
            f"{model_type!r}); supported: {', '.join(sorted(HF_MODEL_TYPES))}"
        )
    entry = HF_MODEL_TYPES[str(model_type)]
    check_hf_spec(spec)
    kw = {**rest, **{key: getattr(spec, fname) for fname, key in entry.keys.items()}}
    if "max_positions" in entry.keys:
        kw[entry.keys["max_positions"]] = spec.max_positions + entry.position_offset
    kw["tie_word_embeddings"] = bool(spec.extra.get("tie_word_embeddings", entry.tied_default))
    kw.update(entry.derived(spec))
    if dropout is not None:
        kw.update({k: dropout for k in entry.dropout_keys})
    return entry, kw


# -- the supported model types ----------------------------------------------------------------------


def _check_window(config: Mapping[str, Any], spec: ModelSpec) -> None:
    # Mistral attends to a window of past tokens; when the window covers the whole sequence this is
    # full causal attention, which the schedule's pipeline stages and the cost model assume.
    window = config.get("sliding_window")
    active = config.get("use_sliding_window", True)  # Qwen2 turns its window on with this flag
    if window is not None and active and window < spec.seq_len:
        raise ConfigError(
            f"sliding_window must cover the sequence (autoslapo schedules full causal attention): got "
            f"sliding_window={window}, seq_len={spec.seq_len} for {config.get('model_type')}; give "
            f"--seq-len {window} or less, or set sliding_window to null in the config"
        )


def _decoder_extra(qkv_key: str | None, out_key: str | None) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    def extra(config: Mapping[str, Any]) -> dict[str, Any]:
        qkv = True if qkv_key == "always" else bool(config.get(qkv_key or "", False))
        return {
            "qkv_bias": qkv,
            "out_bias": bool(config.get(out_key or "", False)),
            "mlp_bias": bool(config.get("mlp_bias", False)),
        }

    return extra


def _check_decoder(config: Mapping[str, Any], spec: ModelSpec) -> None:
    _check_window(config, spec)


def _check_not_decoder_of(config: Mapping[str, Any], spec: ModelSpec) -> None:
    if config.get("is_decoder") or config.get("add_cross_attention"):
        raise ConfigError(
            f"a {config.get('model_type')} config with is_decoder or add_cross_attention is not the LM "
            f"autoslapo schedules (no cross-attention): got is_decoder={config.get('is_decoder')!r}, "
            f"add_cross_attention={config.get('add_cross_attention')!r}; set both to false"
        )


def _check_opt(config: Mapping[str, Any], spec: ModelSpec) -> None:
    proj = config.get("word_embed_proj_dim")
    if proj is not None and proj != spec.hidden:
        raise ConfigError(
            f"word_embed_proj_dim must equal hidden_size for autoslapo's opt family (no project_in/out): got "
            f"{proj}, hidden_size={spec.hidden} (OPT-350m's layout); use a config with equal widths"
        )


_LLAMA_DROPOUT = ("attention_dropout",)
register_hf_model_type(
    HFModelType(
        "llama",
        "llama",
        "LlamaForCausalLM",
        _DECODER_KEYS,
        _LLAMA_DROPOUT,
        tied_default=False,
        derived=lambda s: {"head_dim": s.head_dim},
        check=_check_decoder,
        extra=_decoder_extra("attention_bias", "attention_bias"),
    )
)
register_hf_model_type(
    HFModelType(
        "mistral",
        "llama",
        "MistralForCausalLM",
        _DECODER_KEYS,
        _LLAMA_DROPOUT,
        tied_default=False,
        derived=lambda s: {"head_dim": s.head_dim},
        check=_check_decoder,
        extra=_decoder_extra(None, None),
    )
)
register_hf_model_type(
    HFModelType(
        "qwen2",
        "llama",
        "Qwen2ForCausalLM",
        _DECODER_KEYS,
        _LLAMA_DROPOUT,
        tied_default=False,
        check=_check_decoder,
        extra=_decoder_extra("always", None),  # Qwen2: biases on q, k, v only
    )
)
register_hf_model_type(
    HFModelType(
        "gpt2",
        "gpt2",
        "GPT2LMHeadModel",
        _GPT2_KEYS,
        ("resid_pdrop", "embd_pdrop", "attn_pdrop"),
        check=_check_not_decoder_of,
    )
)
register_hf_model_type(
    HFModelType(
        "opt",
        "opt",
        "OPTForCausalLM",
        _OPT_KEYS,
        ("dropout", "attention_dropout"),
        derived=lambda s: {"word_embed_proj_dim": s.hidden},
        check=_check_opt,
    )
)
register_hf_model_type(
    HFModelType(
        "bert",
        "bert",
        "BertForMaskedLM",
        _BERT_KEYS,
        ("hidden_dropout_prob", "attention_probs_dropout_prob"),
        check=_check_not_decoder_of,
    )
)
register_hf_model_type(
    HFModelType(
        "roberta",
        "roberta",
        "RobertaForMaskedLM",
        _BERT_KEYS,
        ("hidden_dropout_prob", "attention_probs_dropout_prob"),
        position_offset=2,
        check=_check_not_decoder_of,
    )
)


# -- ALBERT and GPT-Neo -------------------------------------------------------------------------------


def _check_albert(config: Mapping[str, Any], spec: ModelSpec) -> None:
    groups, inner = config.get("num_hidden_groups", 1), config.get("inner_group_num", 1)
    if groups != 1 or inner != 1:
        raise ConfigError(
            f"an albert config must share one layer (num_hidden_groups=1, inner_group_num=1, as every "
            f"published ALBERT does): got num_hidden_groups={groups}, inner_group_num={inner}; set both to 1"
        )
    if not isinstance(config.get("embedding_size"), int):
        raise ConfigError(
            f"an albert config needs an integer 'embedding_size': got {config.get('embedding_size')!r}; add it"
        )


def _neo_pattern(config: Mapping[str, Any]) -> list[str]:
    """GPT-Neo's ``attention_types`` ([[["global", "local"], 12]]) as one type a layer."""
    types = config.get("attention_types", [[["global", "local"], max(1, int(config.get("num_layers", 2)) // 2)]])
    try:
        pattern = [str(t) for kinds, n in types for _ in range(int(n)) for t in kinds]
    except (TypeError, ValueError):
        raise ConfigError(
            f"a gpt_neo config's attention_types must be [[[types...], repeats], ...]: got {types!r}; fix it"
        ) from None
    bad = sorted(set(pattern) - {"global", "local"})
    if bad or not pattern:
        raise ConfigError(f"gpt_neo attention types must be 'global' or 'local': got {bad or pattern}; fix attention_types")
    return pattern


def _check_gpt_neo(config: Mapping[str, Any], spec: ModelSpec) -> None:
    if not isinstance(config.get("window_size", 256), int):
        raise ConfigError(f"a gpt_neo config's window_size must be an integer: got {config.get('window_size')!r}")
    _neo_pattern(config)


register_hf_model_type(
    HFModelType(
        "albert",
        "albert",
        "AlbertForMaskedLM",
        _BERT_KEYS,
        ("hidden_dropout_prob", "attention_probs_dropout_prob"),
        check=_check_albert,
        extra=lambda config: {"embedding_size": int(config.get("embedding_size", 128))},
    )
)
register_hf_model_type(
    HFModelType(
        "gpt_neo",
        "gpt_neo",
        "GPTNeoForCausalLM",
        {
            "hidden": "hidden_size",
            "layers": "num_layers",
            "heads": "num_heads",
            "ffn": "intermediate_size",
            "vocab": "vocab_size",
            "max_positions": "max_position_embeddings",
        },
        ("embed_dropout", "attention_dropout", "resid_dropout"),
        # one run of length 1 per layer, so a --layers override keeps the pattern's cycle
        derived=lambda s: {"attention_types": [[[t], 1] for t in s.layer_attention_types()]},
        check=_check_gpt_neo,
        extra=lambda config: {"window_size": int(config.get("window_size", 256)),
                              "attention_pattern": _neo_pattern(config)},
    )
)


# -- T5 (its config's reading: ``autoslapo.models.hf_t5``) ---------------------------------------------

register_hf_model_type(
    HFModelType(
        "t5",
        "t5",
        "T5ForConditionalGeneration",
        T5_KEYS,
        ("dropout_rate",),
        positions=512,
        derived=t5_derived,
        check=check_t5,
        extra=t5_extra,
    )
)
