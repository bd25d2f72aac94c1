"""How a Hugging Face config.json of ``model_type`` "t5" reads into the T5 family's ``ModelSpec``
(``autoslapo.models.hf`` registers the reader): the shape keys, the ``T5_EXTRA`` keys of
``ModelSpec.extra`` taken from the config, what is written back into transformers' config from the
spec, and what is refused.

Pure: no torch or transformers import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.models.spec import ModelSpec

__all__ = ["T5_KEYS", "check_t5", "config_bool", "t5_derived", "t5_extra"]


def config_bool(config: Mapping[str, Any], key: str, default: bool) -> bool:
    """``config[key]`` as a JSON boolean (``default`` when absent or null); ConfigError for another type
    (a string "false" would read as true)."""
    v = config.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConfigError(f"config.json {key!r} must be true or false: got {v!r}; write it as a JSON boolean")
    return v


def _int(config: Mapping[str, Any], key: str) -> int:
    v = config.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ConfigError(f"a t5 config.json needs an integer {key!r}: got {v!r}; fix it in the config")
    return v


# T5: relative positions (no table; the published models train on 512 source tokens), an encoder
# and a decoder stack. The spec's T5 keys (``T5_EXTRA``) hold what the config says of both stacks;
# ``derived`` writes them back, so shape flags (``--layers`` moves both stacks) reach the model.
T5_KEYS: dict[str, str] = {
    "hidden": "d_model",
    "layers": "num_layers",
    "heads": "num_heads",
    "ffn": "d_ff",
    "vocab": "vocab_size",
}


def t5_extra(config: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's T5 keys from a config (transformers' T5Config defaults where a key is absent).

    Raises: ConfigError for a non-integer ``d_kv`` or ``relative_attention_num_buckets``.
    """
    layers = config.get("num_layers")
    decoder_layers = config.get("num_decoder_layers")
    return {
        "decoder_layers": decoder_layers if decoder_layers is not None else layers,
        "d_kv": _int(config, "d_kv") if config.get("d_kv") is not None else 64,
        "gated": str(config.get("feed_forward_proj", "relu")).startswith("gated-"),
        "tied": config_bool(config, "tie_word_embeddings", True),
        "buckets": _int(config, "relative_attention_num_buckets")
        if config.get("relative_attention_num_buckets") is not None
        else 32,
    }


def t5_derived(spec: ModelSpec) -> dict[str, Any]:
    """The T5Config keys that follow from the spec (its decoder depth, head width and buckets)."""
    return {
        "num_decoder_layers": spec.decoder_layers,
        "d_kv": spec.head_dim,
        "relative_attention_num_buckets": int(spec.t5("buckets")),
    }


def check_t5(config: Mapping[str, Any], spec: ModelSpec) -> None:
    """Refuse a T5 config that is not an encoder-decoder. Raises: ConfigError with the fix."""
    if config.get("is_encoder_decoder") is False:
        raise ConfigError(
            "a t5 config with is_encoder_decoder false is not the encoder-decoder autoslapo schedules "
            "(T5ForConditionalGeneration): got is_encoder_decoder=False; set it to true"
        )
