"""``ModelSpec``: a model family plus a size, as plain data.

Pure: no torch or transformers import. Building the actual ``nn.Module`` from a spec lives in
``autoslapo.models.build``; the cost model only needs the shape recorded here.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.extra import FAMILY_EXTRA as FAMILY_EXTRA
from autoslapo.models.extra import T5_EXTRA, check_extra, memo_count, t5_block_params
from autoslapo.models.wrn_shape import wrn_end_params, wrn_params

# Families autoslapo can build and schedule. ``causal``: decoder-only LM (causal mask, next-token
# loss); ``gated_mlp``: SwiGLU-style MLP with three matrices (LLaMA); ``learned_pos``: learned
# position embeddings of ``seq_len`` rows (BERT/GPT-2/OPT) rather than rotary (LLaMA); ``gqa``:
# grouped-query attention, fewer key/value heads than query heads (LLaMA); ``encoder_decoder``
# (absent: False): an encoder stack of ``layers`` blocks and a decoder stack (T5; see ``T5_EXTRA``);
# ``convolutional`` (only where true): a convolutional image classifier, no attention, tokens or vocabulary (WideResNet:
# ``hidden``/``ffn`` are channel widths, ``seq_len`` the image side, ``vocab`` the classes; see
# ``autoslapo.models.wrn_shape``). ``extra`` holds no keys for it. Priced by the cost model: ``dropout`` (absent:
# True; no masks without), ``rotary`` positions and ``rms_norm`` as transformers writes them (``norm_kernel``).
FAMILIES: dict[str, dict[str, bool]] = {
    "bert": {"causal": False, "gated_mlp": False, "learned_pos": True, "gqa": False},
    "roberta": {"causal": False, "gated_mlp": False, "learned_pos": True, "gqa": False},
    "gpt2": {"causal": True, "gated_mlp": False, "learned_pos": True, "gqa": False},
    "opt": {"causal": True, "gated_mlp": False, "learned_pos": True, "gqa": False},
    "llama": {"causal": True, "gated_mlp": True, "learned_pos": False, "gqa": True, "dropout": False, "rotary": True, "rms_norm": True},
    "t5": {"causal": False, "gated_mlp": False, "learned_pos": False, "gqa": False, "encoder_decoder": True, "rms_norm": True},
    # ALBERT: ``shared_layers`` (one layer's weights run ``layers`` times; stored once, a copy on
    # every pipeline stage); ``extra["embedding_size"]``: the factorized embedding width E (< hidden), mapped to
    # hidden by ``embedding_hidden_mapping_in``.
    # ``sequence_parallel`` off: AlbertAttention adds its own input back and reads the head count from
    # that input's shape, so its input cannot be sequence-split while q/k/v see whole sequences.
    "albert": {"causal": False, "gated_mlp": False, "learned_pos": True, "gqa": False, "shared_layers": True,
               "sequence_parallel": False},
    # GPT-Neo: ``local_attention`` (layers alternate global and windowed causal attention);
    # ``extra["window_size"]``: the local window (tokens); ``extra["attention_pattern"]``: the layer
    # types, repeated over the layers (["global", "local"] in the published models). No q/k/v biases.
    "gpt_neo": {"causal": True, "gated_mlp": False, "learned_pos": True, "gqa": False, "local_attention": True,
                "qkv_bias": False},
    # WideResNet (``convolutional``): see the presets below for how its shape maps onto ModelSpec.
    "wideresnet": {"causal": False, "gated_mlp": False, "learned_pos": False, "gqa": False, "convolutional": True},
}

# The user's own module (``autoslapo.models.user``): no presets or transformers class; its shape, measured from its file, in ``extra``.
USER_FAMILY = "user"
#: What a user's block's attention module holds and runs, from its trace (``autoslapo.models.user``;
#: the cost of selective recomputation). Left out of ``signature``: the file's digest decides them.
USER_ATTENTION_KEYS = ("attn_act_bytes", "attn_kept_bytes", "attn_core_flops", "attn_core_ops")
USER_FLAGS = {"causal": False, "gated_mlp": False, "learned_pos": False, "gqa": False, "sequence_parallel": False}


def family_flags(family: str) -> dict[str, bool]:
    """The flags of a built-in family or of the user's own module. Raises KeyError for another name."""
    return USER_FLAGS if family == USER_FAMILY else FAMILIES[family]


#: Flags that are on for a family that does not list them.
FLAGS_ON_BY_DEFAULT = ("qkv_bias", "sequence_parallel", "dropout")


def family_flag(family: str, flag: str) -> bool:
    """A family's flag; one a family does not list is off, unless in ``FLAGS_ON_BY_DEFAULT``."""
    return bool(family_flags(family).get(flag, flag in FLAGS_ON_BY_DEFAULT))


def is_convolutional(family: str) -> bool:
    """Whether ``family`` is a convolutional image classifier (no attention, sequence or vocabulary)."""
    return family_flag(family, "convolutional")

# Upper bounds on a shape: several times the largest models published (hidden 25,600, 128 layers,
# 128 heads, vocab 256k, 10M-token contexts), so only typos and absurd values are refused.
MAX_HIDDEN = 2**18  # 262,144
MAX_LAYERS = 2**14  # 16,384
MAX_HEADS = 2**14  # 16,384
MAX_FFN = 2**21  # 2,097,152
MAX_VOCAB = 2**23  # 8,388,608
MAX_SEQ_LEN = 2**24  # 16,777,216 tokens
SHAPE_LIMITS: dict[str, int] = {
    "hidden": MAX_HIDDEN, "layers": MAX_LAYERS, "heads": MAX_HEADS, "kv_heads": MAX_HEADS, "ffn": MAX_FFN,
    "seq_len": MAX_SEQ_LEN, "vocab": MAX_VOCAB, "max_positions": MAX_SEQ_LEN,
}

# LLaMA's SwiGLU MLP width (Meta's reference code): int(multiplier * int(8 * hidden / 3)) rounded up
# to a multiple of ``multiple_of``. Llama-2 7B/13B use (256, 1.0), 70B (4096, 1.3); the tiny test
# preset (32, 1.0). A preset not listed here follows the family default.
GATED_MLP_RULE = (256, 1.0)
GATED_MLP_RULES: dict[str, tuple[int, float]] = {"llama-tiny": (32, 1.0), "llama-70b": (4096, 1.3)}
# Non-gated presets whose MLP is not 4 x hidden: T5-3B's is 16 x 1024.
MLP_MULTIPLES: dict[str, int] = {"t5-3b": 16}

# A WideResNet's width factor (bottleneck width over ``hidden / 4``) where a preset is not torchvision's 2.
WIDTH_FACTORS: dict[str, int] = {"resnet-50": 1, "wideresnet-50-4": 4, "wideresnet-50-8": 8}


def mlp_width(family: str, hidden: int, preset: str = "custom") -> int:
    """The MLP's inner width that ``family`` (and ``preset``'s own rounding) gives a ``hidden`` width.

    4 x hidden for BERT/RoBERTa/GPT-2/OPT/T5 (T5-3B: 16 x, ``MLP_MULTIPLES``); LLaMA's SwiGLU rule (see
    ``GATED_MLP_RULES``) for gated MLPs; a WideResNet's bottleneck width, ``hidden / 4`` x the preset's
    width factor (``WIDTH_FACTORS``, default 2).
    Every preset's ``ffn`` is what this returns for its ``hidden`` (a test checks it).
    """
    if family == "wideresnet":
        return hidden // 4 * WIDTH_FACTORS.get(preset, 2)
    if not family_flags(family)["gated_mlp"]:
        return MLP_MULTIPLES.get(preset, 4) * hidden
    multiple_of, multiplier = GATED_MLP_RULES.get(preset, GATED_MLP_RULE)
    width = int(multiplier * int(8 * hidden / 3))
    return multiple_of * math.ceil(width / multiple_of)


@dataclass(frozen=True)
class ModelSpec:
    """A model family and its shape. Validated on construction; round-trips through ``to_dict``.

    ``kv_heads`` < ``heads`` means grouped-query attention (LLaMA-70B: 64 query, 8 key/value heads).
    ``ffn`` is the MLP's inner width. ``seq_len`` is the training sequence length.
    """

    family: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    seq_len: int
    vocab: int
    kv_heads: int = 0  # 0 -> same as heads
    preset: str = "custom"
    max_positions: int = 0  # 0 -> seq_len (position-table rows for learned-position families)
    # Family-specific shape (ALBERT's embedding width, T5's decoder depth, a Hugging Face config's
    # extras ...): JSON-safe, part of equality and of ``signature`` (so ``best`` finds a study again by
    # shape), left out of the hash. Each family documents its keys where it is described.
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES and self.family != USER_FAMILY:
            raise ConfigError(
                f"model family must be one of {sorted(FAMILIES)}: got {self.family!r}; "
                "pick one of those, or add the family: its flags to FAMILIES in autoslapo/models/spec.py (README: Adding a model family)"
            )
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.max_positions == 0:
            object.__setattr__(self, "max_positions", self.seq_len)
        for name, limit in SHAPE_LIMITS.items():
            v = getattr(self, name)
            flag = "--" + name.replace("_", "-")
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(
                    f"{name} must be a positive integer: got {v!r} for model {self.preset}; give a positive {flag}"
                )
            if v > limit:
                raise ConfigError(
                    f"{name} must be at most {limit:,} (several times the largest model published): got {v:,} "
                    f"for model {self.preset}; give a smaller {flag}"
                )
        if self.hidden % self.heads:
            raise ConfigError(
                f"hidden must be divisible by heads: got hidden={self.hidden}, heads={self.heads}; "
                "change --hidden or --heads"
            )
        if self.kv_heads != self.heads and not family_flags(self.family)["gqa"]:
            raise ConfigError(
                f"kv_heads must equal heads for {self.family} (grouped-query attention is for "
                f"{', '.join(f for f, d in FAMILIES.items() if d['gqa'])} only): got kv_heads={self.kv_heads}, "
                f"heads={self.heads}; drop --kv-heads"
            )
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"kv_heads must divide heads (each key/value head serves heads/kv_heads query heads): got "
                f"kv_heads={self.kv_heads}, heads={self.heads}; use a divisor of {self.heads} for --kv-heads"
            )
        check_extra(self, max_width=MAX_HIDDEN, max_len=MAX_SEQ_LEN)
        if self.max_positions < self.seq_len:
            raise ConfigError(
                f"seq_len must not exceed max_positions: got seq_len={self.seq_len}, "
                f"max_positions={self.max_positions} for {self.preset}; lower --seq-len"
            )

    # --- derived shape -------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        if self.encoder_decoder:
            return int(self.t5("d_kv"))
        return self.hidden // self.heads

    @property
    def encoder_decoder(self) -> bool:
        """An encoder stack of ``layers`` blocks and a decoder stack of ``decoder_layers`` (T5)."""
        return family_flag(self.family, "encoder_decoder")

    def t5(self, key: str) -> Any:
        """The T5 ``extra`` value ``key`` with its default filled in (see ``T5_EXTRA``)."""
        value = self.extra.get(key, T5_EXTRA[key])
        if value is None:
            value = {"decoder_layers": self.layers, "decoder_seq_len": self.seq_len,
                     "d_kv": self.hidden // self.heads}[key]
        return value

    @property
    def decoder_layers(self) -> int:
        """Blocks of the decoder stack (0 for a family without one)."""
        return int(self.t5("decoder_layers")) if self.encoder_decoder else 0

    @property
    def decoder_seq_len(self) -> int:
        """Target (decoder) tokens per sample (0 for a family without a decoder stack)."""
        return int(self.t5("decoder_seq_len")) if self.encoder_decoder else 0

    @property
    def blocks(self) -> int:
        """Every transformer block of the model: ``layers`` plus the decoder's."""
        return self.layers + self.decoder_layers

    @property
    def causal(self) -> bool:
        return family_flags(self.family)["causal"]

    @property
    def gated_mlp(self) -> bool:
        return family_flags(self.family)["gated_mlp"] or (self.encoder_decoder and bool(self.t5("gated")))

    @property
    def shared_layers(self) -> bool:
        """Whether one layer's weights serve every layer (ALBERT): stored once, run ``layers`` times."""
        return family_flag(self.family, "shared_layers")

    @property
    def sequence_parallel_ok(self) -> bool:
        """Whether the family's layers can run sequence-parallel (not ALBERT's, see ``FAMILIES``)."""
        return family_flag(self.family, "sequence_parallel")

    @property
    def local_attention(self) -> bool:
        """Whether some layers attend within a window only (GPT-Neo's local layers)."""
        return "local" in self.extra.get("attention_pattern", ())

    @property
    def stored_layers(self) -> int:
        """Layers whose weights are stored: 1 for a shared-layer family, else ``layers``."""
        return 1 if self.shared_layers else self.layers

    @property
    def embedding_size(self) -> int:
        """The embedding width: ALBERT's factorized ``extra["embedding_size"]``, else ``hidden``."""
        return int(self.extra.get("embedding_size", self.hidden))

    def layer_attention_types(self) -> list[str]:
        """Each layer's attention type: "global", or "local" (GPT-Neo's windowed layers)."""
        pattern = self.extra.get("attention_pattern", ["global"])
        return [str(pattern[i % len(pattern)]) for i in range(self.layers)]

    @property
    def name(self) -> str:
        """The preset name, or ``custom`` for hand-given shapes."""
        return self.preset

    @property
    def tied_head(self) -> bool:
        """Whether the LM head shares the token embedding's weight (``extra["tie_word_embeddings"]``
        from a config.json; T5's ``extra["tied"]``; otherwise the family's: tied except LLaMA)."""
        if self.encoder_decoder:
            return bool(self.t5("tied"))
        return bool(self.extra.get("tie_word_embeddings", self.family != "llama"))

    @memo_count
    def layer_params(self) -> int:
        """Parameters of one transformer layer (weights and biases, norms included); of a WideResNet,
        the mean over its blocks; of T5, one encoder block."""
        if self.family == "wideresnet":
            return (wrn_params(self.hidden, self.ffn, self.layers, self.vocab) - self.embedding_params()) // self.layers
        if self.encoder_decoder:
            return self.t5_block_params()[0]
        if self.family == "user":
            return int(self.extra["layer_params"])
        h, f, kvd = self.hidden, self.ffn, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kvd + h * h  # q, k, v, out
        if self.gated_mlp:
            mlp = 3 * h * f  # gate, up, down; LLaMA has no biases
            # a config.json's relatives may carry some (Qwen2: q, k, v; see autoslapo.models.hf)
            biases = ((h + 2 * kvd) * self.extra.get("qkv_bias", False) + h * self.extra.get("out_bias", False)
                      + (2 * f + h) * self.extra.get("mlp_bias", False))
            return attn + mlp + biases + 2 * h  # two RMSNorm weights
        mlp = 2 * h * f
        qkv_bias = h + 2 * kvd if family_flag(self.family, "qkv_bias") else 0
        biases = qkv_bias + h + f + h
        return attn + mlp + biases + 4 * h  # two LayerNorms (weight + bias)

    @memo_count
    def embedding_params(self) -> int:
        """Token (and learned position) embeddings; the LM head is tied where the family ties it.

        ALBERT: tables of width E, its two token types and embedding LayerNorm, and the E -> hidden map.
        T5: one table shared by both stacks, and each stack's relative-position table.
        A user's module: every parameter outside its repeated blocks. A WideResNet's stem and classifier.
        """
        if self.family == "wideresnet":
            return wrn_end_params(self.hidden, self.layers, self.vocab)
        if self.family == "user":
            return int(self.extra["params"]) - self.layers * self.layer_params()
        e = self.embedding_size
        n = self.vocab * e
        if self.encoder_decoder:
            n += 2 * int(self.t5("buckets")) * self.heads
        if family_flags(self.family)["learned_pos"]:
            n += self.max_positions * e
        if self.family == "albert":
            n += 2 * e + 2 * e + e * self.hidden + self.hidden
        return n

    def t5_block_params(self) -> tuple[int, int]:
        """Parameters of one T5 encoder block and one decoder block (``extra.t5_block_params``)."""
        return t5_block_params(self)

    def num_params(self) -> int:
        """Total parameters (approximate to within the small heads/norms that differ per family).

        A shared layer (ALBERT) counts once. ALBERT's MLM head: hidden -> E transform, LayerNorm, bias.
        T5: encoder and decoder blocks, and the LM head unless tied.
        """
        if self.family == "wideresnet":
            return wrn_params(self.hidden, self.ffn, self.layers, self.vocab)  # exact
        if self.family == "user":
            return int(self.extra["params"])
        head = 0 if self.tied_head else self.vocab * self.hidden  # LLaMA's head is untied
        if self.encoder_decoder:
            enc, dec = self.t5_block_params()
            return (self.layers * enc + self.decoder_layers * dec + self.embedding_params() + head
                    + 2 * self.hidden)
        if self.family == "albert":
            e = self.embedding_size
            head = self.hidden * e + e + 2 * e + self.vocab - 2 * self.hidden
        return self.stored_layers * self.layer_params() + self.embedding_params() + head + 2 * self.hidden

    # --- (de)serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict; ``ModelSpec.from_dict(spec.to_dict()) == spec``."""
        d = asdict(self)
        if not d["extra"]:
            d.pop("extra")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """Inverse of ``to_dict``; unknown keys are an error (never silently dropped)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown model spec keys {unknown}; valid keys are {sorted(known)}")
        return cls(**d)

    def signature(self) -> str:
        """Stable hash of the shape (family and dimensions, not the preset's name; a model file's digest,
        not its name)."""
        d = self.to_dict()
        d.pop("preset", None)
        if self.family == "user":  # a model file is found by its content, whatever the file is called
            d["extra"] = {k: v for k, v in d["extra"].items() if k not in ("module", "attn_core", "bias_gelu", "tp_problem", *USER_ATTENTION_KEYS)}
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_overrides(self, **overrides: int | None) -> ModelSpec:
        """A copy with the given dimensions replaced (``None`` values are ignored), kept consistent.

        A new ``hidden`` without ``ffn`` brings the family's MLP width (``mlp_width``); new ``heads``
        without ``kv_heads`` keep kv_heads == heads unless the model already groups its queries.

        Raises:
            UsageError: an unknown dimension; ConfigError: a shape that breaks a rule (see ``__post_init__``).
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        valid = {"hidden", "layers", "heads", "kv_heads", "ffn", "seq_len", "vocab", "max_positions"}
        bad = sorted(set(given) - valid)
        if bad:
            raise UsageError(f"unknown model override {bad}; valid overrides are {sorted(valid)}")
        if not given:
            return self
        if "hidden" in given and "ffn" not in given:
            given["ffn"] = mlp_width(self.family, given["hidden"], self.preset)
        if "heads" in given and "kv_heads" not in given and self.kv_heads == self.heads:
            given["kv_heads"] = given["heads"]
        if "seq_len" in given and given["seq_len"] > self.max_positions and "max_positions" not in given:
            given["max_positions"] = given["seq_len"]
        changes: dict[str, Any] = dict(given)
        if self.encoder_decoder and "layers" in given and "decoder_layers" in self.extra:
            # T5 presets name both depths; --layers sets both (the published models have equal stacks)
            changes["extra"] = {**self.extra, "decoder_layers": given["layers"]}
        return replace(self, **changes)

    @classmethod
    def from_name(cls, name: str, **overrides: int | None) -> ModelSpec:
        """Look up a preset (``bert``, ``gpt2-xl``, ``llama-7b``, ``bert-tiny`` ...) and apply overrides.

        Raises:
            UsageError: unknown name, with the closest valid names.
        """
        lowered = name.lower().replace("_", "-")  # gpt_neo-tiny is gpt-neo-tiny
        key = ALIASES.get(lowered, lowered)
        if key not in PRESETS:
            close = difflib.get_close_matches(key, list(PRESETS) + list(ALIASES), n=3, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(
                f"unknown model {name!r}: it must be a preset from `autoslapo models`{hint} "
                f"(valid: {', '.join(sorted(PRESETS))})"
            )
        return PRESETS[key].with_overrides(**overrides)


def _p(preset: str, family: str, hidden: int, layers: int, heads: int, ffn: int, seq: int, vocab: int,
       kv: int = 0, max_pos: int = 0, **extra: Any) -> ModelSpec:
    return ModelSpec(family=family, hidden=hidden, layers=layers, heads=heads, ffn=ffn, seq_len=seq,
                     vocab=vocab, kv_heads=kv, preset=preset, max_positions=max_pos,
                     extra=json.loads(json.dumps(extra)))  # no list shared between presets


_NEO: dict[str, Any] = {"window_size": 256, "attention_pattern": ["global", "local"]}


# Shapes from the published configs (bert-*-uncased, roberta-*, gpt2*, facebook/opt-*, Llama-2-*).
# Tiny presets are for tests: 2 layers, hidden 128, vocab 1024, 4 heads (LLaMA: 2 kv heads).
PRESETS: dict[str, ModelSpec] = {
    s.preset: s
    for s in [
        _p("bert-tiny", "bert", 128, 2, 4, 512, 128, 1024, max_pos=512),
        _p("bert-base", "bert", 768, 12, 12, 3072, 512, 30522),
        _p("bert-large", "bert", 1024, 24, 16, 4096, 512, 30522),
        _p("roberta-tiny", "roberta", 128, 2, 4, 512, 128, 1024, max_pos=512),
        _p("roberta-base", "roberta", 768, 12, 12, 3072, 512, 50265),
        _p("roberta-large", "roberta", 1024, 24, 16, 4096, 512, 50265),
        _p("gpt2-tiny", "gpt2", 128, 2, 4, 512, 128, 1024, max_pos=1024),
        _p("gpt2", "gpt2", 768, 12, 12, 3072, 1024, 50257),
        _p("gpt2-medium", "gpt2", 1024, 24, 16, 4096, 1024, 50257),
        _p("gpt2-large", "gpt2", 1280, 36, 20, 5120, 1024, 50257),
        _p("gpt2-xl", "gpt2", 1600, 48, 25, 6400, 1024, 50257),
        _p("opt-tiny", "opt", 128, 2, 4, 512, 128, 1024, max_pos=2048),
        _p("opt-125m", "opt", 768, 12, 12, 3072, 2048, 50272),
        _p("opt-1.3b", "opt", 2048, 24, 32, 8192, 2048, 50272),
        _p("opt-2.7b", "opt", 2560, 32, 32, 10240, 2048, 50272),
        _p("opt-6.7b", "opt", 4096, 32, 32, 16384, 2048, 50272),
        _p("opt-13b", "opt", 5120, 40, 40, 20480, 2048, 50272),
        _p("llama-tiny", "llama", 128, 2, 4, 352, 128, 1024, kv=2, max_pos=2048),
        _p("llama-7b", "llama", 4096, 32, 32, 11008, 4096, 32000),
        _p("llama-13b", "llama", 5120, 40, 40, 13824, 4096, 32000),
        _p("llama-70b", "llama", 8192, 80, 64, 28672, 4096, 32000, kv=8),
        # T5 (Raffel et al.; google-t5/t5-*): encoder source 512 tokens, decoder target 128 here. The
        # tiny one has heads * d_kv != hidden (as t5-3b) and a target shorter than the source.
        _p("t5-tiny", "t5", 128, 2, 4, 512, 64, 1024, decoder_layers=2, decoder_seq_len=32, d_kv=64),
        _p("t5-small", "t5", 512, 6, 8, 2048, 512, 32128, decoder_layers=6, decoder_seq_len=128, d_kv=64),
        _p("t5-base", "t5", 768, 12, 12, 3072, 512, 32128, decoder_layers=12, decoder_seq_len=128, d_kv=64),
        _p("t5-large", "t5", 1024, 24, 16, 4096, 512, 32128, decoder_layers=24, decoder_seq_len=128, d_kv=64),
        _p("t5-3b", "t5", 1024, 24, 32, 16384, 512, 32128, decoder_layers=24, decoder_seq_len=128, d_kv=128),
        # albert-*-v2 (embedding 128, vocab 30000, 512 positions; one shared layer).
        _p("albert-tiny", "albert", 128, 4, 4, 512, 128, 1024, max_pos=512, embedding_size=32),
        _p("albert-base", "albert", 768, 12, 12, 3072, 512, 30000, embedding_size=128),
        _p("albert-large", "albert", 1024, 24, 16, 4096, 512, 30000, embedding_size=128),
        _p("albert-xxlarge", "albert", 4096, 12, 64, 16384, 512, 30000, embedding_size=128),
        # EleutherAI/gpt-neo-* (global and local layers alternate, window 256). The tiny preset's
        # window (32) is shorter than its sequence, so its local layers really are local.
        _p("gpt-neo-tiny", "gpt_neo", 128, 2, 4, 512, 128, 1024, max_pos=2048,
           window_size=32, attention_pattern=["global", "local"]),
        _p("gpt-neo-125m", "gpt_neo", 768, 12, 12, 3072, 2048, 50257, **_NEO),
        _p("gpt-neo-1.3b", "gpt_neo", 2048, 24, 16, 8192, 2048, 50257, **_NEO),
        _p("gpt-neo-2.7b", "gpt_neo", 2560, 32, 20, 10240, 2048, 50257, **_NEO),
        # WideResNet-50 at width 2 (torchvision's wide_resnet50_2), 4 and 8 (Slapo's paper scales the width) and 1
        # (ResNet-50 v1.5, torchvision's resnet50), read as ``autoslapo.models.wrn_shape`` says. The tiny one: 4
        # blocks, 64x64 images (the last stage 2x2, so BatchNorm trains on one image a micro-batch), 10 classes.
        _p("wideresnet-tiny", "wideresnet", 32, 4, 1, 16, 64, 10),
        _p("resnet-50", "wideresnet", 256, 16, 1, 64, 224, 1000),
        _p("wideresnet-50-2", "wideresnet", 256, 16, 1, 128, 224, 1000),
        _p("wideresnet-50-4", "wideresnet", 256, 16, 1, 256, 224, 1000),
        _p("wideresnet-50-8", "wideresnet", 256, 16, 1, 512, 224, 1000),
    ]
}

ALIASES: dict[str, str] = {
    "bert": "bert-large",
    "roberta": "roberta-large",
    "gpt2-small": "gpt2",
    "opt": "opt-1.3b",
    "llama": "llama-7b",
    "t5": "t5-large",
    "albert": "albert-xxlarge",
    "gpt-neo": "gpt-neo-1.3b",
    "wideresnet": "wideresnet-50-2",
    "wide-resnet50-2": "wideresnet-50-2", "resnet50": "resnet-50",  # torchvision's names (from_name reads _ as -)
}


def list_presets() -> list[str]:
    """Every preset name, aliases excluded, in a stable order."""
    return list(PRESETS)
