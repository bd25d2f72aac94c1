"""Cost terms of WideResNet checked against what PyTorch counts and keeps on CPU for the tiny preset
(FLOPs with ``FlopCounterMode``, saved activations with ``saved_tensors_hooks`` through the real
schedule), and against the published model (parameters, ~11.4 GMACs per 224x224 image)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import best_config, estimate
from autoslapo.cost.conv import estimate_conv_activation_bytes
from autoslapo.cost.flops import conv_forward_flops, hw_flops_per_sample, model_flops_per_sample
from autoslapo.cost.memory import stage_params
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import ModelSpec
from autoslapo.plan import apply_schedule
from tests.autoslapo.saved import saved_activation_bytes

TINY = ModelSpec.from_name("wideresnet-tiny")
WRN50_2 = ModelSpec.from_name("wideresnet-50-2")


def _saved_activation_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd keeps for backward, parameters and buffers left out."""
    return saved_activation_bytes(model, batch)[0]


def test_forward_flops_are_what_pytorch_counts() -> None:
    batch = example_batch(TINY, 2, seed=1)
    model = build_model(TINY)
    with FlopCounterMode(display=False) as counter:
        model(**batch)
    assert counter.get_total_flops() == 2 * conv_forward_flops(TINY)


def test_wide_resnet50_2_flops_are_published() -> None:
    # torchvision's model card: 11.4 GFLOPS (multiply-adds) per 224x224 image
    assert conv_forward_flops(WRN50_2) / 2 == pytest.approx(11.4e9, rel=0.01)
    assert model_flops_per_sample(WRN50_2) == 3 * conv_forward_flops(WRN50_2)
    all_ckpt = ScheduleConfig(ckpt_ratio=1.0)
    # full recomputation runs every block's forward again (not the stem or the classifier)
    assert model_flops_per_sample(WRN50_2) < hw_flops_per_sample(WRN50_2, all_ckpt) < 4 / 3 * model_flops_per_sample(WRN50_2)


@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0])
def test_saved_activations_are_what_the_schedule_keeps(ratio: float) -> None:
    config = ScheduleConfig(precision="fp32", micro_batch=2, ckpt_ratio=ratio)
    model = build_model(TINY)
    apply_schedule(model, TINY, config)
    got = _saved_activation_bytes(model, example_batch(TINY, 2, seed=1))
    # measured: 0.987, 0.981, 1.016 of what PyTorch keeps (BatchNorm's per-channel statistics and the
    # classifier's small tensors are left out of the model)
    assert estimate_conv_activation_bytes(TINY, config) == pytest.approx(got, rel=0.05)


def test_tp_splits_bottleneck_parameters_and_activations() -> None:
    one, two = ScheduleConfig(micro_batch=8), ScheduleConfig(tp=2, micro_batch=8)
    assert stage_params(WRN50_2, one)[0] == WRN50_2.num_params()
    assert WRN50_2.num_params() / 2 < stage_params(WRN50_2, two)[0] < WRN50_2.num_params()
    assert estimate_conv_activation_bytes(WRN50_2, two) < estimate_conv_activation_bytes(WRN50_2, one)


def test_estimate_on_8_gpus() -> None:
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    est = estimate(WRN50_2, ScheduleConfig(dp=8, micro_batch=64), cluster)
    assert est.fits and est.samples_per_s > 0
    assert est.time.pp_comm == 0 and est.time.dp_comm > 0
    slower = estimate(WRN50_2, ScheduleConfig(dp=8, micro_batch=64, ckpt_ratio=1.0), cluster)
    assert slower.step_time_s > est.step_time_s
    assert slower.memory.activations < est.memory.activations
    best = best_config(WRN50_2, cluster, global_batch=512)
    assert best.config.pp == 1 and best.config.attn_kernel == "sdpa" and not best.config.sequence_parallel


def test_estimate_command_reports_torchvisions_parameter_count(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from autoslapo.cli import main

    assert main(["estimate", "wideresnet-50-2", "--gpus", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_params"] == 68_883_240 and d["model"]["family"] == "wideresnet"
    assert d["config"]["pp"] == 1 and d["samples_per_s"] > 0 and d["fits"]


def test_pipeline_stages_price_weights_bubble_and_the_cut_feature_maps() -> None:
    from autoslapo.cost import device_perf
    from autoslapo.cost.conv import estimate_conv_time
    from autoslapo.models.wrn_shape import block_convs, wrn_rank_params

    spec = ModelSpec.from_name("wideresnet-50-2")
    cluster = ClusterSpec(gpus=8, gpu_type="a100-80gb")
    perf = device_perf(cluster)
    m, b = 8, 32
    cfg = {pp: ScheduleConfig(pp=pp, dp=8 // pp, micro_batch=b, grad_accum=m) for pp in (1, 2, 4)}
    # every parameter on exactly one rank; the most loaded rank holds fewer as pp grows
    for pp in (1, 2, 4):
        ranks = wrn_rank_params(spec.hidden, spec.ffn, spec.layers, spec.vocab, pp=pp, chunks=pp)
        assert sum(ranks) == spec.num_params()
    assert max(stage_params(spec, cfg[4])) < max(stage_params(spec, cfg[2])) < max(stage_params(spec, cfg[1]))
    one, two = estimate_conv_time(spec, cfg[1], cluster, perf), estimate_conv_time(spec, cfg[2], cluster, perf)
    assert one.bubble == one.pp_comm == 0 and two.bubble > 0 and two.compute < one.compute
    # pp=2 cuts after block 7 (of [3, 4, 6, 3]): the third group's first block, 1024 x 14 x 14 a image,
    # sent and its gradient received each micro-batch (and the bubble's slot) at 300 GB/s at best
    out = block_convs(spec.hidden, spec.ffn, spec.layers, spec.seq_len)[7][2]
    assert (out.cout, out.out_side) == (1024, 14)
    at_cut = (m + 1) * 2 * b * out.cout * out.out_side**2 * 2 / 300e9
    assert at_cut < two.pp_comm < 2 * at_cut  # not the first group's 256 x 56 x 56 maps (4x as large)
    # 1F1B: the first rank holds two micro-batches of the activation-heavy early blocks
    ones = estimate_conv_activation_bytes(spec, cfg[1])
    assert estimate_conv_activation_bytes(spec, cfg[2]) > ones
    assert estimate_conv_activation_bytes(spec, ScheduleConfig(pp=2, dp=4, micro_batch=b, grad_accum=m,
                                                               pipeline_schedule="gpipe")) > 4 * ones


def test_fp32_convolutions_run_on_tf32_where_the_device_has_it_and_matmuls_do_not() -> None:
    """PyTorch's cuDNN convolutions use TF32 tensor cores for fp32 tensors by default on Ampere and
    later (half the 16-bit peak); V100 has none; a transformer's fp32 matmuls keep the fp32 peak."""
    from autoslapo.cost import device_perf
    from autoslapo.cost.conv import convolution_cluster
    from autoslapo.cost.time import _Rates

    fp32 = ScheduleConfig(precision="fp32")
    for gpu, conv_peak in (("a100-80gb", 156.0), ("h100-80gb", 494.5), ("v100-16gb", 15.7)):
        cluster = ClusterSpec(gpus=1, gpu_type=gpu)
        perf = device_perf(cluster)
        conv = _Rates(perf, convolution_cluster(cluster, fp32), fp32)
        assert conv.flops_s == pytest.approx(conv_peak * 1e12 * perf.gemm_eff)
        assert _Rates(perf, cluster, fp32).flops_s == pytest.approx(cluster.peak_tflops_fp32 * 1e12 * perf.gemm_eff)
        assert convolution_cluster(cluster, ScheduleConfig(precision="bf16")) == cluster
    a100 = ClusterSpec(gpus=1, gpu_type="a100-80gb")
    fast = estimate(WRN50_2, ScheduleConfig(micro_batch=64, precision="fp32"), a100)
    half = estimate(WRN50_2, ScheduleConfig(micro_batch=64, precision="bf16"), a100)
    # TF32 at half the 16-bit rate, and fp32's elementwise traffic twice the bytes: slower, not 16x slower
    assert 1.2 < fast.step_time_s / half.step_time_s < 3.0


def test_nchw_feature_maps_are_transposed_around_tensor_core_convolutions_only() -> None:
    """cuDNN's tensor-core convolutions (16-bit, TF32) read and write NHWC: on NCHW feature maps
    each one's input and output are transposed (a read and a write each, in forward; twice that in
    backward). channels_last removes them; fp32 on a V100's CUDA cores and a CPU have none to remove."""
    from autoslapo.cost import device_perf
    from autoslapo.cost.conv import nchw_transposes

    resnet = ModelSpec.from_name("resnet-50")
    a100, v100, cpu = (ClusterSpec(gpus=1, gpu_type=g) for g in ("a100-80gb", "v100-32gb", "cpu"))
    for cluster, precision, transposed in ((a100, "bf16", True), (a100, "fp32", True), (v100, "fp16", True),
                                           (v100, "fp32", False), (cpu, "bf16", False)):
        nchw = ScheduleConfig(micro_batch=64, precision=precision)
        nhwc = nchw.with_(channels_last=True)
        slow, fast = (estimate(resnet, c, cluster) for c in (nchw, nhwc))
        assert nchw_transposes(nchw, cluster, device_perf(cluster)) is transposed
        assert not nchw_transposes(nhwc, cluster, device_perf(cluster))
        if transposed:
            # memory-bound passes over every feature map: a sizeable share of a ResNet-50 step
            assert 1.1 < slow.step_time_s / fast.step_time_s < 1.8, (cluster.gpu_type, precision)
        else:
            assert slow.step_time_s == fast.step_time_s
        assert slow.memory_per_device_bytes == fast.memory_per_device_bytes  # a layout, not more memory


def test_fp32_3x3_convolutions_on_cuda_cores_run_as_winograds(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN computes fp32 3x3 stride-1 convolutions on CUDA cores (V100) by Winograd's F(2x2, 3x3):
    2.25x fewer multiplications (Lavin and Gray 2016). Tensor-core kernels (16-bit, TF32) do not."""
    from autoslapo.cost import device_perf
    from autoslapo.cost.conv import WINOGRAD_GAIN, winograd

    assert WINOGRAD_GAIN == 36 / 16
    resnet = ModelSpec.from_name("resnet-50")
    v100, a100 = ClusterSpec(gpus=1, gpu_type="v100-32gb"), ClusterSpec(gpus=1, gpu_type="a100-80gb")
    fp32 = ScheduleConfig(micro_batch=112, precision="fp32")
    assert winograd(fp32, v100, device_perf(v100))
    assert not winograd(fp32, a100, device_perf(a100))  # TF32 tensor cores
    assert not winograd(fp32.with_(precision="fp16"), v100, device_perf(v100))
    # a share of ResNet-50's arithmetic is in its 3x3 stride-1 convolutions: the step is faster, not 2.25x
    with_wino = estimate(resnet, fp32, v100).time.compute
    monkeypatch.setattr("autoslapo.cost.conv.WINOGRAD_GAIN", 1.0)
    assert 1.15 < estimate(resnet, fp32, v100).time.compute / with_wino < 1.6
