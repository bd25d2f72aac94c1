"""Cost terms of a convolutional family (WideResNet): FLOPs, saved activations, parameters, step time. Pure.

FLOPs (``autoslapo.cost.flops.conv_forward_flops``): each convolution costs ``2 K^2 Cin Cout Hout Wout`` per image in forward (the classifier
``2 C classes``); backward twice that (data and weight gradients), so a training step is 3x forward
and each checkpointed block adds its forward once more. BatchNorm, ReLU, pooling and additions are
memory-bound and timed by their traffic.

Saved activations (what autograd keeps for backward, per image, as the module in
``autoslapo.models.wideresnet`` runs): a bottleneck keeps ``bn1``'s input and ``relu``'s output
(``conv1``'s width, split over tp), ``bn2``'s input and its ReLU's output (``conv2``'s width, whole:
conv2's partial sums are all-reduced before ``bn2``), ``bn3``'s input, the shortcut BatchNorm's input
and the block's output (its output channels). The block's input is the previous block's output. A
checkpointed block keeps only its output. The stem keeps the images, its BatchNorm's input, ReLU's
output and the max-pool's int64 indices and output.

The shapes come from ``autoslapo.models.wrn_shape`` (the module's own), so these terms and the
module cannot disagree; ``tests/autoslapo/test_cost_conv.py`` checks them against what PyTorch
counts and keeps on CPU for the tiny preset.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autoslapo.cost.comm import collective_s, gradient_sync_s, group_bandwidth
from autoslapo.cost.device import DevicePerf, is_autoslapo_runtime
from autoslapo.cost.epilogue import accumulation_s, loss_scaler_s, optimizer_s
from autoslapo.cost.head import element_bytes
from autoslapo.cost.memory import (
    MemoryBreakdown,
    checkpointed_layer_ids,
    in_flight_microbatches,
    state_bytes_per_param,
    zero_buffer_bytes,
)
from autoslapo.cost.time import TimeBreakdown, _Rates, bubble_slots
from autoslapo.layout import chunk_bounds, rank_layers
from autoslapo.models.wrn_shape import (
    Conv,
    block_convs,
    stage_blocks,
    stem_convs,
    wrn_rank_params,
)

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec

__all__ = [
    "block_activation_elements",
    "convolution_cluster",
    "estimate_conv_activation_bytes",
    "estimate_conv_memory",
    "estimate_conv_time",
    "nchw_transposes",
    "stem_activation_bytes",
    "winograd",
]


def _blocks(model: ModelSpec) -> list[list[Conv]]:
    return block_convs(model.hidden, model.ffn, model.layers, model.seq_len)


def _classes_in(model: ModelSpec) -> int:
    return model.hidden * 2 ** (len(stage_blocks(model.layers)) - 1)


def block_activation_elements(model: ModelSpec, tp: int = 1) -> list[tuple[float, float]]:
    """Per image and block: (elements kept without checkpointing, elements kept when checkpointed)."""
    out = []
    for convs in _blocks(model):
        c1, c2, c3 = convs[:3]
        shortcut = len(convs) > 3
        in_side = c1.out_side**2
        side = c2.out_side**2
        full = 2 * c1.cout / tp * in_side + 2 * c2.cout * side + c3.cout * side * (2 + (1 if shortcut else 0))
        out.append((float(full), float(c3.cout * side)))
    return out


def stem_activation_bytes(model: ModelSpec, elem: int) -> float:
    """Bytes per image the stem keeps: images, BatchNorm input, ReLU output, max-pool indices and output."""
    stem, side = stem_convs(model.hidden, model.seq_len)
    conv_out = stem.cout * stem.out_side**2
    return elem * (3 * model.seq_len**2 + 2 * conv_out + stem.cout * side**2) + 8 * stem.cout * side**2


def _in_flight(config: ScheduleConfig, rank: int) -> float:
    # 1F1B: rank r holds pp - r micro-batches at its peak; GPipe and interleaved: as the first stage
    if config.pp > 1 and config.pipeline_schedule == "1f1b":
        return float(min(config.grad_accum, config.pp - rank))
    return in_flight_microbatches(config)


def estimate_conv_activation_bytes(model: ModelSpec, config: ScheduleConfig, transients: bool = False) -> int:
    """Activation bytes on the most loaded pipeline rank: what its blocks keep for backward for its
    micro-batches in flight (the stem's on the first rank, the logits on the last's), and with
    ``transients`` the peak in backward (its largest block rebuilt and its gradients on top)."""
    e = element_bytes(config)
    ckpt = set(checkpointed_layer_ids(model, config))  # within each chunk, as ``autoslapo.conv_plan`` places them
    blocks = block_activation_elements(model, config.tp)
    last = (config.pp * config.virtual_stages - 1) % config.pp
    worst = 0.0
    for rank, mine in enumerate(rank_layers(model.layers, config.pp, config.virtual_stages)):
        per_image = e * sum(blocks[i][1] if i in ckpt else blocks[i][0] for i in mine)
        if rank == 0:
            per_image += stem_activation_bytes(model, e)
        if rank == last:
            per_image += 4 * 2 * model.vocab  # logits and the loss's fp32 log-softmax
        total = per_image * _in_flight(config, rank)
        if transients:
            total += e * max(2 * blocks[i][0] for i in mine)
        worst = max(worst, total)
    return int(config.micro_batch * worst)


def _stage_params(model: ModelSpec, config: ScheduleConfig) -> float:
    # the most loaded pipeline rank: conv1 + bn1 and conv2 split over tp, the rest replicated
    return max(wrn_rank_params(model.hidden, model.ffn, model.layers, model.vocab, tp=config.tp, pp=config.pp,
                               chunks=config.pp * config.virtual_stages))


def estimate_conv_memory(model: ModelSpec, config: ScheduleConfig, perf: DevicePerf) -> MemoryBreakdown:
    """Per-device memory: parameters (tp-split where sharded), gradients and optimizer state under
    ZeRO, the activations of a micro-batch, DeepSpeed's buffers and the framework's overhead."""
    rt = perf.runtime
    n = _stage_params(model, config)
    w, g, o = state_bytes_per_param(config, rt)
    dp, z = config.dp, config.zero_stage
    wb, gb, ob = int(n * w / (dp if z >= 3 else 1)), int(n * g / (dp if z >= 2 else 1)), int(n * o / (dp if z >= 1 else 1))
    if is_autoslapo_runtime(rt) and config.precision != "fp32":
        wb += int(n * element_bytes(config))  # autocast's 16-bit weight copies
    act = int(estimate_conv_activation_bytes(model, config, transients=True) * perf.activation_slack)
    during, after = zero_buffer_bytes(model, config, rt)
    buffers = during + max(0, after - act)
    if config.zero_stage >= 1 and config.pp == 1:  # DeepSpeed's ZeRO optimizer (pipelines use torch's)
        buffers += perf.zero_overhead_bytes
    return MemoryBreakdown(params=wb, grads=gb, optimizer=ob, activations=act,
                           overhead=perf.fixed_overhead_bytes, buffers=buffers)


def convolution_cluster(cluster: ClusterSpec, config: ScheduleConfig) -> ClusterSpec:
    """The cluster as cuDNN's convolutions see it: fp32 ones run on TF32 tensor cores where the device
    has them (``DeviceSpec.tf32``: half its 16-bit peak; PyTorch's ``torch.backends.cudnn.allow_tf32``
    is on by default, its matmuls' switch is off, so a matmul keeps the fp32 peak)."""
    if config.precision == "fp32" and cluster.device.tf32:
        return replace(cluster, peak_tflops_fp32=cluster.peak_tflops / 2)
    return cluster


#: cuDNN's Winograd algorithms for 3x3 stride-1 convolutions on CUDA cores (fp32 where the device has
#: no TF32 tensor cores): F(2x2, 3x3) computes a 2x2 output tile with 16 multiplications instead of 36
#: (Lavin and Gray 2016, "Fast Algorithms for Convolutional Neural Networks", table 1), taken as the
#: gain in arithmetic rate; not fitted. The input and output transforms are not priced apart.
WINOGRAD_GAIN = 36 / 16


def winograd(config: ScheduleConfig, cluster: ClusterSpec, perf: DevicePerf) -> bool:
    """Whether 3x3 stride-1 convolutions run as Winograd's (cuDNN picks it for fp32 on CUDA cores;
    tensor-core kernels, 16-bit or TF32, are implicit GEMMs; a CPU's profile measures its own)."""
    return config.precision == "fp32" and not cluster.device.tf32 and perf.name != "cpu"


def nchw_transposes(config: ScheduleConfig, cluster: ClusterSpec, perf: DevicePerf) -> bool:
    """Whether cuDNN transposes each convolution's feature maps: its tensor-core kernels (16-bit, and
    fp32 as TF32 where the device has it) read and write NHWC, so an NCHW input is transposed before
    and the output after, in backward the output's gradient and the input's (NVIDIA's
    "Convolutional Layers User's Guide", tensor layouts). Not with ``channels_last``, not in fp32 on
    CUDA cores (their kernels take NCHW), not on a CPU (its profile measures the runtime as it runs)."""
    if config.channels_last or perf.name == "cpu":
        return False
    return config.precision != "fp32" or cluster.device.tf32


def _transpose_bytes(convs: list[Conv], images: int, tp: int, e: int) -> float:
    # a forward's transposes: each conv's input and output read and written once; a block's convs
    # take conv1's side (conv1, conv2 and the shortcut) or conv2's (conv3) as input
    sides = [convs[0].out_side, convs[0].out_side, convs[1].out_side, convs[0].out_side]
    total = 0.0
    for c, side in zip(convs, sides, strict=False):
        cin = c.cin / tp if c.sharded == "in" else c.cin
        cout = c.cout / tp if c.sharded == "out" else c.cout
        total += 2 * e * images * (cin * side**2 + cout * c.out_side**2)
    return total


def _conv_seconds(r: _Rates, c: Conv, images: int, tp: int) -> float:
    # a convolution as its implicit GEMM: (images x Hout x Wout) x Cout x (K^2 x Cin)
    cin = c.cin / tp if c.sharded == "in" else c.cin
    cout = c.cout / tp if c.sharded == "out" else c.cout
    return r.gemm(images * c.out_side**2, cout, c.k * c.k * cin)


def estimate_conv_time(model: ModelSpec, config: ScheduleConfig, cluster: ClusterSpec,
                       perf: DevicePerf) -> TimeBreakdown:
    """Seconds of one optimizer step: the convolutions as implicit GEMMs (backward twice forward;
    fp32 ones on TF32 tensor cores where the device has them, as PyTorch's cuDNN runs them by default),
    BatchNorm/ReLU/add traffic, the transposes of NCHW feature maps around tensor-core convolutions
    (``nchw_transposes``; backward twice forward's as well), Winograd's 3x3 convolutions in fp32 on CUDA
    cores (``winograd``), conv2's all-reduce per block over tp (forward, and conv1's input
    gradient in backward), the data-parallel gradient all-reduce, the optimizer and the overheads.
    With pp > 1 the slowest rank's blocks set the pace of every micro-batch slot; the bubble is
    (pp - 1) such slots (/ virtual stages, interleaved) and each cut sends the feature map of the
    block before it, and receives its gradient, once a micro-batch."""
    r = _Rates(perf, cluster, config)
    rc = _Rates(perf, convolution_cluster(cluster, config), config)
    t, pp, dp, m, b, e = config.tp, config.pp, config.dp, config.grad_accum, config.micro_batch, r.e
    stem, _ = stem_convs(model.hidden, model.seq_len)
    blocks = _blocks(model)
    tp_bw = group_bandwidth(cluster, 1, t)
    fwd_blocks, tp_blocks = [], []
    transposed, fast_3x3 = nchw_transposes(config, cluster, perf), winograd(config, cluster, perf)
    for convs in blocks:
        # conv2 (3x3) as Winograd's where it keeps conv1's side (stride 1)
        wino = fast_3x3 and convs[1].k == 3 and convs[1].out_side == convs[0].out_side
        gemm = sum(_conv_seconds(rc, c, b, t) / (WINOGRAD_GAIN if wino and i == 1 else 1.0) for i, c in enumerate(convs))
        # each BatchNorm reads and writes its input twice in training (statistics, then normalize),
        # ReLU once, the residual add once: about 6 passes over every conv output
        ew = r.mem(sum(6 * e * b * c.cout / (t if c.sharded == "out" else 1) * c.out_side**2 for c in convs),
                   3 * len(convs) + 2)
        if transposed:
            ew += r.mem(_transpose_bytes(convs, b, t, e), 2 * len(convs))
        fwd_blocks.append(gemm + ew)
        c2 = convs[1]
        tp_blocks.append(2 * collective_s("allreduce", b * c2.cout * c2.out_side**2 * e, t, tp_bw, perf))
    head = r.gemm(b, model.vocab, _classes_in(model))
    stem_s = _conv_seconds(rc, stem, b, 1) + r.mem(6 * e * b * stem.cout * stem.out_side**2, 4)
    if transposed:  # the images and the 7x7 convolution's output
        stem_s += r.mem(2 * e * b * (stem.cin * model.seq_len**2 + stem.cout * stem.out_side**2), 2)
    ckpt = set(checkpointed_layer_ids(model, config))  # within each chunk, as ``autoslapo.conv_plan`` places them
    chunks = pp * config.virtual_stages
    last = (chunks - 1) % pp
    # each rank's micro-batch: (forward, recomputation, tp collectives); the slowest paces the pipeline
    per_rank = []
    ranks = rank_layers(model.layers, pp, config.virtual_stages)
    for rank, mine in enumerate(ranks):
        fwd = sum(fwd_blocks[i] for i in mine) + (stem_s if rank == 0 else 0.0) + (head if rank == last else 0.0)
        rec = sum(fwd_blocks[i] + tp_blocks[i] / 2 for i in mine if i in ckpt)
        per_rank.append((fwd, rec, sum(tp_blocks[i] for i in mine)))
    fwd, rec, tp_mb = max(per_rank, key=lambda x: 3 * x[0] + x[1] + x[2])
    n = _stage_params(model, config)
    _, grad_e, _ = state_bytes_per_param(config, perf.runtime)  # fp32 in autoslapo's runtime
    # a conv's weight and its BatchNorm's weight and bias on the busiest rank; the stem's and head's
    tensors = 3 * max(sum(len(blocks[i]) for i in mine) for mine in ranks) + 5
    accum = accumulation_s(r.mem, n, grad_e, m) + loss_scaler_s(r.mem, config, perf.runtime, n, tensors)
    dp_comm = gradient_sync_s(n * grad_e, cluster, t, dp, perf, config.zero_stage)
    if config.zero_stage == 3:  # weights gathered before forward and backward: 1.5x the volume a micro-batch
        dp_comm *= 1.5 * m
    optimizer = optimizer_s(r.mem, config, n / (dp if config.zero_stage >= 1 else 1))
    slots, pp_comm = bubble_slots(config, model.layers, max(len(mine) for mine in ranks)), 0.0
    if pp > 1:
        # the feature map after each cut block (its size depends on where the cut falls), sent forward
        # and its gradient back, a micro-batch; a rank sends from each of its chunks but the last
        pp_bw = group_bandwidth(cluster, t * dp, pp)
        sends = [0.0] * pp
        for c, (_, stop) in enumerate(chunk_bounds(model.layers, chunks)[:-1]):
            out = blocks[stop - 1][2]  # conv3: the block's output channels and side
            nbytes = b * out.cout * out.out_side**2 * e
            sends[c % pp] += 2 * (nbytes / (pp_bw * 1e9 * perf.comm_eff) + perf.coll_latency_s)
        pp_comm = (m + slots) * max(sends)
    slot = 3 * fwd + accum + rec + tp_mb
    return TimeBreakdown(
        compute=m * (3 * fwd + accum), recompute=m * rec, tp_comm=m * tp_mb, pp_comm=pp_comm,
        bubble=slots * slot, dp_comm=dp_comm, optimizer=optimizer,
        overhead=perf.step_overhead_s + m * perf.microbatch_overhead_s,
    )
