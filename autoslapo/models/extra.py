"""The family-specific keys of ``ModelSpec.extra``: what each family requires, T5's keys and their
defaults, the checks ``ModelSpec`` runs on them, and T5's per-block parameter count.

Pure: no torch or transformers import; ``ModelSpec`` is imported for typing only (it imports this).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.models.spec import ModelSpec

#: The ``ModelSpec.extra`` keys each family requires, with their types.
FAMILY_EXTRA: dict[str, dict[str, type]] = {
    "albert": {"embedding_size": int},
    "gpt_neo": {"window_size": int, "attention_pattern": list},
}

# T5's keys in ``ModelSpec.extra`` and their defaults (None: derived from the spec). ``layers`` and
# ``seq_len`` are the encoder's; ``decoder_layers`` / ``decoder_seq_len`` the decoder's (default: the
# same); ``d_kv`` the width of one head (default hidden // heads; t5-3b has 32 heads of 128 on a
# 1024-wide model, so heads * d_kv need not equal hidden); ``gated``: T5 v1.1's gated-GeLU MLP
# (wi_0, wi_1, wo) instead of ReLU (wi, wo); ``tied``: the LM head shares the embedding (T5 v1.0)
# and the decoder output is scaled by hidden**-0.5 before it; ``buckets``: relative-position buckets.
T5_EXTRA: dict[str, Any] = {
    "decoder_layers": None, "decoder_seq_len": None, "d_kv": None, "gated": False, "tied": True, "buckets": 32,
}

# ``extra`` keys a spec read from a config.json carries beside its family's (``autoslapo.models.hf``).
HF_EXTRA_KEYS = ("hf_config", "tie_word_embeddings")


def _check_t5_extra(spec: ModelSpec, max_len: int) -> None:
    unknown = sorted(set(spec.extra) - set(T5_EXTRA) - set(HF_EXTRA_KEYS))
    if unknown:
        raise ConfigError(f"unknown {spec.family} extra keys {unknown} for {spec.preset}; valid keys are "
                          f"{sorted(T5_EXTRA)}")
    if "tie_word_embeddings" in spec.extra and spec.extra["tie_word_embeddings"] != spec.t5("tied"):
        raise ConfigError(f"{spec.family} extra tie_word_embeddings and tied must agree: got "
                          f"{spec.extra['tie_word_embeddings']!r} and {spec.t5('tied')!r} for {spec.preset}")
    for key in ("decoder_layers", "decoder_seq_len", "d_kv", "buckets"):
        v = spec.extra.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= max_len):
            raise ConfigError(f"{spec.family} extra {key} must be a positive integer: got {v!r} for "
                              f"{spec.preset}; give a positive {key} in ModelSpec.extra")
    for key in ("gated", "tied"):
        if not isinstance(spec.extra.get(key, T5_EXTRA[key]), bool):
            raise ConfigError(f"{spec.family} extra {key} must be true or false: got {spec.extra[key]!r} "
                              f"for {spec.preset}")


def check_extra(spec: ModelSpec, *, max_width: int, max_len: int) -> None:
    """Check ``spec.extra`` for its family: the keys it requires present, typed and sane (widths up
    to ``max_width``, lengths and depths up to ``max_len``); T5's keys known and typed.

    Raises: ConfigError naming the key, the value and the fix.
    """
    if spec.encoder_decoder:
        _check_t5_extra(spec, max_len)
    need = FAMILY_EXTRA.get(spec.family, {})
    for key, typ in need.items():
        v = spec.extra.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise ConfigError(
                f"a {spec.family} model needs extra[{key!r}] as {typ.__name__}: got {v!r} for {spec.preset}; "
                f"start from a {spec.family} preset (`autoslapo models`)"
            )
    if spec.family == "albert" and not 0 < spec.extra["embedding_size"] <= max_width:
        raise ConfigError(f"embedding_size must be in 1..{max_width:,}: got {spec.extra['embedding_size']}")
    if spec.family == "gpt_neo":
        pattern, window = spec.extra["attention_pattern"], spec.extra["window_size"]
        if not pattern or any(t not in ("global", "local") for t in pattern):
            raise ConfigError(
                f"attention_pattern must be a non-empty list of 'global'/'local': got {pattern!r} for {spec.preset}"
            )
        if window < 1:
            raise ConfigError(f"window_size must be a positive integer: got {window!r} for {spec.preset}")


def t5_block_params(spec: ModelSpec) -> tuple[int, int]:
    """Parameters of one T5 encoder block and one decoder block (no biases; RMS norms of ``hidden``).

    Encoder: self-attention (q, k, v of ``hidden x heads*d_kv``, o back) + MLP + 2 norms; decoder:
    the same plus cross-attention and a third norm. The relative-position tables (``buckets x
    heads`` in each stack's first block) are counted in ``embedding_params``.
    """
    h, f, inner = spec.hidden, spec.ffn, spec.heads * spec.head_dim
    attn = 4 * h * inner
    mlp = (3 if spec.t5("gated") else 2) * h * f
    return attn + mlp + 2 * h, 2 * attn + mlp + 3 * h


def memo_count(fn: Callable[[Any], int]) -> Callable[[Any], int]:
    """A spec's count computed once (a spec is immutable), kept in its instance ``__dict__``, which
    the frozen dataclass's fields, equality and ``to_dict`` ignore: a sweep asks for it millions of times."""
    key = "_memo_" + fn.__name__

    @functools.wraps(fn)
    def once(self: Any) -> int:
        if key not in self.__dict__:
            self.__dict__[key] = fn(self)
        return int(self.__dict__[key])

    return once
