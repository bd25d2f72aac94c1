"""Tests of the field check (``autoslapo.cost.field``): measured FSDP runs that ran must fit, and the
memory and device terms it relies on keep their physical direction."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.config import LOSS_CHUNK_TOKENS, ScheduleConfig
from autoslapo.cost import estimate
from autoslapo.cost.device import PERF
from autoslapo.cost.field import check_all, check_row, load_rows, row_config, row_model
from autoslapo.models.spec import ModelSpec

# MPT-760M's shape (LLM Foundry's mpt-760m.yaml) at sequence 512: the fp32 logits of an eager loss
# dominate its memory at large micro-batches.
MPT_760M = ModelSpec(family="gpt2", hidden=1536, layers=24, heads=12, ffn=6144, seq_len=512, vocab=50368)
A100x8 = ClusterSpec(gpus=8, gpu_type="a100-80gb")


def _fsdp(mb: int, **knobs: object) -> ScheduleConfig:
    base = dict(dp=8, micro_batch=mb, grad_accum=2, zero_stage=3, attn_kernel="flash", fuse_bias_gelu=True,
                precision="bf16", loss_kernel="chunked")
    return ScheduleConfig(**{**base, **knobs})  # type: ignore[arg-type]


@pytest.mark.parametrize("knobs", [{}, {"loss_kernel": "eager"}, {"ckpt_ratio": 1.0},
                                   {"zero_stage": 2}, {"ckpt_ratio": 1.0, "ckpt_granularity": "selective"}])
def test_more_micro_batch_never_less_memory(knobs: dict[str, object]) -> None:
    mems = [estimate(MPT_760M, _fsdp(mb, **knobs), A100x8, dropout=False).memory_per_device_bytes
            for mb in (1, 2, 4, 8, 16, 32, 64, 96, 128)]
    assert mems == sorted(mems)
    assert mems[-1] > mems[0]


@pytest.mark.parametrize("mb", [1, 8, 96])
@pytest.mark.parametrize("ckpt", [0.0, 1.0])
def test_chunked_loss_never_more_memory(mb: int, ckpt: float) -> None:
    chunked = estimate(MPT_760M, _fsdp(mb, ckpt_ratio=ckpt), A100x8, dropout=False)
    eager = estimate(MPT_760M, _fsdp(mb, ckpt_ratio=ckpt, loss_kernel="eager"), A100x8, dropout=False)
    # never more than the eager loss but for its fp32 log-sum-exp a token (``torch.empty(n)`` in
    # ``autoslapo.primitives.loss``, kept for backward), which one chunk covering every token adds
    tokens = mb * MPT_760M.seq_len
    assert chunked.memory_per_device_bytes <= eager.memory_per_device_bytes + 4 * tokens
    if tokens > LOSS_CHUNK_TOKENS:
        assert chunked.memory_per_device_bytes < eager.memory_per_device_bytes


def test_llmfoundry_like_run_that_ran_is_not_refused() -> None:
    # MPT-760M, 8 x A100-80GB, sequence 512, micro-batch 96, FSDP FULL_SHARD, fused loss: it ran
    # (29,446 tokens/s a GPU). With the eager loss's fp32 logits counted it would not fit.
    fused = estimate(MPT_760M, _fsdp(96), A100x8, dropout=False)
    assert fused.fits
    assert not estimate(MPT_760M, _fsdp(96, loss_kernel="eager"), A100x8, dropout=False).fits


def test_row_is_pinned_as_its_knobs() -> None:
    row = next(r for r in load_rows() if r["model"] == "7b" and r["seq_len"] == "65536")
    cfg, model = row_config(row), row_model(row)
    assert (cfg.zero_stage, cfg.ckpt_ratio, cfg.loss_kernel, cfg.attn_kernel) == (3, 1.0, "chunked", "flash")
    assert (cfg.dp, cfg.micro_batch, cfg.tp, cfg.pp) == (8, 1, 1, 1)
    assert (model.hidden, model.layers, model.seq_len, model.vocab) == (4096, 32, 65536, 50368)
    c = check_row(row)
    assert c.measured == 1013.0
    assert c.predicted == pytest.approx(c.estimate.tokens_per_s / 8)


def test_no_llmfoundry_run_is_refused_and_errors_stay_bounded() -> None:
    checks = check_all()
    assert len(checks) == 139
    assert [c.row for c in checks if c.refused] == []
    errs = [c.error for c in checks]
    assert statistics.fmean(abs(e) for e in errs) <= 0.12
    assert abs(statistics.median(errs)) <= 0.08


def test_hopper_reaches_a_lower_fraction_of_peak_than_ampere() -> None:
    assert PERF["h100-80gb"].gemm_eff < PERF["a100-80gb"].gemm_eff
    assert PERF["h200-141gb"].gemm_eff == PERF["h100-80gb"].gemm_eff
    # ... but the device is still faster in absolute terms on the same schedule
    cfg = replace(_fsdp(8), loss_kernel="chunked")
    a100 = estimate(MPT_760M, cfg, A100x8, dropout=False)
    h100 = estimate(MPT_760M, cfg, ClusterSpec(gpus=8, gpu_type="h100-80gb"), dropout=False)
    assert h100.samples_per_s > a100.samples_per_s


def test_blackwell_reaches_less_of_its_peak_than_hopper_but_runs_faster() -> None:
    b200, h100 = PERF["b200-180gb"], PERF["h100-80gb"]
    # MLPerf Training v4.1: 2.0x Hopper a GPU on GPT-3 175B where the dense FP8 peaks differ 2.27x
    assert b200.gemm_eff == pytest.approx(h100.gemm_eff * 2.0 / (4500 / 1979), abs=0.005)
    assert b200.hbm_gbps > PERF["h200-141gb"].hbm_gbps
    # a compute-bound schedule (LLaMA-7B, ZeRO-3 over 8 GPUs, full recomputation): about MLPerf's 2x,
    # less than the peaks' ratio, with the same bytes a device
    llama, cfg = ModelSpec.from_name("llama-7b"), ScheduleConfig(dp=8, micro_batch=2, grad_accum=4, zero_stage=3,
                                                                  attn_kernel="flash", precision="bf16", ckpt_ratio=1.0)
    on_h100 = estimate(llama, cfg, ClusterSpec(gpus=8, gpu_type="h100-80gb"))
    on_b200 = estimate(llama, cfg, ClusterSpec(gpus=8, gpu_type="b200-180gb"))
    assert 1.7 < on_b200.samples_per_s / on_h100.samples_per_s < 2250 / 989
    assert on_b200.memory_per_device_bytes == on_h100.memory_per_device_bytes
    assert on_b200.memory_capacity_bytes > 2 * on_h100.memory_capacity_bytes
