"""Cost terms of an encoder-decoder (T5): FLOPs, parameters and activations of its two stacks. Pure.

The decoder-only accounting of ``flops`` and ``memory`` counts ``layers`` equal layers over
``seq_len`` tokens. T5 differs: ``layers`` encoder blocks over the ``seq_len`` source tokens
(self-attention + MLP), ``decoder_layers`` decoder blocks over the ``decoder_seq_len`` target
tokens (causal self-attention, cross-attention whose keys and values are projections of the
encoder output, MLP), and the LM head over target tokens only. Attention is ``heads x d_kv`` wide,
which need not be ``hidden`` (T5-3B: 32 x 128 on 1024). Blocks are numbered encoder first, as
``autoslapo.plan.checkpointed_layers`` numbers them. Pipeline stages split that one list into
pp x virtual_stages chunks, as even as they can be (``autoslapo.layout.chunk_sizes``; chunk ``c`` on
pipeline rank ``c % pp``), so a stage may hold encoder blocks, decoder blocks or both:
:func:`stage_blocks` says which, and the parameters and activations here are those of the first
and the last pipeline rank (embeddings on the first; the head, the decoder's norm and the logits
on the last), or of a middle rank that an uneven split gives more. Between stages pass both streams, the
encoder's (source tokens) and the decoder's (target tokens).

Written as the Megatron-style per-matrix count of ``autoslapo.cost.flops`` (2 FLOPs a multiply-add,
backward twice forward, attention products counted in full) and Korthikanti et al.'s per-token
activation terms of ``autoslapo.cost.memory``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoslapo import layout
from autoslapo.cost.device import AUTOSLAPO_CPU, is_autoslapo_runtime
from autoslapo.cost.head import element_bytes, loss_tensor_bytes
from autoslapo.cost.kernels import rms_norm_saved_extra

if TYPE_CHECKING:
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec

__all__ = [
    "block_activation_bytes",
    "busiest_rank",
    "checkpointed_blocks",
    "decoder_block_flops",
    "encdec_activation_bytes",
    "encdec_flops_per_sample",
    "encdec_hw_flops_per_sample",
    "encdec_stage_params",
    "encoder_block_flops",
    "stage_blocks",
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
    recomputed = sum(_block_flops(model, i) for i in checkpointed_blocks(model, config))
    return encdec_flops_per_sample(model) + recomputed


def stage_blocks(model: ModelSpec, config: ScheduleConfig, rank: int) -> list[int]:
    """The blocks (encoder first, then decoder) pipeline rank ``rank`` holds: its chunks of the
    ``pp x virtual_stages`` chunks (``layout.chunk_sizes``: as even as they can be), chunk ``c`` on
    rank ``c % pp`` (all blocks when pp = 1)."""
    return layout.rank_layers(model.blocks, config.pp, config.virtual_stages)[rank]


def busiest_rank(model: ModelSpec, config: ScheduleConfig) -> int:
    """The pipeline rank holding the most blocks (the first of them; 0 for an even split)."""
    ranks = layout.rank_layers(model.blocks, config.pp, config.virtual_stages)
    return max(range(config.pp), key=lambda r: len(ranks[r]))


def encdec_stage_params(model: ModelSpec, config: ScheduleConfig) -> tuple[float, float]:
    """Parameters on one device of (the first, the last) pipeline rank, as ``memory.stage_params``
    returns them: its blocks, the shared table (vocab-parallel) on the first, the head on the last
    (its own copy of a tied one when pp > 1), the relative-position tables and norms on both (small).
    """
    if config.pp == 1:
        n = model.num_params() / config.tp
        return n, n
    enc, dec = model.t5_block_params()
    word = model.vocab * model.hidden
    rest = model.num_params() - model.layers * enc - model.decoder_layers * dec - word
    rest -= 0 if model.tied_head else word

    def body(rank: int) -> float:
        return float(sum(enc if i < model.layers else dec for i in stage_blocks(model, config, rank)))

    # a middle rank that an uneven split gives more blocks may hold more than the first
    first = max([body(0) + word + rest, *(body(r) for r in range(1, config.pp - 1))])
    return first / config.tp, (body(config.pp - 1) + word + rest) / config.tp


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
    e, t = element_bytes(config), config.tp
    h, f, inner, heads = model.hidden, model.ffn, _inner(model), model.heads
    ours = is_autoslapo_runtime(runtime)
    s, u = model.seq_len, model.decoder_seq_len
    tokens = config.micro_batch * (u if decoder else s)
    norms = 3 if decoder else 2
    eager_rms = rms_norm_saved_extra(model.family, e, config.norm_kernel, config.compile_layers, ours)
    replicated = norms * h * ((4 + e) if ours else 2 * e) + (norms * h if dropout else 0) + norms * h * eager_rms
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


def block_linears(model: ModelSpec, decoder: bool) -> list[tuple[int, int, bool, bool]]:
    """A T5 block's weight products in forward order: ``(out, in, row_parallel, over_source)``.

    Self-attention q, k, v (``heads x d_kv`` wide), o; a decoder block's cross-attention then q (target
    tokens), k and v (source tokens: the encoder output), o; the MLP wi (gated: wi_0, wi_1), wo.
    ``over_source``: the product runs over the source tokens (every encoder product, and the
    cross-attention's k and v), else over the target tokens."""
    h, f, inner = model.hidden, model.ffn, _inner(model)
    src = not decoder
    attn = [(inner, h, False, src), (inner, h, False, src), (inner, h, False, src), (h, inner, True, src)]
    if decoder:
        attn += [(inner, h, False, False), (inner, h, False, True), (inner, h, False, True), (h, inner, True, False)]
    mlp = [(f, h, False, src)] * (2 if model.gated_mlp else 1) + [(h, f, True, src)]
    return attn + mlp


def op_kept_block_bytes(model: ModelSpec, config: ScheduleConfig, decoder: bool, runtime: str = "megatron") -> float:
    """Bytes a T5 block checkpointed per op keeps for one micro-batch on one device: its input, every
    other product's output (``block_linears``' 1st, 3rd, ...) and, with a fused attention kernel, each
    attention's output and log-sum-exp (``memory.op_kept_bytes_per_token`` for one stack). On a GPU
    sdpa runs T5's self-attention, whose position bias is a float mask, in its memory-efficient
    kernel; torch's CPU sdpa (autoslapo's runtime on a CPU) only the cross-attention, which has no bias,
    and the self-attention in its math path (products and softmax, recomputed)."""
    e, t, b = element_bytes(config), config.tp, config.micro_batch
    s, u, h = model.seq_len, model.decoder_seq_len, model.hidden
    mine = b * (u if decoder else s)
    kept: float = mine * h * e
    for out, _, row, over_source in block_linears(model, decoder)[::2]:
        kept += (b * s if over_source else mine) * out * e / (1 if row else t)
    if config.attn_kernel != "eager":
        # self-attention (not on a CPU, see above), cross-attention
        fused = (0 if runtime == AUTOSLAPO_CPU else 1) + (1 if decoder else 0)
        kept += fused * mine * (_inner(model) * e + model.heads * 4) / t
    return kept


def encdec_activation_bytes(model: ModelSpec, config: ScheduleConfig, dropout: bool | None = None,
                            runtime: str = "megatron", transients: bool = False, in_flight: float = 1.0,
                            heap: bool = False) -> int:
    """Peak activation bytes on the most loaded device (``memory.estimate_activation_bytes``).

    Blocks are kept whole, or only their input (full recomputation) or all but their attention
    cores (selective); backward walks the blocks in reverse, holding at block ``j`` the blocks before
    it, ``j`` whole and (``transients``) its gradients. Besides: the embeddings of source and target
    tokens, the encoder output every cross-attention reads, and the logits of the target tokens.
    With pp > 1: the first rank's blocks for ``in_flight`` micro-batches (the schedule's, from
    ``memory.in_flight_microbatches``) with the embeddings, or the last rank's for one with the
    logits, whichever is more; a stage after the first also keeps the pair of streams it received.
    """
    if config.pp > 1:
        first = _stage_activation_bytes(model, config, 0, in_flight, dropout, runtime, transients, heap)
        last = _stage_activation_bytes(model, config, config.pp - 1, 1.0, dropout, runtime, transients, heap)
        middle: list[int] = []
        if model.blocks % (config.pp * config.virtual_stages):
            # an uneven split may give a middle rank, with fewer micro-batches in flight, more blocks
            from autoslapo.cost.memory import in_flight_microbatches  # memory imports this module

            middle = [_stage_activation_bytes(model, config, r, in_flight_microbatches(config, r), dropout, runtime,
                                              transients, heap) for r in range(1, config.pp - 1)]
        return max(first, last, *middle)
    return _stage_activation_bytes(model, config, 0, 1.0, dropout, runtime, transients, heap)


def _stage_activation_bytes(model: ModelSpec, config: ScheduleConfig, rank: int, in_flight: float,
                            dropout: bool | None, runtime: str, transients: bool, heap: bool = False) -> int:
    drop = True if dropout is None else dropout
    e, b = element_bytes(config), config.micro_batch
    s, u, h = model.seq_len, model.decoder_seq_len, model.hidden
    ckpt = checkpointed_blocks(model, config)
    blocks = stage_blocks(model, config, rank)
    first, last = rank == 0, rank == config.pp - 1
    stored: list[float] = []
    fulls: list[float] = []
    for i in blocks:
        decoder = i >= model.layers
        full = block_activation_bytes(model, config, decoder, drop, runtime)
        if i in ckpt and config.ckpt_granularity == "selective":
            attn_free = config if config.attn_kernel != "eager" else config.with_(attn_kernel="sdpa")
            kept = block_activation_bytes(model, attn_free, decoder, drop, runtime)
        elif i in ckpt and config.ckpt_granularity == "op":
            kept = op_kept_block_bytes(model, config, decoder, runtime)
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
    # other in-flight micro-batches keep all they stored; the one in backward peaks as above
    fwd_end, bwd_peak = in_flight * total, (in_flight - 1) * total + peak
    # the first stage embeds source and target; a later one keeps the pair it received
    emb = b * (s + u) * h * (e + (1 if drop else 0)) if first else in_flight * b * (s + u) * h * e
    # the encoder output every cross-attention reads (held where decoder blocks run)
    encoder_out = b * s * h * e * (in_flight if any(i >= model.layers for i in blocks) else 0)
    logits = loss_tensor_bytes(model, config, b * u, transients, heap, runtime) if last else 0
    # each stack's final norm: an eager RMSNorm's chain beyond a fused one's input (``rms_norm_saved_extra``)
    eager_rms = rms_norm_saved_extra(model.family, e, config.norm_kernel, config.compile_layers,
                                     is_autoslapo_runtime(runtime))
    logits += eager_rms * b * h * (s * in_flight * (model.layers - 1 in blocks) + u * last)
    return int(max(fwd_end + logits, bwd_peak) + emb + encoder_out)


def checkpointed_blocks(model: ModelSpec, config: ScheduleConfig) -> set[int]:
    """The blocks checkpointed, as ``autoslapo.plan.checkpointed_layers`` places them: the ratio
    and placement within each pipeline chunk."""
    chunks = layout.chunk_bounds(model.blocks, config.pp * config.virtual_stages)
    return {a + i for a, b in chunks for i in config.checkpointed_layers(b - a)}
