"""Step time of a schedule: compute, collectives, pipeline bubble, recomputation. Pure.

Compute is counted per kernel. A GEMM takes the longer of its FLOPs over the achievable rate and
its bytes over memory bandwidth (the roofline), where the achievable rate shrinks with wave
quantization (a GEMM whose ``ceil(m/tile) ceil(n/tile)`` tiles leave SMs idle in its last wave)
and with a short inner dimension (``k / (k + k_half)``: the attention products over a 64- or
128-wide head dimension) and with the GEMM's size (a fixed ramp-and-drain time a launch). A fused
(flash / memory-efficient) attention kernel moves only Q, K, V and O through HBM and pays its
online softmax on the FP32 units (``autoslapo.cost.kernels``). Elementwise kernels (norms, softmax,
dropout, residuals, activations) are memory-bound: bytes over achievable HBM bandwidth. Backward
costs two GEMMs per forward GEMM and about twice the elementwise traffic.

Collectives use the ring cost (Patarasuk and Yuan, 2009; Thakur et al., 2005): an allreduce of
``n`` bytes over ``p`` ranks moves ``2 (p-1)/p n`` per rank, a reduce-scatter or all-gather
``(p-1)/p n``, with ``2 (p-1)`` (or ``p-1``) latency hops; an allreduce across nodes takes NCCL's
tree where its cost model finds that faster (``autoslapo.cost.comm``). Megatron's TP layer does two
allreduces of the layer's activations in forward and two in backward (Shoeybi et al., 2019);
sequence parallelism swaps each for a reduce-scatter + all-gather of the same volume (Korthikanti
et al., 2022). The 1F1B and GPipe pipelines idle ``(p-1)`` micro-batch slots, the interleaved one
``(p-1)/v`` (Narayanan et al., 2021, section 2.2). ZeRO-3 gathers weights before every forward
and backward and reduce-scatters gradients every micro-batch (1.5x the allreduce volume), with
imperfect prefetch and per-module hooks (see ``ZERO3_*``). The runtime's own fixed costs a step and
a micro-batch (``DevicePerf.step_overhead_s``, measured on a CPU) are a term of their own, and on
a GPU a micro-batch takes at least the host's time to issue its kernels (``DevicePerf.host_op_s``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from autoslapo.cost import epilogue
from autoslapo.cost.comm import collective_s, gradient_sync_s, group_bandwidth, group_nodes
from autoslapo.cost.device import is_autoslapo_runtime
from autoslapo.cost.encdec import block_linears, busiest_rank, checkpointed_blocks, stage_blocks
from autoslapo.cost.head import element_bytes
from autoslapo.cost.kernels import (
    flash_softmax_s,
    flash_traffic_bytes,
    gemm_size_efficiency,
    host_floor_s,
    interp_rate,
    layer_norms_and_rotary,
)
from autoslapo.cost.memory import (
    REDUCE_BUCKET_ELEMENTS,
    TANH_GELU_FAMILIES,
    checkpointed_layer_ids,
    has_dropout,
    op_kept_linears,
    stage_params,
    state_bytes_per_param,
)
from autoslapo.cost.p2p import pipeline_p2p_s
from autoslapo.layout import chunk_sizes, rank_layers

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost.device import DevicePerf
    from autoslapo.models.spec import ModelSpec


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds of one optimizer step on the slowest pipeline stage, by cause."""

    compute: float
    recompute: float
    tp_comm: float
    pp_comm: float
    bubble: float
    dp_comm: float
    optimizer: float
    overhead: float = 0.0

    @property
    def total(self) -> float:
        return (self.compute + self.recompute + self.tp_comm + self.pp_comm + self.bubble
                + self.dp_comm + self.optimizer + self.overhead)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["total"] = self.total
        return d


class _Rates:
    """Kernel timing for one device and precision."""

    def __init__(self, perf: DevicePerf, cluster: ClusterSpec, config: ScheduleConfig) -> None:
        self.perf = perf
        peak = cluster.peak_tflops_fp32 if config.precision == "fp32" else cluster.peak_tflops
        self.flops_s = peak * 1e12 * perf.gemm_eff
        self.bw = perf.hbm_gbps * 1e9 * perf.bw_eff
        self.lat = perf.op_latency_s
        self.e = element_bytes(config)
        self.curve = perf.gemm_curve
        self.has_flash = cluster.device.flash_attention
        self.fp32_tflops, self.sfu_tops = cluster.peak_tflops_fp32, cluster.device.sfu_tops
        # a GPU's fused attention kernels keep the scores on chip (``autoslapo.cost.kernels``); a CPU's
        # sdpa is timed as its two products (its profile measures them)
        self.on_chip_attention = perf.name != "cpu" and not self.curve

    def _finish(self, t: float) -> float:
        return t + self.lat if self.perf.op_latency_additive else max(t, self.lat)

    def gemm(self, m: float, n: float, k: float, batch: float = 1.0, eff: float = 1.0) -> float:
        """Seconds of ``batch`` GEMMs of ``m x k`` by ``k x n``."""
        flops = 2.0 * m * n * k * batch
        p = self.perf
        if self.curve:
            rate = interp_rate(self.curve, flops) * 1e12 * eff
        else:
            tiles = math.ceil(m / p.tile) * math.ceil(n / p.tile) * batch
            waves = math.ceil(tiles / p.sms)
            rate = self.flops_s * eff * (tiles / (waves * p.sms)) * (k / (k + p.k_half))
            rate *= gemm_size_efficiency(flops, rate, p.gemm_fixed_s)
        traffic = self.e * (m * k + k * n + m * n) * batch
        return self._finish(max(flops / rate, traffic / self.bw))

    def flash(self, s: float, d: float, batch: float, frac: float, eff: float, backward: bool = False) -> float:
        """Seconds of a fused attention kernel over ``batch`` problems of ``s`` tokens and head width ``d``.

        ``frac`` of the ``s x s`` scores is computed (0.5 causal). The products run on tensor cores at
        ``eff`` of a GEMM's rate, one thread block per 128-query tile and head (wave quantization over
        the SMs). Each product has its own inner dimension (Dao 2023, algorithms 1-2): ``Q K^T`` and,
        in backward, ``dO V^T`` sum over the head width; ``P V``, ``P^T dO``, ``dS K``, ``dS^T Q`` over a
        tile of keys or queries. Backward does 2.5x the forward's FLOPs at ``FLASH_BWD_REL`` of its rate.
        HBM moves Q, K, V, O (and gradients), not the scores; the online softmax adds its exposed FP32
        time (``autoslapo.cost.kernels``).
        """
        p = self.perf
        scores = s * s * frac * batch
        flops = 4.0 * scores * d * (2.5 if backward else 1.0)
        tiles = math.ceil(s / p.tile) * batch
        waves = math.ceil(tiles / p.sms)
        n, over_d = (5, 2) if backward else (2, 1)  # products; those whose inner dimension is the head's
        per_flop = (over_d * (d + p.k_half) / d + (n - over_d) * (p.tile + p.k_half) / p.tile) / n
        rate = self.flops_s * eff * (tiles / (waves * p.sms)) / per_flop
        if backward:
            rate *= FLASH_BWD_REL
        traffic = flash_traffic_bytes(s, s, d, batch, self.e, backward)
        t = max(flops / rate, traffic / self.bw) + flash_softmax_s(scores, self.fp32_tflops, self.sfu_tops, backward)
        return self._finish(t)

    def mem(self, nbytes: float, kernels: int = 1) -> float:
        """Seconds of ``kernels`` memory-bound kernels moving ``nbytes`` in all."""
        if self.perf.mem_curve:
            t = nbytes / (interp_rate(self.perf.mem_curve, nbytes / max(kernels, 1)) * 1e9)
        else:
            t = nbytes / self.bw
        return t + kernels * self.lat if self.perf.op_latency_additive else max(t, kernels * self.lat)


def fused_attention_s(r: _Rates, s: float, d: float, problems: float, causal: bool, kernel: str) -> tuple[float, float]:
    """(forward, backward) seconds of ``problems`` fused attention kernels (``kernel`` flash or sdpa) over
    ``s`` tokens of head width ``d``: the products at ~70 % of a GEMM's rate in FlashAttention-2 (Dao
    2023), causal half the work, backward 2.5x the FLOPs (the scores recomputed); sdpa runs PyTorch's
    own flash kernel where the device has one (~60 %: its FlashAttention-2 port, a [b, heads, s, d]
    layout the model transposes into), else the memory-efficient kernel (~55 % of a GEMM's rate)."""
    eff = 0.7 if kernel == "flash" else (0.6 if r.perf.name != "cpu" and r.has_flash else 0.55)
    frac = 0.5 if causal else 1.0
    if r.on_chip_attention:
        return r.flash(s, d, problems, frac, eff), r.flash(s, d, problems, frac, eff, backward=True)
    fwd = r.gemm(s * frac, s, d, problems, eff=eff) + r.gemm(s * frac, d, s, problems, eff=eff)
    return fwd, 2.5 * fwd / FLASH_BWD_REL


# ZeRO-3's prefetch hides at most this fraction of a gather behind compute (DeepSpeed fetches a
# bucket of modules ahead along the recorded trace; the first modules of each pass and every
# trace miss wait), and each hidden second still costs compute this much (NCCL's kernels and
# copies take SMs and memory bandwidth from the overlapped GEMMs).
ZERO3_PREFETCH = 0.6
ZERO3_CONTENTION = 0.15
# A memory-efficient attention kernel's backward (2.5x its forward's FLOPs: the scores are recomputed)
# runs at a lower fraction of peak than its forward: FlashAttention-2 reaches up to 73 % of an A100's
# peak in forward and up to 63 % in backward (Dao 2023, section 4.1), 0.86 of the forward's rate.
FLASH_BWD_REL = 0.86
# One DeepSpeed ZeRO-3 module hook (Python: fetch bookkeeping, trace, event waits), per call.
ZERO3_HOOK_S = 30e-6


def bubble_slots(config: ScheduleConfig, layers: int, busiest: int) -> float:
    """Pipeline slots the fill and drain take: none without a pipeline, pp - 1 (GPipe, 1F1B), (pp - 1) / v
    interleaved; with uneven chunks of ``layers`` the fill and drain wait on the largest chunk, not on
    a v-th of the busiest rank's ``busiest`` layers."""
    pp, v = config.pp, config.virtual_stages
    if pp == 1:
        return 0.0
    if config.pipeline_schedule != "interleaved":
        return float(pp - 1)
    slots = (pp - 1) / v
    if layers % (pp * v) and busiest:
        slots *= max(chunk_sizes(layers, pp * v)) * v / busiest
    return slots


def _partly_hidden(comm: float, compute: float) -> float:
    """Exposed seconds of ``comm`` overlapped with ``compute`` by ZeRO-3's prefetch."""
    hidden = min(comm, ZERO3_PREFETCH * comm, compute)
    return comm - hidden + ZERO3_CONTENTION * hidden


def _submodules(model: ModelSpec) -> int:
    """Submodules of one transformers layer that ZeRO-3 hooks (projections, norms, dropouts,
    activation and their containers: about 16 in BERT/GPT-2/LLaMA layers)."""
    return 2 * epilogue.weight_modules(model) + 4


def _layer_times(model: ModelSpec, config: ScheduleConfig, r: _Rates,
                 dropout: bool | None) -> tuple[float, float, float, int]:
    """(forward, backward, attention-core forward) compute seconds of one layer for one micro-batch
    on one device, the third being what selective recomputation runs again; and the number of
    kernels the layer's forward launches (for the host's issue rate)."""
    t, b, s = config.tp, config.micro_batch, model.seq_len
    h, f, e = model.hidden, model.ffn, r.e
    kvd = model.kv_heads * model.head_dim
    d = model.head_dim
    T = b * s
    heads = model.heads / t
    fused = config.compile_layers
    dropout = has_dropout(model, dropout)
    # weight GEMMs
    g = r.gemm(T, (h + 2 * kvd) / t, h) + r.gemm(T, h, h / t)
    g += r.gemm(T, f * (2 if model.gated_mlp else 1) / t, h) + r.gemm(T, h, f / t)
    bwd = 2 * g  # data and weight gradients
    # attention
    if config.attn_kernel == "eager":
        attn = r.gemm(s, s, d, b * heads) + r.gemm(s, d, s, b * heads)
        scores = b * heads * s * s
        # scale, mask, softmax (fused into one pass when compiled), dropout on the probabilities
        passes = 1 if fused else 3
        ew_attn = r.mem(scores * e * 2 * passes, passes)
        if dropout:
            ew_attn += r.mem(scores * (2 * e + 1), 1)
        fwd_attn = attn + ew_attn
        bwd_attn = 2 * attn + 2 * ew_attn
        attn_kernels = 2 + passes + (1 if dropout else 0)
    else:
        fwd_attn, bwd_attn = fused_attention_s(r, s, d, b * heads, model.causal, config.attn_kernel)
        attn_kernels = 1
    # elementwise traffic per token: norms, dropout + residual, activation, q/k/v layout copies
    rep, rope, extra_kernels = layer_norms_and_rotary(model.family, e, fused, h, kvd, config.norm_kernel)
    per_res = (3 * e + 1) * h if fused else (5 * e + 1) * h
    if not dropout:
        per_res = 3 * e * h
    rep += 2 * per_res
    if config.sequence_parallel:
        rep /= t
    kernels = (8 if fused else 14) + extra_kernels
    bias_fused = fused or config.fuse_bias_gelu
    if model.gated_mlp:
        act = 3 * e * f if fused else 5 * e * f  # silu, product
    elif model.family in TANH_GELU_FAMILIES and not bias_fused:
        act = 18 * e * f  # transformers' tanh-GELU: eight elementwise ops over the MLP width
        kernels += 7
    elif bias_fused:
        act = 2 * e * f  # one pass: read the GEMM's output, add the bias, GeLU, write
    else:
        # the bias is its own pass over the fc1 output (written, then read by the GeLU), then GeLU
        act = 4 * e * f
        kernels += 1
    # q/k/v transposes into the [b, heads, s, d] layout and the context's back; a flash_attn kernel
    # reads and writes [b, s, heads, d] in place
    layout = 0.0 if config.attn_kernel == "flash" else 2 * e * (h + 2 * kvd) + 2 * e * h
    shard = act + layout + rope
    ew = r.mem(T * (rep + shard / t), kernels)
    fwd = g + fwd_attn + ew
    bwd_total = bwd + bwd_attn + 2 * ew
    # four weight GEMMs (five gated), the attention kernels, the elementwise ones, the layout copies
    # (none for flash_attn) and the two tensor-parallel allreduces
    n_kernels = (5 if model.gated_mlp else 4) + attn_kernels + kernels
    n_kernels += 0 if config.attn_kernel == "flash" else 4
    n_kernels += 2 if t > 1 else 0
    return fwd, bwd_total, fwd_attn, n_kernels


def _encdec_microbatch_times(model: ModelSpec, config: ScheduleConfig, r: _Rates, dropout: bool | None,
                             tp_bw: float) -> tuple[float, float, float, float]:
    """(forward, backward, recompute, TP collectives) seconds of one T5 micro-batch on one device.

    An encoder block is ``_layer_times`` over the source tokens, a decoder block over the target
    tokens plus its cross-attention (q and o over target tokens, k and v over source tokens, scores
    target x source); the q and o GEMMs are ``heads x d_kv`` wide. TP: 4 all-reduces an encoder block
    (source tokens), 6 a decoder block (target tokens) and one for the k/v input's gradient (source).
    """
    t, b, e = config.tp, config.micro_batch, r.e
    s, u, h, d = model.seq_len, model.decoder_seq_len, model.hidden, model.head_dim
    inner, heads = model.heads * d, model.heads / t
    Ts, Tu = b * s, b * u
    enc = model
    dec = replace(model, seq_len=u, max_positions=max(u, model.max_positions))

    def wide(T: float) -> float:  # q and o are heads x d_kv wide, not hidden
        return (r.gemm(T, inner / t, h) + r.gemm(T, h, inner / t)) - (r.gemm(T, h / t, h) + r.gemm(T, h, h / t))

    ef, eb, ec, _ = _layer_times(enc, config, r, dropout)
    ef, eb = ef + wide(Ts), eb + 2 * wide(Ts)
    df, db, dc, _ = _layer_times(dec, config, r, dropout)
    proj = r.gemm(Tu, inner / t, h) + r.gemm(Ts, 2 * inner / t, h) + r.gemm(Tu, h, inner / t)
    core = r.gemm(u, s, d, b * heads) + r.gemm(u, d, s, b * heads) + r.mem(b * heads * u * s * e * 6, 3)
    df, db, dc = df + wide(Tu) + proj + core, db + 2 * wide(Tu) + 2 * proj + 2 * core, dc + core
    tp_s = collective_s("allreduce", Ts * h * e, t, tp_bw, r.perf)
    tp_u = collective_s("allreduce", Tu * h * e, t, tp_bw, r.perf)
    head_f = r.gemm(Tu, model.vocab / t, h) + r.mem(Tu * model.vocab / t * (e + 3 * 4), 3)
    head_b = 2 * head_f + (r.gemm(Tu, model.vocab / t, h) if config.loss_kernel == "chunked" else 0.0)
    emb = r.mem((Ts + Tu) * h * (2 * e + 1), 3)
    le, ckpt = model.layers, checkpointed_blocks(model, config)
    again_e, again_d = ef + 2 * tp_s, df + 3 * tp_u  # full recomputation: the block with its collectives
    if config.ckpt_granularity == "selective":
        again_e, again_d = ec, dc
    elif config.ckpt_granularity == "op":
        # per op: less the products whose outputs it keeps, and a fused attention kernel's
        def kept_s(decoder: bool) -> float:
            return products_s(r, t, [(Ts if src else Tu, out, k, row)
                                     for out, k, row, src in block_linears(model, decoder)[::2]])
        fused = config.attn_kernel != "eager"
        again_e -= kept_s(False) + (ec if fused else 0.0)
        again_d -= kept_s(True) + (dc if fused else 0.0)

    def stage(rank: int) -> tuple[float, float, float, float]:
        # a pipeline rank's blocks (all of them when pp = 1): embeddings on the first, head on the last
        blocks = stage_blocks(model, config, rank)
        ne, nd, ends = sum(i < le for i in blocks), sum(i >= le for i in blocks), (rank == 0, rank == config.pp - 1)
        rec = sum(again_e if i < le else again_d for i in blocks if i in ckpt)
        return (ne * ef + nd * df + ends[1] * head_f + ends[0] * emb,
                ne * eb + nd * db + ends[1] * head_b + ends[0] * 2 * emb, rec, ne * 4 * tp_s + nd * (6 * tp_u + tp_s))

    # the slowest stage sets every pipeline slot (stages hold different kinds of block)
    return max((stage(rank) for rank in range(config.pp)), key=sum)


def products_s(r: _Rates, tp: int, products: list[tuple[float, int, int, bool]]) -> float:
    """Seconds of weight products ``(tokens, out, in, row_parallel)`` on one device under ``tp``: a
    column-parallel product's output is ``out/tp`` wide, a row-parallel one's inner dimension ``in/tp``."""
    return sum(r.gemm(n, out, k / tp) if row else r.gemm(n, out / tp, k) for n, out, k, row in products)


def op_kept_seconds(model: ModelSpec, config: ScheduleConfig, r: _Rates, tokens: float) -> float:
    """Seconds of the weight products whose outputs per-op recomputation keeps (not run again), one
    micro-batch of ``tokens`` on one device."""
    return products_s(r, config.tp, [(tokens, out, k, row) for out, k, row in op_kept_linears(model)])


def estimate_time(model: ModelSpec, config: ScheduleConfig, cluster: ClusterSpec,
                  perf: DevicePerf, dropout: bool | None = None) -> TimeBreakdown:
    """Seconds of one optimizer step of ``config`` on ``cluster``, split by cause."""
    if model.family == "user":  # a model file's traced shape (imported here: that module builds on this one)
        from autoslapo.cost.user_time import estimate_user_time

        return estimate_user_time(model, config, cluster, perf)
    r = _Rates(perf, cluster, config)
    t, pp, dp, m = config.tp, config.pp, config.dp, config.grad_accum
    b, s, h, e = config.micro_batch, model.seq_len, model.hidden, r.e
    T = b * s
    fwd_l, bwd_l, core_l, kernels_l = _layer_times(model, config, r, dropout)

    # tensor-parallel collectives per layer: 2 in forward, 2 in backward (same volume with SP)
    tp_bw = group_bandwidth(cluster, 1, t)
    tp_one = collective_s("allreduce", T * h * e, t, tp_bw, perf)
    # head: vocab-parallel logits, cross-entropy in fp32, plus the embedding lookup and its grad
    # (ALBERT's factorized head: hidden -> E transform, then E -> vocab; E = hidden elsewhere)
    width = model.embedding_size
    head_f = r.gemm(T, model.vocab / t, width) + r.mem(T * model.vocab / t * (e + 3 * 4), 3)
    if not model.causal:
        head_f += r.gemm(T, width, h) + r.mem(T * width * e * 4, 2)
    if width != h:  # ALBERT's E -> hidden embedding map
        head_f += r.gemm(T, h, width)
    head_b = 2 * head_f
    if config.loss_kernel == "chunked":
        head_b += r.gemm(T, model.vocab / t, h)  # backward recomputes each chunk's logits
    emb = r.mem(T * h * (2 * e + 1), 3)

    # full recomputation runs a layer's forward again (with its two collectives); selective only
    # its attention core (Korthikanti et al. 2022), the projections' outputs being kept
    again = core_l if config.ckpt_granularity == "selective" else fwd_l + 2 * tp_one
    if config.ckpt_granularity == "op":
        # per op: the layer again less the products and the fused attention kernel whose outputs it keeps
        again -= op_kept_seconds(model, config, r, T) + (core_l if config.attn_kernel != "eager" else 0.0)
    ckpt = set(checkpointed_layer_ids(model, config))

    def rank_slot(layers: list[int], last: bool) -> tuple[float, float, float, int, int]:
        # (forward, backward, recomputation) of one micro-batch on a rank, its layers and recomputed ones
        n, n_rec = len(layers), sum(1 for i in layers if i in ckpt)
        fwd = n * fwd_l + (head_f if last else 0.0) + (emb if pp == 1 else 0.0)
        bwd = n * bwd_l + (head_b if last else 0.0) + (2 * emb if pp == 1 else 0.0)
        return fwd, bwd, n_rec * again + n * 4 * tp_one, n, n_rec

    if model.encoder_decoder:  # T5: two stacks of unequal blocks over source and target tokens
        fwd_mb, bwd_mb, rec_mb, tp_mb = _encdec_microbatch_times(model, config, r, dropout, tp_bw)
        busiest = stage_blocks(model, config, busiest_rank(model, config))
        per_stage, n_ckpt = len(busiest), len(checkpointed_blocks(model, config) & set(busiest))
        fwd_layers, bwd_layers = fwd_mb, bwd_mb  # its blocks of both stacks, unequal in cost
    else:
        # the busiest rank sets every pipeline slot: the last (it runs the head) unless an uneven
        # split gives a middle rank a layer more
        ranks = rank_layers(model.layers, pp, config.virtual_stages)
        fwd_mb, bwd_mb, _, per_stage, n_ckpt = max(
            (rank_slot(layers, i == pp - 1) for i, layers in enumerate(ranks)), key=lambda x: x[0] + x[1] + x[2])
        rec_mb, tp_mb = n_ckpt * again, per_stage * 4 * tp_one
        fwd_layers, bwd_layers = per_stage * fwd_l, per_stage * bwd_l

    # each micro-batch's weight gradients: accumulated into .grad; hooked by autoslapo's fp16 loss scaler
    n_params, tensors = max(stage_params(model, config)), per_stage * epilogue.layer_tensors(model)
    weight_e, grad_e, _ = state_bytes_per_param(config, perf.runtime)  # fp32 in autoslapo's runtime
    bwd_mb += (epilogue.accumulation_s(r.mem, n_params, grad_e, m)
               + epilogue.loss_scaler_s(r.mem, config, perf.runtime, n_params, tensors))

    # pipeline: point-to-point sends of activations and their gradients between stages
    pp_bw = group_bandwidth(cluster, t * dp, pp)
    p2p_bytes = T * h * e / (t if config.sequence_parallel else 1)
    if model.encoder_decoder:  # T5: both streams, source and target tokens
        p2p_bytes = b * (s + model.decoder_seq_len) * h * e
    transfer = p2p_bytes / (pp_bw * 1e9 * perf.comm_eff) + perf.coll_latency_s if pp > 1 else 0.0
    v = config.virtual_stages
    slot = fwd_mb + bwd_mb + rec_mb + tp_mb
    slots = bubble_slots(config, model.blocks, per_stage)
    pp_comm = pipeline_p2p_s(perf.pipeline_engine, m, pp, slots, v, transfer, fwd_mb / v)
    if pp > 1 and model.shared_layers:
        # every stage holds the shared layer (ALBERT): its gradients are summed over the pipeline
        # group once a step, after the schedule (``PipelineRuntime.sync_tied_grads``)
        shared_bytes = model.stored_layers * model.layer_params() / t * grad_e
        pp_comm += collective_s("allreduce", shared_bytes, pp, pp_bw, perf, group_nodes(cluster, t * dp, pp))

    # data parallel: gradients of this device's parameters over the dp group
    dp_bw = group_bandwidth(cluster, t, dp)
    g_bytes = n_params * grad_e
    w_bytes = n_params * weight_e
    z = config.zero_stage
    bwd_compute = bwd_layers  # the busiest rank's layers, one micro-batch
    if z <= 1:
        # one allreduce (ZeRO-1: reduce-scatter + all-gather of the same volume) after the last
        # backward; DeepSpeed and Megatron's DDP of that time run it after backward, not during
        dp_comm = gradient_sync_s(g_bytes, cluster, t, dp, perf, z)
    elif z == 2:
        # DeepSpeed reduces a bucket of ``reduce_bucket_size`` gradients whenever one fills, every
        # micro-batch: each bucket a reduce-scatter with its own latency hops. Over pipeline stages
        # autoslapo's runtime (DeepSpeed's engine refuses ZeRO-2 there) reduces each parameter's
        # gradient to its owner on its own, a collective a tensor
        per_tensor = pp > 1 and is_autoslapo_runtime(perf.runtime)
        buckets = tensors if per_tensor else math.ceil(n_params / REDUCE_BUCKET_ELEMENTS)
        rs = collective_s("reduce_scatter", g_bytes, dp, dp_bw, perf) + (buckets - 1) * (dp - 1) * perf.coll_latency_s
        hidden_part = perf.overlap * bwd_compute
        dp_comm = m * max(rs - hidden_part, 0.1 * rs) + collective_s("all_gather", w_bytes, dp, dp_bw, perf)
    else:
        # DeepSpeed ZeRO-3 (Rajbhandari et al. 2020, section 7; stage3.py / partitioned_param_coordinator):
        # every module's weights are all-gathered before its forward and again before its
        # backward, and the gradients reduce-scattered after: 1.5x the allreduce volume, every
        # micro-batch. One gather a weight-holding module (each a collective with its own latency
        # hops); prefetching hides only part of it behind compute, and what it hides still slows
        # the compute it shares the memory system and SMs with. Each submodule also runs four
        # Python hooks a micro-batch (pre/post forward and backward) that wait on their gathers.
        mods = epilogue.weight_modules(model)
        ag = collective_s("all_gather", w_bytes, dp, dp_bw, perf) + per_stage * mods * (dp - 1) * perf.coll_latency_s
        rs = collective_s("reduce_scatter", g_bytes, dp, dp_bw, perf) + per_stage * (dp - 1) * perf.coll_latency_s
        fwd_compute = fwd_layers
        hooks = per_stage * _submodules(model) * 4 * ZERO3_HOOK_S
        dp_comm = m * (_partly_hidden(ag, fwd_compute * perf.overlap)
                       + _partly_hidden(ag + rs, bwd_compute * perf.overlap) + hooks)

    # optimizer step: memory-bound over this device's (ZeRO-partitioned) optimizer state
    optimizer = epilogue.optimizer_s(r.mem, config, n_params / (dp if z >= 1 else 1))

    # the runtime's fixed costs (Python, the engine's bookkeeping, barriers): measured on a CPU
    overhead = perf.step_overhead_s + m * perf.microbatch_overhead_s
    # the host issues every kernel (``autoslapo.cost.kernels``): forward, backward (about twice the
    # forward's kernels) and recomputation; a micro-batch whose kernels run for less than the host
    # takes to issue them waits on the host, in every slot of the pipeline
    if perf.host_op_s > 0:
        issued = (per_stage * kernels_l * 3 + n_ckpt * (1 if config.ckpt_granularity == "selective" else kernels_l)
                  + epilogue.loss_scaler_kernels(config, perf.runtime, tensors))
        overhead += (m + slots) * (host_floor_s(issued, perf.host_op_s, slot) - slot)

    return TimeBreakdown(
        compute=m * (fwd_mb + bwd_mb),
        recompute=m * rec_mb,
        tp_comm=m * tp_mb,
        pp_comm=pp_comm,
        bubble=slots * slot,
        dp_comm=dp_comm,
        optimizer=optimizer,
        overhead=overhead,
    )
