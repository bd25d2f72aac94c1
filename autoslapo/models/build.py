"""Build a transformers model from a ``ModelSpec``: random weights, nothing downloaded.

Each family maps to its transformers ``*Config`` and LM class (masked LM for BERT/RoBERTa, causal
LM for GPT-2/OPT/LLaMA). Construction honours the ambient device, so
``with torch.device("meta"): build_model(ModelSpec.from_name("llama-70b"))`` allocates nothing;
that is how shape rehearsals of the big presets run on a laptop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autoslapo.errors import ConfigError
from autoslapo.models.hf import HF_CONFIG_KEY, hf_config_kwargs
from autoslapo.models.spec import ModelSpec, is_convolutional
from autoslapo.models.user import USER_FAMILY, load_user_model

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["ATTN_IMPLEMENTATIONS", "build_config", "build_model", "example_batch"]

# autoslapo's kernel names -> transformers' ``attn_implementation`` names.
ATTN_IMPLEMENTATIONS: dict[str, str] = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flash": "flash_attention_2",
}


def _token_ids(spec: ModelSpec) -> dict[str, Any]:
    # The published configs' special ids (GPT-2's 50256, LLaMA's 1/2) fall outside the tiny presets'
    # vocabularies; keep them inside so transformers does not warn and generation stays valid.
    last = spec.vocab - 1
    return {"bos_token_id": min(1, last), "eos_token_id": min(2, last), "pad_token_id": 0}


def _bert_like(spec: ModelSpec, dropout: float | None, roberta: bool) -> Any:
    from transformers import BertConfig, RobertaConfig

    kw: dict[str, Any] = {
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "intermediate_size": spec.ffn,
        # RoBERTa numbers positions from padding_idx + 1, so its table has two extra rows.
        "max_position_embeddings": spec.max_positions + (2 if roberta else 0),
    }
    if dropout is not None:
        kw["hidden_dropout_prob"] = dropout
        kw["attention_probs_dropout_prob"] = dropout
    if roberta:
        kw.update(pad_token_id=1, bos_token_id=0, eos_token_id=min(2, spec.vocab - 1), type_vocab_size=1)
        return RobertaConfig(**kw)
    return BertConfig(pad_token_id=0, **kw)


def _gpt2(spec: ModelSpec, dropout: float | None) -> Any:
    from transformers import GPT2Config

    kw: dict[str, Any] = {
        "vocab_size": spec.vocab,
        "n_positions": spec.max_positions,
        "n_embd": spec.hidden,
        "n_layer": spec.layers,
        "n_head": spec.heads,
        "n_inner": spec.ffn,
    }
    if dropout is not None:
        kw.update(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    ids = _token_ids(spec)
    return GPT2Config(bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"], **kw)


def _opt(spec: ModelSpec, dropout: float | None) -> Any:
    from transformers import OPTConfig

    kw: dict[str, Any] = {
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "word_embed_proj_dim": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "ffn_dim": spec.ffn,
        "max_position_embeddings": spec.max_positions,
    }
    if dropout is not None:
        kw.update(dropout=dropout, attention_dropout=dropout)
    ids = _token_ids(spec)
    return OPTConfig(pad_token_id=1, bos_token_id=ids["eos_token_id"], eos_token_id=ids["eos_token_id"], **kw)


def _llama(spec: ModelSpec, dropout: float | None) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        attention_dropout=dropout or 0.0,
        tie_word_embeddings=False,
        **_token_ids(spec),
    )


def _t5(spec: ModelSpec, dropout: float | None) -> Any:
    from transformers import T5Config

    kw: dict[str, Any] = {}
    if dropout is not None:
        kw["dropout_rate"] = dropout
    # tie_word_embeddings and decoder_start_token_id are PretrainedConfig keywords T5Config passes on
    return T5Config(  # type: ignore[call-arg]
        vocab_size=spec.vocab,
        d_model=spec.hidden,
        d_kv=spec.head_dim,
        d_ff=spec.ffn,
        num_layers=spec.layers,
        num_decoder_layers=spec.decoder_layers,
        num_heads=spec.heads,
        relative_attention_num_buckets=spec.t5("buckets"),
        feed_forward_proj="gated-gelu" if spec.t5("gated") else "relu",
        # transformers 5 always ties T5's head and reads ``tie_word_embeddings=False`` as "do not scale
        # the decoder output by d_model**-0.5" (T5 v1.1); ``build_model`` then unties the head itself.
        tie_word_embeddings=spec.t5("tied"),
        pad_token_id=0,
        eos_token_id=min(1, spec.vocab - 1),
        decoder_start_token_id=0,
        **kw,
    )


def _albert(spec: ModelSpec, dropout: float | None) -> Any:
    from transformers import AlbertConfig

    kw: dict[str, Any] = {}
    if dropout is not None:
        kw.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    last = spec.vocab - 1
    # One group of one layer, run num_hidden_layers times: the published ALBERT sharing.
    return AlbertConfig(
        vocab_size=spec.vocab,
        embedding_size=spec.embedding_size,
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_hidden_groups=1,
        inner_group_num=1,
        num_attention_heads=spec.heads,
        intermediate_size=spec.ffn,
        max_position_embeddings=spec.max_positions,
        pad_token_id=0,
        bos_token_id=min(2, last),
        eos_token_id=min(3, last),
        **kw,
    )


def _gpt_neo(spec: ModelSpec, dropout: float | None) -> Any:
    from transformers import GPTNeoConfig

    kw: dict[str, Any] = {}
    if dropout is not None:
        kw.update(embed_dropout=dropout, attention_dropout=dropout, resid_dropout=dropout)
    ids = _token_ids(spec)
    return GPTNeoConfig(
        vocab_size=spec.vocab,
        max_position_embeddings=spec.max_positions,
        hidden_size=spec.hidden,
        num_layers=spec.layers,
        num_heads=spec.heads,
        intermediate_size=spec.ffn,
        window_size=int(spec.extra["window_size"]),
        # one run of length 1 per layer: any pattern, any depth
        attention_types=[[[t], 1] for t in spec.layer_attention_types()],
        bos_token_id=ids["bos_token_id"],
        eos_token_id=ids["eos_token_id"],
        **kw,
    )


_CONFIGS: dict[str, Callable[[ModelSpec, float | None], Any]] = {
    "bert": lambda s, d: _bert_like(s, d, roberta=False),
    "roberta": lambda s, d: _bert_like(s, d, roberta=True),
    "gpt2": _gpt2,
    "opt": _opt,
    "llama": _llama,
    "t5": _t5,
    "albert": _albert,
    "gpt_neo": _gpt_neo,
}

# family -> name of the transformers LM class (imported lazily).
_MODEL_CLASSES: dict[str, str] = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "gpt2": "GPT2LMHeadModel",
    "opt": "OPTForCausalLM",
    "llama": "LlamaForCausalLM",
    "t5": "T5ForConditionalGeneration",
    "albert": "AlbertForMaskedLM",
    "gpt_neo": "GPTNeoForCausalLM",
}


def build_config(spec: ModelSpec, *, attn_kernel: str = "sdpa", dropout: float | None = None) -> Any:
    """The transformers ``PretrainedConfig`` for ``spec``.

    Takes: the spec, the attention kernel (``eager``/``sdpa``/``flash``), and a dropout probability
    for every dropout of the family (``None`` keeps the family's default).
    Returns: the config. Raises: ConfigError for an unknown kernel or family.
    """
    if attn_kernel not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(
            f"attn_kernel must be one of {', '.join(ATTN_IMPLEMENTATIONS)}: got {attn_kernel!r}"
        )
    if HF_CONFIG_KEY in spec.extra:
        # a config.json's model: transformers' own config of its model_type, with the spec's shape
        from transformers import AutoConfig

        entry, kw = hf_config_kwargs(spec, dropout)
        config = AutoConfig.for_model(entry.model_type, **kw)
    elif spec.family not in _CONFIGS:
        raise ConfigError(f"no transformers config for family {spec.family!r}; valid: {', '.join(_CONFIGS)}")
    else:
        config = _CONFIGS[spec.family](spec, dropout)
    if spec.family == "gpt_neo" and attn_kernel == "flash":
        raise ConfigError(f"attn_kernel flash cannot apply {spec.preset}'s local attention windows; use sdpa or eager")
    # Training never reads a KV cache, and a cache written during the forward would be written
    # again when activation checkpointing replays a layer (doubling its length).
    config.use_cache = False
    # GPT-Neo's HF classes are eager only; build_model sets its sdpa kernel on the built modules.
    config._attn_implementation = "eager" if spec.family == "gpt_neo" else ATTN_IMPLEMENTATIONS[attn_kernel]
    return config


def build_model(
    spec: ModelSpec,
    *,
    attn_kernel: str = "sdpa",
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    dropout: float | None = None,
) -> nn.Module:
    """A randomly initialised transformers LM with ``spec``'s shape.

    Takes: the spec; the attention kernel; the seed (same seed -> same weights on every rank);
    the device to build on (``None``: the ambient default, so ``with torch.device("meta")`` works);
    the parameter dtype (``None``: float32); dropout (``None``: the family's default; 0 turns it off).
    Returns: ``BertForMaskedLM`` / ``RobertaForMaskedLM`` / ``GPT2LMHeadModel`` / ``OPTForCausalLM`` /
    ``LlamaForCausalLM`` / ``T5ForConditionalGeneration`` / ``AlbertForMaskedLM`` / ``GPTNeoForCausalLM``,
    in train mode; for a spec read from a config.json (``autoslapo.models.hf``), transformers' own class
    of its ``model_type`` (``MistralForCausalLM`` ...); the user's module from its file's ``build()``.
    Raises: ConfigError for an unknown kernel or family.
    """
    import torch

    make: Callable[[], nn.Module]
    if spec.family == "wideresnet":
        # written in the project (torchvision does not load here); no attention kernel, no dropout
        from autoslapo.models.wideresnet import WideResNet

        def make() -> nn.Module:
            return WideResNet(spec)
    elif spec.family == USER_FAMILY:
        # the user's own module, unchanged: its build() (kernel and dropout are its own business)
        make = load_user_model(spec).build
    else:
        import transformers

        config = build_config(spec, attn_kernel=attn_kernel, dropout=dropout)
        if HF_CONFIG_KEY in spec.extra:
            cls = getattr(transformers, hf_config_kwargs(spec)[0].lm_class)
        else:
            cls = getattr(transformers, _MODEL_CLASSES[spec.family])

        def make() -> nn.Module:
            model = cls(config)
            if getattr(model, "loss_type", "") is None and cls.__name__.endswith("LMHeadModel"):
                # GPT2LMHeadModel's name matches no loss of transformers': it warned at every forward
                # ("loss_type=None ... unrecognized") before taking the causal-LM loss; named, it is silent
                model.loss_type = "ForCausalLM"
            return model  # type: ignore[no-any-return]
    # Fork the RNG so that building a model does not move the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if device is not None:
            with torch.device(device):
                model = make()
        else:
            model = make()
        if spec.encoder_decoder and not spec.t5("tied"):
            _untie_head(model)
        if spec.encoder_decoder:
            _keep_t5_init(model, spec)
    if dtype is not None:
        model.to(dtype=dtype)
    if spec.family == "gpt_neo":
        from autoslapo.primitives.local_attention import apply_local_attention_kernel

        apply_local_attention_kernel(model, attn_kernel)
    model.train()
    return model


def example_batch(
    spec: ModelSpec,
    batch: int,
    seq_len: int | None = None,
    seed: int = 0,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """A random batch the model built from ``spec`` takes as ``model(**batch)``.

    Takes: the spec, the batch size, the sequence length (``None``: ``spec.seq_len``), a seed.
    A user's module (family ``user``): its own ``batch(batch, seed)``.
    Returns: ``{"input_ids", "labels"}`` (int64, shape ``(batch, seq_len)``). Token ids avoid the
    special ids 0-2 so no position is treated as padding (RoBERTa and OPT derive positions from it).
    A convolutional family's batch is ``{"images", "labels"}`` instead: float32 images
    ``(batch, 3, seq_len, seq_len)`` (``seq_len`` is the image side) and int64 classes ``(batch,)``.
    For causal families the labels equal the inputs (the model shifts them); for masked LM families
    labels are -100 except on about 15% of positions. An encoder-decoder (T5) batch has the source
    ``input_ids`` (``seq_len``), target ``labels`` (``spec.decoder_seq_len``, every position) and
    ``decoder_input_ids``: the labels shifted right behind the start id 0, given explicitly so a call
    whose labels a vocab-parallel loss takes away still decodes. Raises: ConfigError for bad sizes.
    """
    import torch

    if spec.family == USER_FAMILY:
        # the user's batch(micro_batch, seed): its own inputs and labels (seq_len is the file's)
        if batch < 1:
            raise ConfigError(f"example batch needs batch >= 1: got batch={batch} for {spec.preset}")
        rows = load_user_model(spec).batch(batch, seed)
        return {k: v.to(device) for k, v in rows.items()} if device is not None else rows
    seq = spec.seq_len if seq_len is None else seq_len
    if is_convolutional(spec.family):
        return _image_batch(spec, batch, seq, seed, device)
    if batch < 1 or seq < 1 or seq > spec.max_positions:
        raise ConfigError(
            f"example batch needs batch >= 1 and 1 <= seq_len <= {spec.max_positions}: got batch={batch}, "
            f"seq_len={seq} for {spec.preset}"
        )
    if spec.vocab <= 3:
        raise ConfigError(f"example batch needs vocab > 3 to avoid special ids: got vocab={spec.vocab}")
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, spec.vocab, (batch, seq), generator=gen)
    if spec.encoder_decoder:
        return _seq2seq_batch(spec, input_ids, gen, device)
    if spec.causal:
        labels = input_ids.clone()
    else:
        mask = torch.rand((batch, seq), generator=gen) < 0.15
        mask[:, 0] = True  # at least one labelled position per row, so the loss is never empty
        labels = torch.where(mask, input_ids, torch.full_like(input_ids, -100))
    out = {"input_ids": input_ids, "labels": labels}
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    return out


def _keep_t5_init(model: nn.Module, spec: ModelSpec) -> None:
    import torch

    # T5's ``_init_weights`` scales q/k/v/o and wi/wo only when called on their parent (T5Attention,
    # T5DenseActDense); ``autoslapo.build.materialize`` calls it on the module holding each parameter,
    # whose generic branch draws them with std 1: activations then grow large enough that the
    # softmaxes saturate and a TP layout's different order of sums shows in the losses. Each
    # projection carries its T5 std, and the model's ``_init_weights`` reads it.
    h, d, f = spec.hidden, spec.head_dim, spec.ffn
    stds = {"q": (h * d) ** -0.5, "k": h**-0.5, "v": h**-0.5, "o": (spec.heads * d) ** -0.5,
            "wi": h**-0.5, "wi_0": h**-0.5, "wi_1": h**-0.5, "wo": f**-0.5, "relative_attention_bias": h**-0.5}
    for name, mod in model.named_modules():
        std = stds.get(name.rsplit(".", 1)[-1])
        if std is not None:
            mod._autoslapo_init_std = std  # type: ignore[assignment]
    hf_init: Any = model._init_weights

    def init(module: nn.Module) -> None:
        std = getattr(module, "_autoslapo_init_std", None)
        if std is None:
            hf_init(module)
            return
        with torch.no_grad():
            weight: Any = module.weight
            weight.normal_(0.0, float(std))

    model._init_weights = init  # type: ignore[assignment]


def _untie_head(model: nn.Module) -> None:
    import torch
    from torch import nn

    # T5 v1.1's own head: a separate [vocab, hidden] weight, initialised as T5 initialises it (std 1).
    head: Any = model.lm_head
    weight = torch.empty_like(head.weight)
    with torch.no_grad():
        weight.normal_(0.0, 1.0)
    head.weight = nn.Parameter(weight)
    config: Any = model.config
    config.tie_word_embeddings = False


def _seq2seq_batch(spec: ModelSpec, input_ids: torch.Tensor, gen: torch.Generator,
                   device: torch.device | str | None) -> dict[str, torch.Tensor]:
    import torch

    labels = torch.randint(3, spec.vocab, (input_ids.shape[0], spec.decoder_seq_len), generator=gen)
    decoder_input_ids = torch.zeros_like(labels)  # T5's _shift_right with decoder_start_token_id 0
    decoder_input_ids[:, 1:] = labels[:, :-1]
    out = {"input_ids": input_ids, "decoder_input_ids": decoder_input_ids, "labels": labels}
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    return out


def _image_batch(spec: ModelSpec, batch: int, side: int, seed: int,
                 device: torch.device | str | None) -> dict[str, torch.Tensor]:
    import torch

    if batch < 1 or side < 1:
        raise ConfigError(
            f"example batch needs batch >= 1 and an image side >= 1: got batch={batch}, side={side} for {spec.preset}"
        )
    gen = torch.Generator().manual_seed(seed)
    out = {"images": torch.randn((batch, 3, side, side), generator=gen),
           "labels": torch.randint(0, spec.vocab, (batch,), generator=gen)}
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    return out
