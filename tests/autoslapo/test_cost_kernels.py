"""Tests of the kernel physics (``autoslapo.cost.kernels``) and how the step-time model uses it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost.device import PERF
from autoslapo.cost.kernels import (
    FLASH_FP32_EFF,
    FLASH_SOFTMAX_BWD_OPS,
    FLASH_SOFTMAX_EXPOSED,
    FLASH_SOFTMAX_FWD_OPS,
    flash_softmax_s,
    flash_traffic_bytes,
    gemm_size_efficiency,
    host_floor_s,
    layer_norms_and_rotary,
    norm_traffic,
    rotary_traffic,
)
from autoslapo.cost.time import estimate_time
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec

A100 = ClusterSpec(gpus=8, gpu_type="a100-80gb")


def _gpt(seq: int, hidden: int = 2048, heads: int = 16) -> ModelSpec:
    return ModelSpec(family="gpt2", hidden=hidden, layers=8, heads=heads, ffn=4 * hidden, seq_len=seq,
                     vocab=50368, max_positions=max(seq, 1024))


def test_flash_traffic_is_linear_in_sequence_not_quadratic() -> None:
    a = flash_traffic_bytes(4096, 4096, 128, 16, 2)
    b = flash_traffic_bytes(8192, 8192, 128, 16, 2)
    assert b == pytest.approx(2 * a)
    assert flash_traffic_bytes(4096, 4096, 128, 16, 2, backward=True) == pytest.approx(2 * a)


def test_flash_softmax_scales_with_scores_and_both_unit_rates() -> None:
    one = flash_softmax_s(1e9, 19.5, 2.44)
    assert flash_softmax_s(2e9, 19.5, 2.44) == pytest.approx(2 * one)
    assert flash_softmax_s(1e9, 39.0, 4.88) == pytest.approx(one / 2)
    # the FP32 operations a lane's cycle each (an FMA is two FLOPs of the peak), the exponential an SFU result
    fp32_part = FLASH_SOFTMAX_FWD_OPS / (19.5e12 / 2)
    assert one == pytest.approx(FLASH_SOFTMAX_EXPOSED * 1e9 * (fp32_part + 1 / 2.44e12) / FLASH_FP32_EFF)
    bwd = flash_softmax_s(1e9, 19.5, 2.44, backward=True)
    assert bwd == pytest.approx(one * (FLASH_SOFTMAX_BWD_OPS / 9.75e12 + 1 / 2.44e12)
                                / (FLASH_SOFTMAX_FWD_OPS / 9.75e12 + 1 / 2.44e12))
    assert flash_softmax_s(0, 19.5, 2.44) == 0.0
    for fp32, sfu in ((0.0, 2.44), (19.5, 0.0)):
        with pytest.raises(ValueError, match="fp32_tflops and sfu_tops must be > 0"):
            flash_softmax_s(1e9, fp32, sfu)


def test_hoppers_exponentials_are_slower_against_its_fp32_units_than_amperes() -> None:
    from autoslapo.cluster import DEVICES

    a100, h100 = DEVICES["a100-80gb"], DEVICES["h100-80gb"]
    # 16 SFU results a clock an SM against 64 FP32 lanes (A100) and 128 (H100): a quarter, an eighth
    assert a100.peak_tflops_fp32 / 2 / a100.sfu_tops == pytest.approx(4, rel=0.01)
    assert h100.peak_tflops_fp32 / 2 / h100.sfu_tops == pytest.approx(8.6, rel=0.01)
    assert h100.peak_tflops / h100.sfu_tops > 1.9 * a100.peak_tflops / a100.sfu_tops
    assert all(d.sfu_tops > 0 for d in DEVICES.values() if d.flash_attention)


def test_gemm_size_efficiency_saturates() -> None:
    rate, fixed = 250e12, 3e-6
    sizes = [1e6, 1e8, rate * fixed, 1e10, 1e12, 1e14]
    effs = [gemm_size_efficiency(f, rate, fixed) for f in sizes]
    assert effs == sorted(effs)
    assert effs[2] == pytest.approx(0.5)
    assert effs[0] < 0.01 and effs[-1] > 0.999
    assert gemm_size_efficiency(1e6, rate, 0.0) == 1.0


def test_host_floor_is_the_longer_of_host_and_device() -> None:
    assert host_floor_s(100, 10e-6, 5e-3) == 5e-3
    assert host_floor_s(1000, 10e-6, 5e-3) == pytest.approx(1e-2)


def test_long_sequences_cost_more_per_token_with_flash() -> None:
    """Attention grows with s^2: tokens/s falls as the sequence grows at a fixed number of tokens."""
    times = []
    for seq in (2048, 8192, 32768):
        cfg = ScheduleConfig(dp=8, micro_batch=65536 // seq, attn_kernel="flash", precision="bf16")
        times.append(estimate_time(_gpt(seq), cfg, A100, PERF["a100-80gb"], dropout=False).compute)
    assert times[0] < times[1] < times[2]


def test_flash_attention_is_not_bound_by_score_traffic() -> None:
    """A fused kernel's time barely depends on HBM bandwidth (scores stay on chip): a 64-wide head's
    attention on a long sequence takes about as long on a 1555 GB/s part as on a 2039 GB/s one."""
    cfg = ScheduleConfig(dp=8, micro_batch=1, attn_kernel="flash", precision="bf16")
    model = _gpt(32768, hidden=1024, heads=16)  # head_dim 64
    slow = estimate_time(model, cfg, ClusterSpec(gpus=8, gpu_type="a100-40gb"), PERF["a100-40gb"], dropout=False)
    fast = estimate_time(model, cfg, A100, PERF["a100-80gb"], dropout=False)
    assert slow.compute / fast.compute < 1.1


def test_a_short_head_slows_only_the_flash_products_that_sum_over_it() -> None:
    """``Q K^T`` sums over the head width, ``P V`` over a tile of keys (Dao 2023, algorithm 1): the
    tensor-core time a FLOP of a 64-wide head's forward is the mean of the two inner dimensions'
    rates, not all of it at the head width's; backward's penalty is two products of five."""
    from autoslapo.cost.time import _Rates

    perf = replace(PERF["a100-80gb"], op_latency_s=0.0)
    r = _Rates(perf, A100, ScheduleConfig(dp=8, attn_kernel="flash", precision="bf16"))
    s, batch = 16384, 432  # whole waves: 128 query tiles x 432 problems over 108 SMs

    def per_flop(d: int, backward: bool = False, products_only: bool = True) -> float:
        t = r.flash(s, d, batch, 1.0, 1.0, backward)
        if products_only:
            t -= flash_softmax_s(s * s * batch, r.fp32_tflops, r.sfu_tops, backward)
        return t / (4.0 * s * s * batch * d * (2.5 if backward else 1.0))

    def slow(k: int) -> float:  # seconds a FLOP over a full-rate GEMM's, inner dimension k
        return (k + perf.k_half) / k

    assert perf.tile == 128
    assert per_flop(64) / per_flop(128) == pytest.approx((slow(64) + slow(128)) / 2 / slow(128), rel=1e-9)
    assert per_flop(64, True) / per_flop(128, True) == pytest.approx((2 * slow(64) + 3 * slow(128)) / 5 / slow(128),
                                                                     rel=1e-9)
    assert per_flop(64) / per_flop(128) < slow(64) / slow(128)
    # the softmax's time a score is the same for both widths: with it a 64-wide head pays more a FLOP still
    assert per_flop(64, products_only=False) / per_flop(128, products_only=False) > per_flop(64) / per_flop(128)


def test_slower_fp32_units_slow_flash_attention() -> None:
    cfg = ScheduleConfig(dp=8, micro_batch=1, attn_kernel="flash", precision="bf16")
    model = _gpt(16384)
    weak = ClusterSpec(gpus=8, gpu_type="a100-80gb", peak_tflops_fp32=9.75)
    base = estimate_time(model, cfg, A100, PERF["a100-80gb"], dropout=False)
    slow = estimate_time(model, cfg, weak, PERF["a100-80gb"], dropout=False)
    assert slow.compute > base.compute


def test_fixed_gemm_cost_hits_small_micro_batches_at_high_tp_hardest() -> None:
    """Per token, the per-GEMM fixed cost weighs most where GEMMs are smallest (tp 8, micro-batch 1)."""
    model = _gpt(2048, hidden=4096, heads=32)
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    no_fixed = replace(PERF["a100-80gb"], gemm_fixed_s=0.0)

    def slowdown(mb: int) -> float:
        cfg = ScheduleConfig(tp=8, micro_batch=mb, grad_accum=16 // mb, precision="fp16", attn_kernel="eager")
        return (estimate_time(model, cfg, cluster, PERF["a100-80gb"]).total
                / estimate_time(model, cfg, cluster, no_fixed).total)

    assert slowdown(1) > slowdown(16) > 1.0


def test_host_issue_rate_floors_tiny_layers_only() -> None:
    """A slow host (1 ms a kernel) dominates a tiny model's step; a large model's kernels outlast it."""
    slow_host = replace(PERF["a100-80gb"], host_op_s=1e-3)
    tiny = ModelSpec(family="gpt2", hidden=128, layers=2, heads=2, ffn=512, seq_len=128, vocab=1024)
    cfg = ScheduleConfig(dp=8, micro_batch=1, precision="bf16")
    base = estimate_time(tiny, cfg, A100, PERF["a100-80gb"])
    slow = estimate_time(tiny, cfg, A100, slow_host)
    assert slow.total > 3 * base.total
    big = _gpt(2048, hidden=8192, heads=64)
    cfg = ScheduleConfig(dp=8, micro_batch=4, precision="bf16", attn_kernel="flash")
    assert estimate_time(big, cfg, A100, replace(PERF["a100-80gb"], host_op_s=20e-6)).total == pytest.approx(
        estimate_time(big, cfg, A100, replace(PERF["a100-80gb"], host_op_s=0.0)).total)


def test_pipeline_sends_cross_nodes_and_scale_with_micro_batches() -> None:
    """What the model charges a pipeline: per micro-batch p2p in every slot (m + p - 1 of them), at
    the network's bandwidth once the stages sit on different nodes (Megatron places stages tp x dp
    ranks apart)."""
    model = _gpt(2048, hidden=8192, heads=64)
    perf = PERF["a100-80gb"]
    one_node = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    many = ClusterSpec(gpus=32, gpu_type="a100-80gb")
    within = ScheduleConfig(tp=2, pp=4, micro_batch=1, grad_accum=8, precision="fp16", attn_kernel="eager")
    across = ScheduleConfig(tp=2, pp=4, dp=4, micro_batch=1, grad_accum=8, precision="fp16", attn_kernel="eager")
    assert estimate_time(model, across, many, perf).pp_comm > 5 * estimate_time(model, within, one_node, perf).pp_comm
    fewer = replace(across, grad_accum=4)
    t8, t4 = estimate_time(model, across, many, perf), estimate_time(model, fewer, many, perf)
    assert t8.pp_comm / t4.pp_comm == pytest.approx((8 + 3) / (4 + 3))
    assert t8.bubble == pytest.approx(t4.bubble)


def test_an_eager_rmsnorm_moves_its_eight_ops_bytes_and_a_layernorm_one_pass() -> None:
    """transformers' RMSNorm in 16-bit: cast 2+4, square 4+4, mean 4, product 4+4, cast 4+2, weight 2+2."""
    assert norm_traffic("llama", 2, fused=False) == (36.0, 8)
    assert norm_traffic("t5", 4, fused=False) == (28.0, 6)  # fp32: the casts return their input
    assert norm_traffic("llama", 2, fused=True) == (4.0, 1)
    assert norm_traffic("gpt2", 2, fused=False) == (4.0, 1)  # torch's LayerNorm kernel
    assert rotary_traffic(2, fused=False) == (24.0, 5) and rotary_traffic(2, fused=True) == (4.0, 1)
    norms, rope, extra = layer_norms_and_rotary("llama", 2, False, 4096, 1024)
    assert (norms, rope, extra) == (2 * 36 * 4096, 24 * (4096 + 1024), 2 * 7 + 2 * 5)
    assert layer_norms_and_rotary("llama", 2, False, 4096, 1024, "fused")[0] == 2 * 4 * 4096
    assert layer_norms_and_rotary("gpt2", 2, False, 4096, 4096) == (2 * 4 * 4096, 0.0, 0)


def test_an_eager_llama_layer_is_slower_than_fused_norms_and_compiled_layers_on_h100() -> None:
    """The eager norms and rotary positions are a larger share of a layer on an H100 than on an A100
    (more FLOPs a byte of bandwidth); a GPT-2 layer (LayerNorm, learned positions) has neither."""
    llama = ModelSpec(family="llama", hidden=4096, layers=8, heads=32, kv_heads=8, ffn=14336, seq_len=8192,
                      vocab=128256, max_positions=8192)
    cfg = ScheduleConfig(dp=8, micro_batch=1)
    share = {}
    for gpu in ("a100-80gb", "h100-80gb"):
        cluster = ClusterSpec(gpus=8, gpu_type=gpu)
        eager = estimate_time(llama, cfg, cluster, PERF[gpu]).compute
        fused_norm = estimate_time(llama, replace(cfg, norm_kernel="fused"), cluster, PERF[gpu]).compute
        compiled = estimate_time(llama, replace(cfg, compile_layers=True), cluster, PERF[gpu]).compute
        assert eager > fused_norm > compiled
        share[gpu] = 1 - compiled / eager
    assert share["h100-80gb"] > share["a100-80gb"] > 0.05
    gpt = _gpt(2048)
    with pytest.raises(ConfigError, match="norm_kernel applies to the llama, t5 families only"):
        replace(cfg, norm_kernel="fused").validate(gpt)
