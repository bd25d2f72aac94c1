"""Check the cost model against published training runs it was never fitted to. Pure.

Nine tables, ten sources (held out: no device or runtime figure was set from them):

``data/h100_heldout_bf16.csv``, ``dubey2024_llama3_table4``: "The Llama 3 Herd of Models" (Dubey et
al., Meta, arXiv 2407.21783, 2024), table 4: Llama 3 405B pre-training (8,192-token sequences, 16M
tokens a batch = 2,048 sequences) on 8,192 and 16,384 H100 SXM 80GB GPUs (700 W, HBM3; 8 a server
over NVLink, 400 Gb/s RoCE a GPU between servers, section 3.3.1), BF16, TP 8, PP 16, DP 64 / 128,
430 / 400 TFLOP/s a GPU (43 % / 41 % BF16 MFU). The same three rows were shown by P. Balaji at
SC'24 ("Herding Llamas"). The table's third row (16,384 GPUs with context parallelism 16 at
131,072 tokens) is left out: the model has no context parallelism. Llama 3 405B has 126 layers and
puts one layer fewer on the first and last of its 16 stages (section 3.3.2): with 8 virtual stages
its first chunk holds the embedding alone and its last the head alone, as the model's chunks
(``layout.chunk_sizes``) place 126 layers in 128 chunks. The paper
trained these rows without activation checkpointing (section 3.3.2, after freeing each stage's input
and output tensors early). It names no kernels; the rows pin fused elementwise kernels
(``compile_layers``), as the ADLR rows do: with them a SwiGLU keeps gate and up, not its activation,
and the paper's schedule fits in 80 GB (unfused, the model puts it above, and its fastest that fits
recomputes layers).

``data/a100_heldout_megatron.csv``, ``korthikanti2022_table5``: "Reducing Activation Recomputation
in Large Transformer Models" (Korthikanti et al., NVIDIA, arXiv 2205.05198, 2022), table 5: the
iteration time of GPT models of 22B (TP 8 on 8 GPUs, micro-batch 4, batch 4), 175B (TP 8 PP 8 on
64), 530B (TP 8 PP 35 on 280) and 1T (TP 8 PP 64 on 512; micro-batch 1 and a batch of 64, 280 and
512 sequences) on A100 80GB with Megatron-LM, data parallelism 1, sequence 2,048, vocabulary
51,200, each with full recomputation of every layer and with the paper's sequence parallelism and
selective recomputation. Megatron-LM's README gives the latter as 41.5 / 51.4 / 56.0 / 56.3 % MFU,
which the table's times reproduce (``tests/autoslapo/test_cost_heldout.py``); the abstract's 42.1 %
MFU with full recomputation on 2,240 GPUs is close to the 530B row's (42.5 % at data parallelism 1);
the other full-recomputation times have no second published figure to check them against. Megatron's kernels of the time: its fused softmax and bias-GeLU, no flash
attention, an fp32 cross-entropy over the vocabulary shards: pinned as ``attn_kernel=eager``,
``compile_layers``, ``loss_kernel=eager``, ``zero_stage=0``. The paper does not say the pipeline
schedule; 1F1B (Megatron's default) is pinned.

``data/v100_heldout_megatron.csv``, ``adlr2020_megatron_v1``: "MegatronLM's Supercharged V1.0"
(NVIDIA ADLR, nv-adlr.github.io/MegatronLMV1, 2020), table 1: the iteration time of GPT-2 models
on V100 32GB in a DGX-2H server (16 V100s over NVSwitch) with Megatron-LM 1.0, batch 8 of 1,024
tokens, fp16, activation checkpointing of every layer: the 1.2B baseline on one GPU (1,288 ms; "62.4
teraFLOPs, 48 % of the theoretical peak") and 4.2B with TP 4 (1,357 ms). Their shapes are those
of Shoeybi et al. 2019 (arXiv 1909.08053), table 1: hidden 1,536 / 2,304, 40 / 64 layers, 16 / 24
heads, a vocabulary padded to 51,200. The table's 2.0B and 8.7B rows are left out: their shapes are
not published. The post names its optimizations, not its kernels: Megatron's fused kernels are
pinned (``compile_layers``; unfused, the 1.2B row would be 1.6x slower). A DGX-2H's V100s (450 W)
have a 2.1 PFLOP/s server peak, 131 TFLOP/s a GPU, above the preset's 125 (the SXM2 datasheet): a
device difference the rows carry, not corrected.

``data/a100_heldout_deepspeed.csv``, ``smith2022_mtnlg_table``: "Using DeepSpeed and Megatron to
Train Megatron-Turing NLG 530B" (Smith et al., arXiv 2201.11990, 2022), section 2.4's system
throughput: MT-NLG 530B (105 layers, hidden 20,480, 128 heads, sequence 2,048) with TP 8 and PP 35
on 2,240 / 2,800 / 3,360 A100 of Selene (DGX A100, 8 HDR InfiniBand a node; 80GB per Microsoft's
announcement, which some write-ups give as 40GB: the README reports both), a batch of 1,920,
60.1 / 50.2 / 44.4 s an iteration (126 / 121 / 113 TFLOP/s a GPU, which the times reproduce),
fp16 with activation checkpointing, on DeepSpeed's pipeline engine with Megatron's tensor
parallelism: pinned as micro-batch 1, full recomputation, Megatron's fused kernels, eager attention
and loss, ZeRO-1, 1F1B; the ``pipeline_engine`` column (``deepspeed``) has the model count that
engine's blocking sends and receives (``autoslapo.cost.p2p``). This stack ran the same model and
layout about 40 % slower per sequence and GPU than Megatron-LM's own later run
(``korthikanti2022_table5``, 530B), more than those transfers explain: these rows report that
difference, not a fit.

The same file, ``bigscience2022_bloom``: BLOOM 176B (BigScience, Le Scao et al., arXiv 2211.05100,
2022; 70 layers, hidden 14,336, 112 heads, sequence 2,048, a vocabulary of 250,680 padded to 250,880
for TP 4) trained with Megatron-DeepSpeed, the same stack as MT-NLG (DeepSpeed's pipeline engine,
Megatron's TP and fused kernels), on 384 A100 80GB of Jean Zay: TP 4, PP 12, DP 8, micro-batch 2, a
batch of 2,048, bf16 with DeepSpeed's BF16 optimizer ("its own zero stage 1 equivalent"), every layer
recomputed (the run's ``tr11-176B-ml`` script in bigscience-workshop/bigscience); 8 GPUs a node over
NVLink, four 100 Gb/s Omni-Path links a node (the paper, section 3.4.1): 6.25 GB/s a GPU across
nodes (column ``inter_node_gbps``). Throughput: "about 150 TFLOPs" a GPU (BigScience's 176B model
page; the paper gives 156 for its fastest configuration), which the stack's formula
(Megatron-DeepSpeed's throughput calculator: 96 B s n h^2 (1 + s / 6h + V / 16nh), recomputation
counted) turns into 104.5 s an iteration. ALiBi and the embedding's layer norm are priced as GPT-2's
learned positions (29M parameters of 176B).

``data/a100_heldout_torchtitan.csv``, ``torchtitan2024_a100``: torchtitan's ``docs/performance.md``
(pytorch/torchtitan, April 2024, commits 395a526 and 1ea476e): Llama 3 8B / 70B (8,192-token
sequences, vocabulary 128,256) and Llama 2 13B / 70B (4,096 tokens, 32,000) trained with FSDP2 on 64
A100 80GB, bf16, tokens/s a GPU ("WPS") as published. Another stack (PyTorch FSDP2, torch's sdpa,
an fp32 cross-entropy over the whole vocabulary) and another source than the rest: pinned as
``zero_stage=3``, ``attn_kernel="sdpa"``, ``loss_kernel="eager"``, no compilation, the row's
micro-batch; its activation checkpointing as knobs: "full" as ``ckpt_ratio=1``, "selective layer"
(every second block, torchtitan's ``selective_ac_option = 2``) as ``ckpt_ratio=0.5``, "selective op"
(its policy of that commit, ``parallelize_llama.py``: keep the outputs of the sdpa kernels and of
every mm but each second one) as ``ckpt_granularity="op"``, "no" as ``ckpt_ratio=0``. The page also
says that Llama 2 70B at local batch 2 with selective (op) checkpointing ran out of memory
(``KNOWN_OOM``): a run the model must refuse. The commits' train configs run Llama 3 8B and Llama 2
13B with torchtitan's Triton RMSNorm (``norm_type = "fused_rmsnorm"``), the 70B models with its eager
one (``"rmsnorm"``): the ``norm_kernel`` column, pinned as that knob (eager where a row of an RMSNorm
family leaves it empty).

``data/h100_heldout_torchtitan.csv``, ``torchtitan2024_h100``: torchtitan's H100 benchmark
(``benchmarks/llama3_h100_202412_torchtitan.md``, first published as the same performance page in 2025;
torch, torchao and torchtitan of December 2024), tables 1 and 3: Llama 3.1 8B (the Llama 3 8B shape),
FSDP2 on 8 and 128 GPUs, local batch 2 of 8,192 tokens, its selective "op" checkpointing
(``train_configs/llama3_8b.toml`` at the runs' commit 9dec370: ``selective_ac_option = 'op'``,
``norm_type = "rmsnorm"``, eager), without and with ``torch.compile`` (pinned as ``compile_layers``),
tokens/s a GPU as published (the rows with Float8 or context parallelism are left out: the model has
neither). Another GPU generation for the torchtitan stack: H100 SXM of Meta's Grand Teton with 96 GB of
HBM2e at 2.4 TB/s (columns ``memory_gb``, ``hbm_gbps``), 400 Gb/s a GPU between hosts, power-limited to
500 W, whose peak the page puts "between SXM and NVL" (989 and 835 TFLOP/s): the rows use the preset's
SXM figure (column ``peak_tflops`` empty), the README gives both bounds. What the rows check whatever
the peak: the gain of ``torch.compile`` (16 % measured), the eager elementwise chains that compiled
layers fuse (in the model, the RMSNorms and rotary positions most of it). The page's memory readings
(82.4 / 77.0 GiB on 8 GPUs, 67.0 / 62.0 on 128) are the allocator's peak reserve, not compared here.

``data/a100_v100_heldout_resnet50.csv``, ``nvidia_dle_resnet50``: NVIDIA DeepLearningExamples,
``PyTorch/Classification/ConvNets/resnet50v1.5/README.md``, "Training performance results" (the
pytorch-21.03 NGC container): ResNet-50 v1.5 (the ``resnet-50`` preset, torchvision's shape: the
``wideresnet`` family at width 1, hidden 256, ffn 64, 16 blocks, 224-pixel images, 1,000 classes) trained
with data parallelism on 1 and 8 GPUs of a DGX A100 (80GB) and DGX-1 (V100 16GB and 32GB), images/s
of the job as published, the batch a GPU of ``ConvNets/configs.yml`` (256; 112 for fp32 on V100):
mixed precision (AMP, fp16, channels-last) and TF32 / fp32 (NCHW). Another family (convolutions,
the only measured runs of one the project has), stack and source: pinned as micro-batch, no
recomputation, no ZeRO, and ``channels_last`` on for the AMP rows, off for the fp32 ones; the input
pipeline (DALI) is not modelled.

``data/nemo_heldout_bf16.csv``, ``nvidia_dgxc2024_nemo2411``: NVIDIA's DGX Cloud Benchmarking recipes
(NVIDIA/dgxc-benchmarking, release v24.11.1, commit 35a9aec, ``nemo_megatron/README_175b.md``'s BF16 table, the
NeMo 24.11 container: Megatron-core with Transformer Engine): GPT-3 175B (96 layers, hidden 12,288, 96 heads,
sequence 2,048; the GPT-2 BPE vocabulary of 50,257 padded to 50,688, Megatron's multiple of 128 x TP) on 128
to 2,048 H100 (8 a DGX H100 node, 400 Gb/s a GPU between nodes: the preset's), BF16, TP 4, PP 8, VP 12
(``virtual_stages``), micro-batch 1, a batch of 2 sequences a GPU (weak scaling), the README's step time
(8.91 to 9.09 s). The recipe's ``gpt3_175b_hydra.yaml`` at that commit gives the rest, pinned: no
activation checkpointing, sequence parallelism, the distributed fused Adam (``zero_stage=1``), TE's fused
attention (``flash``) and fused bias-GeLU / bias-dropout-add (``compile_layers``, as the other Megatron
rows); the loss: Megatron's vocabulary-parallel fp32 cross-entropy (``eager``); its ``overlap_p2p_comm``:
the ``pipeline_engine`` column (``megatron-core``: the 1F1B phase's transfers hidden behind compute,
``autoslapo.cost.p2p.pipeline_p2p_s``); not modelled: its other overlaps of communication with compute
(``overlap_grad_sync`` / ``overlap_param_sync``, TE's ``ub_tp_comm_overlap``: those collectives stay on the
critical path). NVIDIA's NeMo and Megatron-Bridge
performance summaries were searched first: their dense-model rows are FP8 and their BF16 rows mixture
of experts; no B200 BF16 run with numbers was found in either or in this repository (its Llama 3.1 BF16
rows on H100 run context parallelism 2, left out). Later releases (v25.04) give the same workload 7 %
faster with VP 6 in their configuration table: not taken.

``data/b200_heldout_nemo_bf16.csv``, ``google_gpurecipes2025_a4_qwen25``: Google's AI-Hypercomputer/gpu-recipes,
``training/a4/custom/qwen2-5-32b/`` and ``qwen2-5-7b/`` (their ``logs/`` and ``recipes/``), in pull requests #11
and #13 (not merged into main): the BF16 runs' full logs on A4 VMs (a4-highgpu-8g: 8 B200 a VM, the logs'
nvidia-smi "NVIDIA B200"; eight 400 Gb/s NICs, the preset's 50 GB/s a GPU) with NeMo 1.0 (the nemo:25.04
container: Megatron-core, Transformer Engine), mock data, 20 steps. Qwen2.5-32B (64 layers, hidden 5,120, 40
heads, 8 KV groups, FFN 27,648) on 16 / 32 / 64 GPUs, PP 2, DP 8 / 16 / 32, TP 1 with 32 virtual stages and
micro-batch 1 (commit 31d2854, 12 June 2025; 24.34 / 12.36 / 6.43 s) and, in the version it replaced (commit
779bb30), TP 2 with sequence parallelism: 32 virtual stages and micro-batch 1 on 16 GPUs, 4 and 2 on 32, 8 and
2 on 64 (27.50 / 13.44 / 6.73 s); Qwen2.5-7B (28 layers, hidden 3,584, 28 heads, 4 KV groups, FFN 18,944) with
data parallelism on 8 / 16 GPUs, micro-batch 4 (commit ca6f919; 11.11 / 5.62 s). All: sequence 4,096, the
vocabulary 152,064, untied embeddings, a batch of 512, ``precision: bf16-mixed`` with ``fp8: False`` (the
logs' parameter line), no activation checkpointing. The recipes set ``bias: False`` (Qwen's QKV bias left
out): the llama family's shape. Value: the mean of the logged ``train_step_timing`` of steps 10-19 (NeMo's
5-step moving mean; steps 5-19 agree within 0.3 %). Pinned as the NeMo rows: distributed fused Adam
(``zero_stage=1``), TE's fused attention (``flash``), fused kernels (``compile_layers``), an eager fp32 loss,
and TE's one-kernel RMSNorm (``norm_kernel`` fused); the logs' ``overlap_p2p_comm`` as the NeMo rows'
(``pipeline_engine`` ``megatron-core``); not modelled: the logs' ``overlap_grad_sync``, ``overlap_param_sync``
and, with TP 2, ``ub_tp_comm_overlap``. Another
device, never fitted: the first 16-bit runs ``B200_GEMM_EFF`` is checked against.

Each row pins its tp, pp, dp, global batch, precision, pipeline schedule and the knobs of its
``pinned`` column (JSON, checked by the knob declarations); what the source does not give
(micro-batch, virtual stages, checkpointing and kernels for Llama 3) is picked as the tuner would:
the fastest estimate that fits, over ``best_config``'s search and, for an interleaved row, the
virtual stages. Compared: model TFLOP/s a GPU (``Estimate.tflops_per_device``) for a
``model_tflops_per_gpu`` row; sequences/s of the job (the batch over the iteration time) for an
``iteration_time_s`` row; tokens/s a GPU for a ``tokens_per_s_per_gpu`` row; samples (images) /s of
the job for a ``samples_per_s`` row.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOB, RMS_NORM_FAMILIES, ScheduleConfig, later_knob_defaults
from autoslapo.cost.device import DevicePerf, device_perf
from autoslapo.cost.estimate import estimate
from autoslapo.cost.field import FieldCheck
from autoslapo.cost.field import load_rows as load_field_rows
from autoslapo.cost.search import best_config
from autoslapo.errors import ConfigError
from autoslapo.layout import pp_problem
from autoslapo.models.spec import ModelSpec

DATA = Path(__file__).with_name("data") / "h100_heldout_bf16.csv"
MEGATRON_DATA = Path(__file__).with_name("data") / "a100_heldout_megatron.csv"
V100_DATA = Path(__file__).with_name("data") / "v100_heldout_megatron.csv"
DEEPSPEED_DATA = Path(__file__).with_name("data") / "a100_heldout_deepspeed.csv"
TORCHTITAN_DATA = Path(__file__).with_name("data") / "a100_heldout_torchtitan.csv"
RESNET_DATA = Path(__file__).with_name("data") / "a100_v100_heldout_resnet50.csv"
TORCHTITAN_H100_DATA = Path(__file__).with_name("data") / "h100_heldout_torchtitan.csv"
NEMO_DATA = Path(__file__).with_name("data") / "nemo_heldout_bf16.csv"
B200_DATA = Path(__file__).with_name("data") / "b200_heldout_nemo_bf16.csv"
#: Every held-out table ``check_all`` reads.
DATA_FILES = (DATA, MEGATRON_DATA, V100_DATA, DEEPSPEED_DATA, TORCHTITAN_DATA, RESNET_DATA, TORCHTITAN_H100_DATA,
              NEMO_DATA, B200_DATA)
METRICS = ("model_tflops_per_gpu", "iteration_time_s", "tokens_per_s_per_gpu", "samples_per_s")
#: A published run that ran out of memory (torchtitan's performance.md, footnote 1: Llama 2 70B on 64
#: A100 80GB at local batch 2 with selective op checkpointing), as (row of its table with the same
#: model and schedule, the knobs that differ from it).
KNOWN_OOM = (("torchtitan2024_a100", "llama2-70b", "op"), {"micro_batch": 2})
#: Chunks per pipeline rank tried for an interleaved row (the paper does not give its own).
VIRTUAL_STAGES = (2, 4, 8)


#: One published H100 run, the estimate for its schedule and the relative error: the same record
#: as a field check (``autoslapo.cost.field.FieldCheck``).
HeldOutCheck = FieldCheck


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """Rows of the held-out H100 CSV (the copy shipped in the package by default)."""
    return load_field_rows(path or DATA)


def row_model(row: dict[str, str]) -> ModelSpec:
    """The row's model shape."""
    return ModelSpec(family=row["family"], hidden=int(row["hidden"]), layers=int(row["layers"]),
                     heads=int(row["heads"]), kv_heads=int(row["kv_heads"]), ffn=int(row["ffn"]),
                     seq_len=int(row["seq_len"]), vocab=int(row["vocab"]), preset=row["model"],
                     max_positions=int(row["seq_len"]))


def row_cluster(row: dict[str, str]) -> ClusterSpec:
    """The row's cluster: 8 devices a node, and what the row gives of its device (optional columns,
    empty or absent: the preset's): ``inter_node_gbps`` (GB/s a device), ``memory_gb`` (10^9 bytes)
    and ``peak_tflops`` (16-bit dense)."""
    gpus = int(row["gpus"])
    return ClusterSpec(gpus=gpus, gpu_type=row["gpu"], gpus_per_node=min(8, gpus),
                       inter_node_gbps=float(row.get("inter_node_gbps") or 0.0),
                       memory_bytes=int(float(row.get("memory_gb") or 0.0) * 1e9),
                       peak_tflops=float(row.get("peak_tflops") or 0.0))


def pinned_knobs(row: dict[str, str]) -> dict[str, object]:
    """The row's ``pinned`` column (a JSON object of knob values), each checked by its declaration."""
    text = row.get("pinned") or "{}"
    try:
        pinned = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"a held-out row's pinned column must be a JSON object: got {text!r} ({e.msg}); "
                          'write it as {"knob": value, ...}') from None
    if not isinstance(pinned, dict):
        raise ConfigError(f"a held-out row's pinned column must be a JSON object: got {text!r}; "
                          'write it as {"knob": value, ...}')
    unknown = sorted(set(pinned) - set(KNOB))
    if unknown:
        raise ConfigError(f"a held-out row pins unknown knobs {unknown}; valid knobs are {sorted(KNOB)}")
    return {k: KNOB[k].check(v, "a held-out row") for k, v in pinned.items()}


def row_perf(row: dict[str, str], cluster: ClusterSpec) -> DevicePerf:
    """The device preset with the row's stack and device figures, each from an optional column
    (empty or absent: the preset's): ``pipeline_engine`` (``deepspeed`` for Megatron-DeepSpeed's
    runs) and ``hbm_gbps``."""
    engine = row.get("pipeline_engine") or "megatron"  # an unknown one: ``DevicePerf`` says the rule
    if engine == "deepspeed" and row["pipeline_schedule"] != "1f1b":
        raise ConfigError(f"DeepSpeed's pipeline engine runs its own TrainSchedule, priced as 1f1b: got "
                          f"pipeline_schedule {row['pipeline_schedule']!r} with it; write 1f1b")
    perf = replace(device_perf(cluster), pipeline_engine=engine)
    return replace(perf, hbm_gbps=float(row["hbm_gbps"])) if row.get("hbm_gbps") else perf


def check_row(row: dict[str, str]) -> HeldOutCheck:
    """Estimate the row's schedule (see the module docstring) and compare its metric."""
    if row["metric"] not in METRICS or int(row["cp"]) != 1:
        raise ConfigError(f"held-out rows compare {' or '.join(METRICS)} without context parallelism: got "
                          f"metric {row['metric']!r}, cp {row['cp']}; drop the row or extend autoslapo.cost.heldout")
    model = row_model(row)
    gpus = int(row["gpus"])
    cluster = row_cluster(row)
    fixed: dict[str, Any] = dict(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), precision=row["precision"],
                                 pipeline_schedule=row["pipeline_schedule"])
    fixed.update(pinned_knobs(row))
    # a knob newer than the first set that the row does not pin stays at its default (its stack had none)
    fixed.update(later_knob_defaults(fixed, keep=("norm_kernel",)))  # the norm: the row's column, below
    if model.family in RMS_NORM_FAMILIES:  # the stack's RMSNorm: the row's column, else transformers' eager one
        fixed.setdefault("norm_kernel", row.get("norm_kernel") or "eager")
    perf = row_perf(row, cluster)
    best = best_config(model, cluster, global_batch=int(row["global_batch"]), perf=perf, **fixed)
    if row["pipeline_schedule"] == "interleaved" and "virtual_stages" not in fixed:
        # the sweep interleaves 2 chunks a rank; the fastest that fits over the other counts too
        for v in VIRTUAL_STAGES:
            if pp_problem(int(row["pp"]), model, cluster, v):
                continue
            e = best_config(model, cluster, global_batch=int(row["global_batch"]), virtual_stages=v, perf=perf,
                            **fixed)
            if e.fits and e.samples_per_s > best.samples_per_s:
                best = e
    if row["metric"] == "tokens_per_s_per_gpu":
        return HeldOutCheck(row=row, estimate=best, predicted=best.tokens_per_s / gpus, measured=float(row["value"]))
    if row["metric"] == "samples_per_s":
        return HeldOutCheck(row=row, estimate=best, predicted=best.samples_per_s, measured=float(row["value"]))
    if row["metric"] == "iteration_time_s":
        batch = int(row["global_batch"])
        return HeldOutCheck(row=row, estimate=best, predicted=batch / best.step_time_s,
                            measured=batch / float(row["value"]))
    return HeldOutCheck(row=row, estimate=best, predicted=best.tflops_per_device, measured=float(row["value"]))


def check_all(paths: tuple[Path, ...] | None = None) -> list[HeldOutCheck]:
    """``check_row`` over every row of the held-out tables (``DATA_FILES`` by default)."""
    return [check_row(r) for path in (paths or DATA_FILES) for r in load_rows(path)]


def known_oom_fits() -> tuple[dict[str, str], bool, int, int]:
    """The ``KNOWN_OOM`` run: (its table row, whether the model says it fits, predicted bytes a device,
    capacity). The row is the one of its model and checkpointing; the run differs in ``KNOWN_OOM[1]``."""
    (source, model, granularity), change = KNOWN_OOM
    row = next(r for r in load_rows(TORCHTITAN_DATA)
               if (r["source"], r["model"]) == (source, model) and granularity in r["pinned"])
    pinned = {**json.loads(row["pinned"]), **change}
    row = {**row, "pinned": json.dumps(pinned), "global_batch": str(int(row["dp"]) * int(pinned["micro_batch"]))}
    gpus = int(row["gpus"])
    knobs: dict[str, Any] = dict(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), grad_accum=1,
                                 precision=row["precision"])
    config = ScheduleConfig(**{**knobs, **pinned_knobs(row)})
    est = estimate(row_model(row), config, ClusterSpec(gpus=gpus, gpu_type=row["gpu"], gpus_per_node=min(8, gpus)))
    return row, est.fits, est.memory_per_device_bytes, est.memory_capacity_bytes
