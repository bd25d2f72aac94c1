"""Achievable-performance figures of a device, kept apart from the published peaks in ``ClusterSpec``.

``ClusterSpec`` carries datasheet numbers (peak TFLOP/s, memory, link bandwidths). What a real
training step reaches depends on more: HBM bandwidth (the elementwise ops are memory-bound), how
many SMs a GEMM's tiles must fill (wave quantization), the fraction of peak cuBLAS reaches on a
large GEMM, kernel-launch and collective latency. Those live here, per device, with their sources;
on a CPU, ``autoslapo profile`` measures them (see ``DevicePerf.from_profile``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec

MiB = 1024**2
GiB = 1024**3

#: Pipeline engines whose point-to-point transfers the step-time model counts
#: (``autoslapo.cost.p2p.pipeline_p2p_s``).
PIPELINE_ENGINES = ("megatron", "deepspeed", "megatron-core")
#: ``DevicePerf.runtime`` of autoslapo's own runtime on a CPU rank and on a GPU (see ``DevicePerf``).
AUTOSLAPO_CPU = "autoslapo"
AUTOSLAPO_GPU = "autoslapo-gpu"


def is_autoslapo_runtime(runtime: str) -> bool:
    """Whether ``runtime`` is autoslapo's own (on a CPU or a GPU), not the published runs' stack."""
    return runtime in (AUTOSLAPO_CPU, AUTOSLAPO_GPU)


@dataclass(frozen=True)
class DevicePerf:
    """Achievable figures of one device kind.

    ``gemm_eff``: fraction of the tensor-core peak a large, well-shaped GEMM reaches.
    ``k_half``: inner dimension at which a GEMM reaches half of that (prologue/epilogue cost; what
    makes the ``s x s x head_dim`` attention products slow). ``sms`` and ``tile``: for wave
    quantization. ``hbm_gbps`` and ``bw_eff``: memory bandwidth and the fraction elementwise kernels
    reach. ``op_latency_s``: time floor of one kernel (launch) or, on a CPU, the framework's
    per-op dispatch cost, which adds to the op. ``coll_latency_s``: per ring hop. ``comm_eff``:
    fraction of the link bandwidth a ring collective reaches. ``overlap``: how much communication
    can hide behind compute (separate engines on a GPU; shared cores on a CPU).
    ``fixed_overhead_bytes``: per process (CUDA context, NCCL buffers; or Python + torch + gloo).
    ``runtime``: which software stack a step runs on. ``"megatron"`` (the GPU presets): the
    Megatron-LM / DeepSpeed layout of the published runs (16-bit weights with fp32 master copies in
    the optimizer, vocab-parallel cross-entropy, DeepSpeed buffers sized by their config).
    ``"autoslapo"``: autoslapo's own runtime (``autoslapo.runtime``) on a CPU rank: transformers
    modules, fp32 weights (autocast for 16-bit), DeepSpeed's engine per micro-batch and its
    buffers, touched lazily (a CPU counts the pages a copy wrote). ``"autoslapo-gpu"``: the same
    runtime on a GPU, whose caching allocator holds a buffer whole (``for_autoslapo_runtime``: what
    a real trial of the ``local`` or ``ray`` backend runs, where the presets describe the published
    stack). GPU physics stays the same; only what the stack adds differs (see
    ``autoslapo.cost.memory`` and ``autoslapo.cost.time``).
    ``step_overhead_s`` / ``microbatch_overhead_s``: the runtime's fixed cost a step and a
    micro-batch, whatever the model's size (Python, DeepSpeed's engine, barriers); measured by
    ``autoslapo profile`` with a tiny real trial.
    ``activation_slack``: resident bytes per activation byte the model counts (autograd's
    temporaries beyond the accounted tensors). ``heap_retention``: resident bytes the host
    allocator keeps per byte of the step's *un-checkpointed* activation volume. glibc serves
    tensors up to its mmap threshold (raised to 32 MiB by the first large free) from its heap and
    keeps what they free for reuse, fragmented: every layer's full activations pass through the
    heap in forward and again when backward recomputes them, so checkpointing lowers the live
    peak but not what the heap has grown to. Both measured by ``autoslapo profile``; 0 on a GPU,
    whose memory counter is the caching allocator's live bytes.
    ``zero_overhead_bytes``: what DeepSpeed's ZeRO optimizer adds to a process whatever the
    model's size (its own modules and set-up), measured by a tiny ZeRO-1 trial.
    ``gemm_curve``: optional measured ``(flops, tflops)`` points (a CPU profile); replaces the
    GEMM model when given. ``mem_curve``: optional measured ``(bytes, GB/s)`` of copies by size (a
    CPU's caches make small tensors faster than DRAM); replaces ``hbm_gbps`` when given.
    ``pipeline_engine``: whose pipeline runs the stages, for its point-to-point transfers a step
    (``pipeline_transfers``): ``"megatron"``, Megatron-LM's 1F1B with its batched send-and-receive
    (also autoslapo's runtime, ``torch.distributed.pipelining``); ``"deepspeed"``, DeepSpeed's
    ``PipelineEngine`` (Megatron-DeepSpeed), whose sends and receives each block;
    ``"megatron-core"``, Megatron-core as NeMo runs it (``overlap_p2p_comm``), which hides the
    interleaved 1F1B phase's transfers behind compute (``autoslapo.cost.p2p.pipeline_p2p_s``).
    ``gemm_fixed_s``: a GEMM launch's fixed ramp-and-drain time (its efficiency saturates with its
    size). ``host_op_s``: the host's time to issue one kernel from eager PyTorch (a micro-batch takes
    at least its kernels times this). Both in ``autoslapo.cost.kernels``; 0 on a CPU profile, whose
    measured curves and per-op latency already hold them.
    """

    name: str
    gemm_eff: float
    k_half: float
    sms: int
    tile: int
    hbm_gbps: float
    bw_eff: float
    op_latency_s: float
    op_latency_additive: bool
    coll_latency_s: float
    comm_eff: float
    overlap: float
    fixed_overhead_bytes: int
    activation_slack: float = 1.0
    heap_retention: float = 0.0
    runtime: str = "megatron"
    step_overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0
    zero_overhead_bytes: int = 0
    gemm_curve: tuple[tuple[float, float], ...] = ()
    mem_curve: tuple[tuple[float, float], ...] = ()
    gemm_fixed_s: float = 0.0
    host_op_s: float = 0.0
    pipeline_engine: str = "megatron"

    def __post_init__(self) -> None:
        if self.pipeline_engine not in PIPELINE_ENGINES:
            raise ConfigError(f"pipeline_engine must be one of {', '.join(PIPELINE_ENGINES)}: got "
                              f"{self.pipeline_engine!r}; use megatron for Megatron-LM or autoslapo's runtime, "
                              "megatron-core for NeMo's Megatron-core with overlap_p2p_comm")

    @classmethod
    def from_profile(cls, base: DevicePerf, profile: dict[str, Any]) -> DevicePerf:
        """``base`` with the figures a measured profile provides (unknown keys are ignored).

        A measured zero (no fixed cost, no overhead) is a figure too: only absent keys keep ``base``'s.
        """
        changes: dict[str, Any] = {}
        for key in ("hbm_gbps", "op_latency_s", "coll_latency_s", "fixed_overhead_bytes", "activation_slack",
                    "heap_retention", "step_overhead_s", "microbatch_overhead_s", "zero_overhead_bytes"):
            if profile.get(key) is not None:
                changes[key] = type(getattr(base, key))(profile[key])
        for key in ("gemm_curve", "mem_curve"):
            if profile.get(key):
                changes[key] = tuple((float(f), float(r)) for f, r in profile[key])
        if profile.get("comm_eff"):
            changes["comm_eff"] = float(profile["comm_eff"])
        return replace(base, **changes)


# GPU figures. HBM: NVIDIA datasheets (V100 900 GB/s, A100-40GB 1555, A100-80GB SXM 2039, H100 SXM
# 3350, H200 4800, B200 7700); SMs 80, 108, 132, 148. Large-GEMM efficiency: cuBLAS fp16/bf16
# reaches ~80-85% of peak on V100/A100 (H100, B200: see H100_GEMM_EFF below). Elementwise kernels
# reach ~80% of HBM bandwidth (STREAM-like copies). NCCL ring allreduce reaches ~80% of the
# NVLink/InfiniBand line rate as bus bandwidth (nccl-tests). Kernel launch ~5 us; a GEMM's fixed
# ramp and drain 3 us and the host's issue cost a kernel 8 us (see autoslapo.cost.kernels).
_GPU = dict(k_half=48.0, tile=128, bw_eff=0.8, op_latency_s=5e-6, op_latency_additive=False, gemm_fixed_s=3e-6,
            host_op_s=8e-6, coll_latency_s=8e-6, comm_eff=0.8, overlap=1.0, fixed_overhead_bytes=int(1.25 * GiB))
# Hopper (H100/H200 SXM, the same GH100 die): a training step reaches a lower fraction of the
# datasheet's dense peak than an A100 on the same software stack. The 989 TFLOP/s peak is quoted at
# the 1,980 MHz boost clock, which a power-capped (700 W) SXM part does not hold under sustained
# tensor-core load (~1,750 MHz, 0.88 of it); and the published training figures are lower than
# A100's: Megatron-LM's README reports up to 47 % MFU on H100 against the 52 % of peak (163 of 312
# TFLOP/s) of Narayanan et al. 2021 on A100, and MosaicML LLM Foundry's benchmark tables show its
# FSDP runs at ~35-45 % MFU on H100 against ~50-60 % on A100 for the same models. A large GEMM's
# fraction of the quoted peak is therefore 0.8 of A100's 0.82 (not cuBLAS's best-case ~0.72 on
# one GEMM at boost clock): a device efficiency, the same for every row on the device. Checked on
# runs never fitted (``autoslapo.cost.heldout``: Llama 3 405B on 8,192 / 16,384 H100, Dubey et al.
# 2024 table 4, the paper's own schedule without recomputation, fused kernels pinned): +0.6 % /
# +3.1 % model TFLOP/s a GPU; A100's 0.82 would be +17.6 % / +20.6 %.
H100_GEMM_EFF = 0.66
# Blackwell (B200, HGX at 1,000 W): NVIDIA's first MLPerf Training submissions (v4.1, November
# 2024; NVIDIA's technical blog "NVIDIA Blackwell Doubles LLM Training Performance in MLPerf
# Training v4.1") ran GPT-3 175B pre-training 2.0x as fast a GPU as Hopper, both in FP8, where the
# datasheets' dense FP8 peaks differ 2.27x (4,500 against 1,979 TFLOP/s) and HBM 2.3x (7.7 against
# 3.35 TB/s): a step reaches 0.88 of Hopper's fraction of peak (2.0 / 2.27; Hopper's ran on 4x the
# GPUs, so this is if anything low). Megatron-Bridge's performance summary (NeMo 25.11 container,
# its docs/performance-summary.md) agrees within 6 %: Llama 3 8B in FP8 on 8 GPUs, 1,576 model
# TFLOP/s a GPU on a DGX-B200 against 744 on a DGX-H100 (schedules differ), 0.93 of Hopper's
# fraction. Checked, never fitted, on 16-bit B200 runs (``autoslapo.cost.heldout``,
# google_gpurecipes2025_a4_qwen25: NeMo on Google Cloud A4): the data-parallel Qwen2.5-7B rows -2.5 %;
# the pipelined 32B rows -4.4 to +1.5 %, with NeMo's overlap of pipeline transfers priced (before it
# was, every transfer on the critical path: -0.7 to -18.3 %).
B200_GEMM_EFF = round(H100_GEMM_EFF * 2.0 / (4500 / 1979), 2)
PERF: dict[str, DevicePerf] = {
    "v100-16gb": DevicePerf("v100-16gb", gemm_eff=0.80, sms=80, hbm_gbps=900.0, **_GPU),  # type: ignore[arg-type]
    "v100-32gb": DevicePerf("v100-32gb", gemm_eff=0.80, sms=80, hbm_gbps=900.0, **_GPU),  # type: ignore[arg-type]
    "a100-40gb": DevicePerf("a100-40gb", gemm_eff=0.82, sms=108, hbm_gbps=1555.0, **_GPU),  # type: ignore[arg-type]
    "a100-80gb": DevicePerf("a100-80gb", gemm_eff=0.82, sms=108, hbm_gbps=2039.0, **_GPU),  # type: ignore[arg-type]
    "h100-80gb": DevicePerf("h100-80gb", gemm_eff=H100_GEMM_EFF, sms=132, hbm_gbps=3350.0, **_GPU),  # type: ignore[arg-type]
    "h200-141gb": DevicePerf("h200-141gb", gemm_eff=H100_GEMM_EFF, sms=132, hbm_gbps=4800.0, **_GPU),  # type: ignore[arg-type]
    "b200-180gb": DevicePerf("b200-180gb", gemm_eff=B200_GEMM_EFF, sms=148, hbm_gbps=7700.0, **_GPU),  # type: ignore[arg-type]
    # A CPU rank without a profile: rough figures for a 2-core VM (one core a rank). `autoslapo
    # profile` replaces them with measured ones. Framework dispatch (~20 us an op) adds to each op;
    # gloo and compute share the cores, so communication does not overlap.
    "cpu": DevicePerf("cpu", gemm_eff=0.7, k_half=16.0, sms=1, tile=1, hbm_gbps=8.0, bw_eff=1.0,
                      op_latency_s=20e-6, op_latency_additive=True, coll_latency_s=60e-6, comm_eff=1.0,
                      overlap=0.0, fixed_overhead_bytes=400 * MiB, runtime=AUTOSLAPO_CPU,
                      step_overhead_s=0.03, microbatch_overhead_s=0.01),
}


def for_autoslapo_runtime(perf: DevicePerf) -> DevicePerf:
    """``perf`` with autoslapo's own runtime as its stack: what a real trial runs (a GPU preset
    describes the published runs' Megatron-LM / DeepSpeed stack; a CPU's is autoslapo's already)."""
    return perf if is_autoslapo_runtime(perf.runtime) else replace(perf, runtime=AUTOSLAPO_GPU)


def device_perf(cluster: ClusterSpec, profile: dict[str, Any] | None = None) -> DevicePerf:
    """The achievable figures for ``cluster``'s device, with a measured profile applied if given."""
    base = PERF[cluster.gpu_type]
    return DevicePerf.from_profile(base, profile) if profile else base
