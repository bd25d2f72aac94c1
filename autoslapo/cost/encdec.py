"""Cost terms of an encoder-decoder (T5): FLOPs, parameters and activations of its two stacks. Pure.

The decoder-only accounting of ``flops`` and ``memory`` counts ``layers`` equal layers over
``seq_len`` tokens. T5 differs: ``layers`` encoder blocks over the ``seq_len`` source tokens
(self-attention + MLP), ``decoder_layers`` decoder blocks over the ``decoder_seq_len`` target
tokens (causal self-attention, cross-attention whose keys and values are projections of the
encoder output, MLP), and the LM head over target tokens only. Attention is ``heads x d_kv`` wide,
which need not be ``hidden`` (T5-3B: 32 x 128 on 1024). Blocks are numbered encoder first, as
``autoslapo.plan.checkpointed_layers`` numbers them. T5 has no pipeline stages here (pp = 1; see
``autoslapo.layout``), so every block lives on every device.

Written as the Megatron-style per-matrix count of ``autoslapo.cost.flops`` (2 FLOPs a multiply-add,
backward twice forward, attention products counted in full) and Korthikanti et al.'s per-token
activation terms of ``autoslapo.cost.memory``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoslapo.config import LOSS_CHUNK_TOKENS

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec

__all__ = [
    "block_activation_bytes",
    "decoder_block_flops",
    "encdec_activation_bytes",
    "encdec_flops_per_sample",
    "encdec_hw_flops_per_sample",
    "encdec_stage_params",
    "encoder_block_flops",
]


def _inner(model: ModelSpec) -> int:
    return model.heads * model.head_dim


def _mlp_flops_per_token(model: ModelSpec) -> float:
    return 2.0 * model.hidden * model.ffn * (3 if model.gated_mlp else 2)


def encoder_block_flops(model: ModelSpec) -> float:
    """Forward FLOPs of one encoder block for one sample: q/k/v/o, ``QK^T`` and ``PV``, MLP."""
    s, h, inner = model.seq_len, model.hidden, _inner(model)
    return s * (8.0 * h * inner + 4.0 * s * inner + _mlp_flops_per_token(model))


def decoder_block_flops(model: ModelSpec) -> float:
    """Forward FLOPs of one decoder block for one sample: causal self-attention over the target,
    cross-attention (q and o over target tokens, k and v over source tokens), MLP."""
    s, u, h, inner = model.seq_len, model.decoder_seq_len, model.hidden, _inner(model)
    per_target = 8.0 * h * inner + 4.0 * u * inner + 4.0 * h * inner + 4.0 * s * inner
    return u * (per_target + _mlp_flops_per_token(model)) + s * 4.0 * h * inner


def _block_flops(model: ModelSpec, i: int) -> float:
    return encoder_block_flops(model) if i < model.layers else decoder_block_flops(model)


def encdec_flops_per_sample(model: ModelSpec) -> float:
    """Model FLOPs (forward + backward, no recomputation) of one source/target pair."""
    head = 2.0 * model.hidden * model.vocab * model.decoder_seq_len
    fwd = model.layers * encoder_block_flops(model) + model.decoder_layers * decoder_block_flops(model) + head
    return 3.0 * fwd


def encdec_hw_flops_per_sample(model: ModelSpec, config: ScheduleConfig) -> float:
    """FLOPs executed per sample: model FLOPs plus the forward of every checkpointed block again."""
    recomputed = sum(_block_flops(model, i) for i in config.checkpointed_layers(model.blocks))
    return encdec_flops_per_sample(model) + recomputed


def encdec_stage_params(model: ModelSpec, config: ScheduleConfig) -> tuple[float, float]:
    """Parameters on one device (both stacks, the shared table and the relative-position tables
    vocab- or head-parallel, an untied head vocab-parallel), as ``memory.stage_params`` returns them."""
    n = model.num_params() / config.tp
    return n, n


def _element_bytes(config: ScheduleConfig) -> int:
    return 4 if config.precision == "fp32" else 2


def block_activation_bytes(model: ModelSpec, config: ScheduleConfig, decoder: bool, dropout: bool = True,
                           runtime: str = "megatron") -> float:
    """Bytes one non-checkpointed block of a micro-batch keeps for backward, on one device.

    Per token of its stack: the norms' inputs (fp32 and 16-bit under autoslapo's autocast), the
    residual dropouts' masks, q/k/v and the attention output (``heads x d_kv`` wide), the MLP's inner
    tensors (ReLU: its output; with dropout also the mask and dropout's output; gated-GeLU: seven),
    the attention probabilities (eager) or a log-sum-exp per row (SDPA). A decoder block adds the
    cross-attention: q and its output per target token, k and v per source token, scores over the
    source.
    """
    e, t = _element_bytes(config), config.tp
    h, f, inner, heads = model.hidden, model.ffn, _inner(model), model.heads
    ours = runtime == "autoslapo"
    s, u = model.seq_len, model.decoder_seq_len
    tokens = config.micro_batch * (u if decoder else s)
    norms = 3 if decoder else 2
    replicated = norms * h * ((4 + e) if ours else 2 * e) + (norms * h if dropout else 0)
    # gated-GeLU: wi_0's output, three intermediates of transformers' tanh-GeLU chain (as GPT-2's),
    # the GeLU's and wi_1's outputs (the product's inputs) and the product (wo's input): 7
    mlp = 7 * f * e if model.gated_mlp else (2 * f * e + f if dropout else f * e)

    def core(keys: int) -> float:
        if config.attn_kernel == "eager":
            probs = e + 4 if ours and e < 4 else e
            return heads * keys * ((probs + e + 1) if dropout else probs)
        return heads * 4 + (inner * e if ours else 0)

    sharded = 4 * inner * e + mlp + core(u if decoder else s)
    if decoder:
        sharded += 2 * inner * e + core(s)
    per_block = tokens * (replicated + sharded / t)
    if decoder:
        per_block += config.micro_batch * s * 2 * inner * e / t  # cross-attention k and v
    return per_block


def encdec_activation_bytes(model: ModelSpec, config: ScheduleConfig, dropout: bool | None = None,
                            runtime: str = "megatron", transients: bool = False) -> int:
    """Peak activation bytes of one micro-batch on one device (``memory.estimate_activation_bytes``).

    Blocks are kept whole, or only their input (full recomputation) or all but their attention
    cores (selective); backward walks the blocks in reverse, holding at block ``j`` the blocks before
    it, ``j`` whole and (``transients``) its gradients. Besides: the embeddings of source and target
    tokens, the encoder output every cross-attention reads, and the logits of the target tokens.
    """
    drop = True if dropout is None else dropout
    e, b = _element_bytes(config), config.micro_batch
    s, u, h = model.seq_len, model.decoder_seq_len, model.hidden
    ckpt = set(config.checkpointed_layers(model.blocks))
    stored: list[float] = []
    fulls: list[float] = []
    for i in range(model.blocks):
        decoder = i >= model.layers
        full = block_activation_bytes(model, config, decoder, drop, runtime)
        if i in ckpt and config.ckpt_granularity == "selective":
            attn_free = config if config.attn_kernel != "eager" else config.with_(attn_kernel="sdpa")
            kept = block_activation_bytes(model, attn_free, decoder, drop, runtime)
        elif i in ckpt:
            kept = b * (u if decoder else s) * h * e
        else:
            kept = full
        stored.append(kept)
        fulls.append(full)
    total = sum(stored)
    peak, prefix = total, 0.0
    for kept, full in zip(stored, fulls, strict=True):
        peak = max(peak, prefix + full * (2 if transients else 1))
        prefix += kept
    emb = b * (s + u) * h * (e + (1 if drop else 0))
    encoder_out = b * s * h * e
    rows = min(b * u, LOSS_CHUNK_TOKENS) if config.loss_kernel == "chunked" else b * u
    logits = rows * model.vocab / config.tp * (e + 4)
    if config.loss_kernel == "chunked":
        logits += b * u * 4
    if transients:
        logits += rows * 4 * model.vocab / config.tp
    return int(max(total + logits, peak) + emb + encoder_out)
