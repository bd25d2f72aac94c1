"""GPU kernel physics the step-time model builds on: a fused attention kernel, GEMM size, host issue rate. Pure.

Three effects that a per-FLOP and per-byte roofline misses, each with its basis:

- **Fused (flash) attention.** FlashAttention keeps each block of scores in on-chip SRAM: its HBM
  traffic is the Q, K, V and output tensors (and their gradients), never the ``s x s`` score
  matrix (Dao et al. 2022, section 3.2; K and V blocks re-read by every query block are served by
  the L2 cache). Besides its two tensor-core products, every score element goes through the
  online softmax (scale, running max, subtract, exp, running sum; in backward the recomputed
  ``exp`` and ``dS = P (dP - D)``) on the FP32 units, which an A100 runs at 19.5 TFLOP/s against
  312 for 16-bit matmul: "each non-matmul FLOP is 16x more expensive than a matmul FLOP" (Dao 2023,
  FlashAttention-2, section 3.1). Per score element that is about 5 FP32 operations in forward
  (``FLASH_SOFTMAX_FWD_OPS``) and 7 in backward (``FLASH_SOFTMAX_BWD_OPS``), a lane's cycle each
  (the FP32 peak counts a fused multiply-add as two FLOPs), and one exponential on the
  special-function units: 16 results a clock an SM on compute capability 7.0-10.0 (CUDA C++
  Programming Guide, arithmetic instruction throughput; ``DeviceSpec.sfu_tops``), a quarter of an
  A100's 64 FP32 lanes an SM but an eighth of an H100's 128, so an H100's exponentials are twice
  as slow against its FP32 units and its matmul ("989 TFLOPS of FP16 matmul but only 3.9 TFLOPS of
  special functions", Shah et al. 2024, FlashAttention-3, section 3; their FlashAttention-2 reaches
  35 % of an H100's peak against up to 73 % of an A100's). FlashAttention-2 overlaps only part of
  the softmax with the products (``FLASH_SOFTMAX_EXPOSED``), which is why its backward and short head
  dimensions reach a lower fraction of peak (Dao 2023, figures 4-6). On an A100 the softmax costs
  about half the products' time with a 64-wide head and a quarter to a third with a 128-wide one
  (0.44-0.52 and 0.25-0.29 at sdpa's and flash_attn's rates; half of it exposed); on an H100 a tenth
  more than that (0.50-0.58 and 0.28-0.33), its exponentials most of it.
- **GEMM size.** A GEMM's rate saturates with its size. Wave quantization (tiles that leave SMs
  idle in the last wave) is modelled in ``autoslapo.cost.time``; beyond it every launch pays a
  ramp (the first wave of thread blocks filling the SMs, the prologue loading the first tiles)
  and a drain (the last wave's epilogue): a fixed time ``DevicePerf.gemm_fixed_s`` whatever the
  GEMM's FLOPs, of the order of a kernel launch (a few microseconds; NVIDIA's "Matrix
  Multiplication Background" guide shows cuBLAS throughput rising with the problem size until
  the GPU is filled). Efficiency therefore saturates as ``F / (F + R t0)`` (``R`` the large-GEMM
  rate): small micro-batches at high tensor parallelism (tokens x hidden / tp) pay it on every
  GEMM. 3 us at an A100's ~255 TFLOP/s puts half efficiency at ~0.8 GFLOP (a 740^3 GEMM); not
  fitted to any row.
- **Host issue rate.** Eager PyTorch issues every kernel from the host: Python, the dispatcher
  and ``cudaLaunchKernel`` take several microseconds a kernel on a server CPU, which is why
  short kernels leave the GPU idle ("Accelerating PyTorch with CUDA Graphs", PyTorch blog 2021,
  the motivation for CUDA graphs; ``DevicePerf.host_op_s`` = 8 us, not fitted). The GPU runs ahead of the host only while the host issues faster than the GPU
  retires: a micro-batch takes at least its kernel count times ``DevicePerf.host_op_s``. Megatron's
  pipeline synchronizes the host at every point-to-point exchange, so the floor applies per
  micro-batch, not per step.
- **Eager RMSNorm and rotary positions.** A LayerNorm is one kernel (a read and a write). An
  RMSNorm as transformers writes it (``LlamaRMSNorm``, ``T5LayerNorm``; torchtitan's ``RMSNorm`` of
  2024 the same) is eight eager ops: a cast to fp32, a square, a mean, an add and a reciprocal
  square root (a value a token), a product, a cast back and the weight's product, 36 HBM bytes an
  element in 16-bit (28 in fp32, where the casts return their input). Rotary positions
  (``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``, and the same for k) are five ops
  a tensor: a negation and a concatenation of halves, two products and a sum, 12 element sizes of
  traffic an element (torchtitan's complex-number form moves about as much). Compiled, each is one
  pass: a read and a write. Their share of a layer grows with the device's FLOPs over its
  bandwidth, so an eager LLaMA is slower against its FLOPs on an H100 than on an A100.
"""

from __future__ import annotations

import itertools
import math

from autoslapo.config import RMS_NORM_FAMILIES
from autoslapo.models.spec import FAMILIES

# FP32 operations a score element costs in the online softmax besides its exponential (see the
# module docstring).
FLASH_SOFTMAX_FWD_OPS = 5.0
FLASH_SOFTMAX_BWD_OPS = 7.0
# Share of the softmax's FP32 time a FlashAttention-2 kernel does not hide behind its tensor-core
# products (warps of one block alternate between the two; the paper's tuning aims to overlap them).
FLASH_SOFTMAX_EXPOSED = 0.5
# Fraction of the FP32 peak those elementwise operations reach inside the kernel (register-resident:
# the same fraction as a large GEMM of its tensor-core peak is an upper bound; use it).
FLASH_FP32_EFF = 0.8


#: Families with rotary positions (see the module docstring; each family's ``rotary`` flag in
#: ``autoslapo.models.spec.FAMILIES``); those whose norms are RMSNorms as transformers writes them
#: are ``autoslapo.config.RMS_NORM_FAMILIES``.
ROTARY_FAMILIES = tuple(f for f, flags in FAMILIES.items() if flags.get("rotary"))


def norm_traffic(family: str, elem: float, fused: bool) -> tuple[float, int]:
    """(HBM bytes an element, kernels) of one norm of ``family`` over ``elem``-byte activations."""
    if fused or family not in RMS_NORM_FAMILIES:
        return 2 * elem, 1
    if elem == 4:  # fp32: the casts are no-ops
        return 28.0, 6
    return 20 + 2 * elem + 2 * (elem + 4), 8


def rms_norm_saved_extra(family: str, elem: float, norm_kernel: str, compiled: bool, autocast: bool) -> float:
    """Bytes an element that one RMSNorm of ``family`` keeps for backward beyond what a one-op norm
    keeps (its input; the next product keeps the output either way): 0 for ``norm_kernel`` "fused",
    for ``compiled`` layers and for a family without RMSNorms.

    transformers' chain keeps the fp32 copy of its input (the square's input) and the normalized
    tensor the weight multiplies, in place of the input: 4 + 2 bytes for 2 in a 16-bit model (4 + 4
    for 4 in fp32, or under autocast, whose residual stream is fp32), 4 more either way. T5's chain
    scales the input as it is, so a 16-bit T5 model keeps the input, its fp32 copy and the 16-bit
    normalized tensor: 6 more. Measured with ``saved_tensors_hooks`` (``tests/autoslapo/test_norm_kernel.py``).
    """
    if norm_kernel == "fused" or compiled or family not in RMS_NORM_FAMILIES:
        return 0.0
    return 6.0 if family == "t5" and elem < 4 and not autocast else 4.0


def rotary_traffic(elem: float, fused: bool) -> tuple[float, int]:
    """(HBM bytes an element of q or k, kernels a tensor) of rotary positions (see the module docstring)."""
    return (2 * elem, 1) if fused else (12 * elem, 5)


def layer_norms_and_rotary(family: str, elem: float, fused: bool, hidden: int, kv_width: int,
                           norm_kernel: str = "eager") -> tuple[float, float, int]:
    """(HBM bytes a token of a layer's two norms, of its rotary positions over q (``hidden`` wide) and k
    (``kv_width``), kernels beyond a LayerNorm's one a norm) for ``family``; ``fused``: compiled layers
    (every elementwise chain one pass), ``norm_kernel`` ``"fused"``: a one-kernel RMSNorm only."""
    norm, norm_kernels = norm_traffic(family, elem, fused or norm_kernel == "fused")
    rope, rope_kernels = rotary_traffic(elem, fused) if family in ROTARY_FAMILIES else (0.0, 0)
    return 2 * norm * hidden, rope * (hidden + kv_width), 2 * (norm_kernels - 1) + 2 * rope_kernels


def flash_traffic_bytes(seq_q: float, seq_k: float, head_dim: float, batch: float, elem: float,
                        backward: bool = False) -> float:
    """HBM bytes of a fused attention kernel over ``batch`` (micro-batch x heads) attention problems.

    Forward reads Q, K, V and writes O (plus a row statistic, negligible); backward reads Q, K, V,
    O, dO and writes dQ, dK, dV. The score matrix never leaves on-chip memory.
    """
    per_problem = (2 * seq_q + 2 * seq_k) * head_dim if not backward else (4 * seq_q + 4 * seq_k) * head_dim
    return elem * per_problem * batch


def flash_softmax_s(scores: float, fp32_tflops: float, sfu_tops: float, backward: bool = False) -> float:
    """Exposed seconds of the online softmax over ``scores`` score elements: its FP32 operations, a
    lane's cycle each (``fp32_tflops / 2`` a second: the peak counts an FMA as two), and one
    exponential each on the special-function units (``sfu_tops``, 10^12 results a second)."""
    if scores <= 0:
        return 0.0
    if fp32_tflops <= 0 or sfu_tops <= 0:
        raise ValueError(f"flash_softmax_s: fp32_tflops and sfu_tops must be > 0, got {fp32_tflops} and {sfu_tops}; "
                         "give the device's FP32 (non-tensor) peak in TFLOP/s and its exponentials a second")
    ops = FLASH_SOFTMAX_BWD_OPS if backward else FLASH_SOFTMAX_FWD_OPS
    per_score = ops / (fp32_tflops / 2 * 1e12) + 1 / (sfu_tops * 1e12)
    return FLASH_SOFTMAX_EXPOSED * scores * per_score / FLASH_FP32_EFF


def gemm_size_efficiency(flops: float, rate_flops_s: float, fixed_s: float) -> float:
    """Fraction of ``rate_flops_s`` a GEMM of ``flops`` reaches when each launch costs ``fixed_s`` more.

    ``F / (F + rate * fixed_s)``: 1 for a large GEMM, 1/2 when its FLOPs take ``fixed_s`` at the
    large-GEMM rate, falling towards 0 for tiny ones.
    """
    if fixed_s <= 0 or flops <= 0:
        return 1.0
    return flops / (flops + rate_flops_s * fixed_s)


def host_floor_s(kernels: float, host_op_s: float, device_s: float) -> float:
    """Seconds a micro-batch takes when the host must issue ``kernels`` kernels at ``host_op_s`` each:
    the longer of the device's time and the host's."""
    return max(device_s, kernels * host_op_s)


def interp_rate(curve: tuple[tuple[float, float], ...], x: float) -> float:
    """A measured rate at ``x`` (FLOPs of a GEMM, bytes of a copy; a CPU profile's curves):
    log-linear between points, flat beyond them."""
    pts = sorted(curve)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, r0), (x1, r1) in itertools.pairwise(pts):
        if x <= x1:
            w = math.log(x / x0) / math.log(x1 / x0)
            return r0 + w * (r1 - r0)
    return pts[-1][1]
