"""Tests of the cost model: FLOP counts, memory terms, time terms, search, published runs."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import best_config, estimate, sweep
from autoslapo.cost.device import PERF
from autoslapo.cost.flops import megatron_flops_per_iteration, model_flops_per_sample
from autoslapo.cost.memory import (
    checkpointed_layer_ids,
    estimate_activation_bytes,
    estimate_state_bytes,
    stage_params,
)
from autoslapo.cost.published import check_all
from autoslapo.cost.search import best_configs, candidate_configs
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult

GPT = ModelSpec(family="gpt2", hidden=2304, layers=24, heads=24, ffn=4 * 2304, seq_len=2048, vocab=51200)
A100x8 = ClusterSpec(gpus=8, gpu_type="a100-80gb")


def test_pure_modules_import_nothing_heavy() -> None:
    code = (
        "import sys; import autoslapo.cost, autoslapo.cost.published, autoslapo.cost.field, autoslapo.cli.estimate, "
        "autoslapo.cli.profile, autoslapo.cost.profile; "
        "bad = [m for m in ('torch', 'ray', 'sqlalchemy', 'subprocess') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("h,L,s,V", [(2304, 24, 2048, 51200), (12288, 96, 2048, 51200), (1024, 24, 512, 50257)])
def test_flops_match_megatron_closed_form(recompute: bool, h: int, L: int, s: int, V: int) -> None:
    m = ModelSpec(family="gpt2", hidden=h, layers=L, heads=h // 128 if h % 128 == 0 else 16, ffn=4 * h,
                  seq_len=s, vocab=V)
    cfg = ScheduleConfig(ckpt_ratio=1.0 if recompute else 0.0)
    from autoslapo.cost.flops import hw_flops_per_sample

    ours = hw_flops_per_sample(m, cfg) if recompute else model_flops_per_sample(m)
    assert ours == pytest.approx(megatron_flops_per_iteration(1, s, L, h, V, recompute), rel=1e-9)


def test_state_bytes_zero_partitioning() -> None:
    m = ModelSpec.from_name("gpt2-xl")
    base = ScheduleConfig(dp=8)
    w0, g0, o0 = estimate_state_bytes(m, base)
    assert (w0, g0, o0) == pytest.approx((2 * m.num_params(), 2 * m.num_params(), 12 * m.num_params()), rel=0.01)
    w1, g1, o1 = estimate_state_bytes(m, base.with_(zero_stage=1))
    assert (w1, g1) == (w0, g0) and o1 == pytest.approx(o0 / 8, rel=1e-6)
    w3, g3, _o3 = estimate_state_bytes(m, base.with_(zero_stage=3))
    assert w3 == pytest.approx(w0 / 8, rel=1e-6) and g3 == pytest.approx(g0 / 8, rel=1e-6)


def test_activation_memory_matches_korthikanti() -> None:
    # one layer, 16-bit, no TP: s b h (34 + 5 a s / h); with full recompute 2 s b h
    m = ModelSpec(family="gpt2", hidden=1024, layers=1, heads=16, ffn=4096, seq_len=512, vocab=8)
    cfg = ScheduleConfig(attn_kernel="eager", precision="fp16", micro_batch=2, fuse_bias_gelu=True)
    s, b, h, a = 512, 2, 1024, 16
    logits_and_emb = s * b * 8 * 6 + s * b * h * 3
    assert estimate_activation_bytes(m, cfg) == pytest.approx(s * b * h * (34 + 5 * a * s / h) + logits_and_emb, rel=1e-6)
    tp = ScheduleConfig(attn_kernel="eager", precision="fp16", micro_batch=2, tp=4, fuse_bias_gelu=True)
    expect = s * b * h * (10 + 24 / 4 + 5 * a * s / (h * 4)) + s * b * 8 / 4 * 6 + s * b * h * 3
    assert estimate_activation_bytes(m, tp) == pytest.approx(expect, rel=1e-6)
    sp = tp.with_(sequence_parallel=True)
    expect_sp = s * b * h * (34 / 4 + 5 * a * s / (h * 4)) + s * b * 8 / 4 * 6 + s * b * h * 3
    assert estimate_activation_bytes(m, sp) == pytest.approx(expect_sp, rel=1e-6)


degrees = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=60, deadline=None)
@given(tp=degrees, mb=st.sampled_from([1, 2, 8]), zero=st.sampled_from([0, 1, 2, 3]), dp=degrees)
def test_more_tp_never_raises_parameter_bytes(tp: int, mb: int, zero: int, dp: int) -> None:
    m = ModelSpec.from_name("gpt2-xl", heads=32, hidden=2048, ffn=8192)
    a = ScheduleConfig(tp=tp, dp=dp, micro_batch=mb, zero_stage=zero)
    b = a.with_(tp=tp * 2)
    assert estimate_state_bytes(m, b)[0] <= estimate_state_bytes(m, a)[0]
    assert sum(estimate_state_bytes(m, b)) <= sum(estimate_state_bytes(m, a))


@settings(max_examples=60, deadline=None)
@given(r1=st.floats(0, 1), r2=st.floats(0, 1), tp=degrees, pp=st.sampled_from([1, 2, 4]),
       attn=st.sampled_from(["eager", "sdpa"]), placement=st.sampled_from(["front", "back", "spread"]))
def test_higher_ckpt_ratio_never_raises_activations(r1: float, r2: float, tp: int, pp: int, attn: str,
                                                    placement: str) -> None:
    lo, hi = sorted((r1, r2))
    m = ModelSpec.from_name("gpt2-medium")
    base = ScheduleConfig(tp=tp, pp=pp, grad_accum=8, micro_batch=2, attn_kernel=attn, ckpt_placement=placement)  # type: ignore[arg-type]
    assert estimate_activation_bytes(m, base.with_(ckpt_ratio=hi)) <= estimate_activation_bytes(m, base.with_(ckpt_ratio=lo))


@settings(max_examples=40, deadline=None)
@given(dp=st.sampled_from([1, 2, 8, 64]), prec=st.sampled_from(["fp32", "bf16"]))
def test_zero_stage_monotone(dp: int, prec: str) -> None:
    m = ModelSpec.from_name("llama-7b")
    totals = [sum(estimate_state_bytes(m, ScheduleConfig(dp=dp, zero_stage=z, precision=prec))) for z in range(4)]  # type: ignore[arg-type]
    if dp == 1 and prec == "fp32":
        # DeepSpeed's ZeRO optimizer clones an fp32 partition of the weights: with nothing to
        # partition over, ZeRO >= 1 costs 4 bytes a parameter more than plain fp32 Adam.
        assert totals[1] == totals[0] + 4 * max(stage_params(m, ScheduleConfig()))
        totals = totals[1:]
    assert totals == sorted(totals, reverse=True)
    if dp > 1:
        assert totals[-1] < totals[0]


@settings(max_examples=40, deadline=None)
@given(mb=st.sampled_from([1, 2, 4, 8, 16]), tp=st.sampled_from([1, 2, 4, 8]))
def test_estimate_is_positive_and_consistent(mb: int, tp: int) -> None:
    cfg = ScheduleConfig(tp=tp, dp=8 // tp, micro_batch=mb)
    e = estimate(GPT, cfg, A100x8)
    assert e.samples_per_s > 0 and e.step_time_s > 0
    assert e.tokens_per_s == pytest.approx(e.samples_per_s * GPT.seq_len)
    assert e.samples_per_s == pytest.approx(cfg.global_batch / e.step_time_s)
    assert e.hw_tflops_per_device >= e.tflops_per_device
    assert e.hw_tflops_per_device < A100x8.peak_tflops
    assert e.memory_per_device_bytes == e.memory.total


def test_recompute_slows_and_flash_saves_memory() -> None:
    cfg = ScheduleConfig(dp=8, micro_batch=4, attn_kernel="eager")
    plain = estimate(GPT, cfg, A100x8)
    rec = estimate(GPT, cfg.with_(ckpt_ratio=1.0), A100x8)
    assert rec.step_time_s > plain.step_time_s and rec.memory_per_device_bytes < plain.memory_per_device_bytes
    assert rec.tflops_per_device < rec.hw_tflops_per_device
    flash = estimate(GPT, cfg.with_(attn_kernel="flash"), A100x8)
    assert flash.memory_per_device_bytes < plain.memory_per_device_bytes
    assert flash.step_time_s < plain.step_time_s


def test_cross_node_dp_is_slower_than_within_node() -> None:
    m = ModelSpec.from_name("gpt2-xl")
    one = estimate(m, ScheduleConfig(dp=8, micro_batch=1, precision="fp16"), ClusterSpec(gpus=8, gpu_type="v100-32gb"))
    two = estimate(m, ScheduleConfig(dp=16, micro_batch=1, precision="fp16"), ClusterSpec(gpus=16, gpu_type="v100-32gb"))
    assert two.time.dp_comm > 5 * one.time.dp_comm


def test_to_trial_result_and_dict() -> None:
    e = estimate(GPT, ScheduleConfig(dp=8, micro_batch=2), A100x8)
    r = e.to_trial_result()
    assert isinstance(r, TrialResult) and r.measured is False and r.status == "complete"
    assert r.samples_per_s == e.samples_per_s and r.peak_memory_bytes == e.memory_per_device_bytes
    d = e.to_dict()
    for k in ("samples_per_s", "tokens_per_s", "tflops_per_device", "hw_tflops_per_device",
              "memory_per_device_bytes", "fits", "config"):
        assert k in d
    assert ScheduleConfig.from_dict(d["config"]) == e.config
    big = estimate(ModelSpec.from_name("llama-70b"), ScheduleConfig(dp=8), A100x8)
    assert not big.fits and big.to_trial_result().status == "oom"


def test_invalid_config_raises() -> None:
    with pytest.raises(ConfigError):
        estimate(GPT, ScheduleConfig(dp=4), A100x8)  # world 4 on 8 GPUs
    with pytest.raises(ConfigError):
        estimate(GPT, ScheduleConfig(tp=16, dp=1), ClusterSpec(gpus=16, gpu_type="a100-80gb"))


def test_best_config_respects_fixed_knobs_and_fits() -> None:
    m = ModelSpec.from_name("gpt2-large")
    c = ClusterSpec(gpus=16, gpu_type="v100-32gb")
    e = best_config(m, c, tp=2, global_batch=64)
    assert e.config.tp == 2 and e.config.global_batch == 64 and e.fits
    every = [cfg for g in candidate_configs(m, c, tp=2, global_batch=64) for cfg in g]
    ests = [x for x in sweep(m, c, every) if x.fits]
    assert e.samples_per_s == pytest.approx(max(x.samples_per_s for x in ests))
    with pytest.raises(ConfigError, match="fits in memory"):
        best_config(ModelSpec.from_name("llama-70b"), ClusterSpec(gpus=1, gpu_type="v100-16gb"))
    with pytest.raises(ConfigError, match="unknown knobs"):
        best_config(m, c, tpp=2)


def test_the_top_schedules_are_distinct_schedules_not_ratios_that_checkpoint_the_same_blocks() -> None:
    # bert-tiny in two stages has one block a chunk: ratio 0.25 checkpoints none of it (as 0) and
    # 0.75 all of it (as 1), and with no block checkpointed granularity and placement act on nothing
    m = ModelSpec.from_name("bert-tiny")
    c = ClusterSpec(gpus=4, gpu_type="a100-80gb")
    top = best_configs(m, c, 40, tp=1, pp=2)
    ratios = {e.config.ckpt_ratio for e in top}
    assert ratios <= {0.0, 1.0} and ratios == {0.0, 1.0}, ratios
    assert all(e.config.ckpt_granularity == "full" and e.config.ckpt_placement == "front"
               for e in top if e.config.ckpt_ratio == 0.0)
    runs = [(replace(e.config, ckpt_ratio=0.0, ckpt_placement="front"), frozenset(checkpointed_layer_ids(m, e.config)))
            for e in top]
    assert len(set(runs)) == len(runs)  # no two of them run the same way


def test_cpu_profile_changes_estimate() -> None:
    m = ModelSpec.from_name("bert-tiny")
    c = ClusterSpec(gpus=2, gpu_type="cpu", gpus_per_node=2)
    cfg = ScheduleConfig(dp=2, micro_batch=4, precision="fp32")
    base = estimate(m, cfg, c)
    prof = {"gpu_type": "cpu", "peak_tflops_fp32": 0.01, "peak_tflops": 0.01, "hbm_gbps": 2.0,
            "gemm_curve": [[1e6, 0.005], [1e9, 0.01]], "op_latency_s": 5e-5, "fixed_overhead_bytes": 3 * 2**28}
    slow = estimate(m, cfg, c.with_profile(prof), profile=prof)
    assert slow.step_time_s > base.step_time_s
    assert slow.memory.overhead == 3 * 2**28


def test_gpu_presets_have_perf() -> None:
    from autoslapo.cluster import DEVICES

    assert set(DEVICES) == set(PERF)


def test_published_table_targets() -> None:
    checks = check_all()
    errs = [abs(c.error) for c in checks]
    assert len(checks) >= 11
    assert sum(errs) / len(errs) <= 0.15
    assert max(errs) <= 0.30
    for c in checks:
        assert c.estimate.fits


def test_bert_64_a100_done_criterion() -> None:
    m = ModelSpec.from_name("bert", seq_len=128)
    e = best_config(m, ClusterSpec(gpus=64, gpu_type="a100-80gb"), tp=1, pp=1, dp=64)
    assert abs(e.samples_per_s / 35774 - 1) <= 0.30


def test_estimate_is_fast() -> None:
    import time

    cfg = ScheduleConfig(tp=2, pp=2, dp=2, micro_batch=2, grad_accum=8, ckpt_ratio=0.5)
    perf = PERF["a100-80gb"]
    estimate(GPT, cfg, A100x8, perf=perf)
    n, t0 = 2000, time.perf_counter()
    for _ in range(n):
        estimate(GPT, cfg, A100x8, perf=perf, validate=False)
    assert (time.perf_counter() - t0) / n < 1e-3


def test_activation_function_storage_by_family() -> None:
    from autoslapo.cost.memory import mlp_saved_elements

    cfg = ScheduleConfig()
    assert mlp_saved_elements(ModelSpec.from_name("gpt2"), cfg) == 5
    assert mlp_saved_elements(ModelSpec.from_name("gpt2"), cfg.with_(fuse_bias_gelu=True)) == 2
    assert mlp_saved_elements(ModelSpec.from_name("bert"), cfg) == 2
    assert mlp_saved_elements(ModelSpec.from_name("opt"), cfg) == 1
    assert mlp_saved_elements(ModelSpec.from_name("llama"), cfg) == 4
    # Megatron's fused SwiGLU keeps gate and up, not the activation; the CPU runtime's compiled layer keeps all
    assert mlp_saved_elements(ModelSpec.from_name("llama"), cfg.with_(compile_layers=True)) == 3
    assert mlp_saved_elements(ModelSpec.from_name("llama"), cfg.with_(compile_layers=True), "autoslapo") == 4
    m = ModelSpec.from_name("gpt2-medium")
    assert estimate_activation_bytes(m, cfg.with_(fuse_bias_gelu=True)) < estimate_activation_bytes(m, cfg)
    assert estimate_activation_bytes(m, cfg, dropout=False) < estimate_activation_bytes(m, cfg, dropout=True)


def test_heap_retention_charges_a_checkpointed_step_for_its_full_activations() -> None:
    """On a CPU profile with heap retention, checkpointing lowers the live term only: the allocator
    keeps what every layer's full activations occupied (``DevicePerf.heap_retention``)."""
    from dataclasses import replace

    from autoslapo.cost.memory import estimate_memory

    spec = ModelSpec(family="gpt2", hidden=256, layers=4, heads=4, ffn=1024, seq_len=128, vocab=2048)
    plain = ScheduleConfig(dp=2, micro_batch=8, precision="fp32")
    ckpt = ScheduleConfig(dp=2, micro_batch=8, ckpt_ratio=1.0, precision="fp32")
    perf = replace(PERF["cpu"], activation_slack=0.8, heap_retention=0.6)
    full = estimate_activation_bytes(spec, plain, runtime="autoslapo", transients=True)
    live = estimate_activation_bytes(spec, ckpt, runtime="autoslapo", transients=True)
    assert live < full
    assert estimate_memory(spec, plain, perf).activations == int(full * 0.8) + int(full * 0.6)
    assert estimate_memory(spec, ckpt, perf).activations == int(live * 0.8) + int(full * 0.6)
    # without retention (every GPU preset) the checkpointed step is charged its live bytes only
    assert estimate_memory(spec, ckpt, replace(perf, heap_retention=0.0)).activations == int(live * 0.8)
    assert all(p.heap_retention == 0.0 for name, p in PERF.items() if name != "cpu")
    # a measured profile carries the figure
    cpu = ClusterSpec(gpus=2, gpu_type="cpu", gpus_per_node=2)
    a = estimate(spec, ckpt, cpu.with_profile({"heap_retention": 0.0}), profile={"heap_retention": 0.0})
    b = estimate(spec, ckpt, cpu.with_profile({"heap_retention": 0.6}), profile={"heap_retention": 0.6})
    assert b.memory_per_device_bytes > a.memory_per_device_bytes
