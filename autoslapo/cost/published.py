"""Check the cost model against published large-scale runs (``data/published_throughput.csv``). Pure.

Each row gives a model shape, device, degrees and (for Megatron) the global batch; the schedule
that matches the run is rebuilt and the free knobs picked as ``best_config`` would:

- Megatron-LM (Narayanan et al., SC'21, table 1): full recomputation (``ckpt_ratio=1``), fp16,
  the fused scale-mask-softmax / bias-GeLU / bias-dropout-add kernels of Megatron (modelled as
  ``compile_layers=True``: fused elementwise passes), the 2021 unfused attention (``eager``), tp/pp/dp
  and global batch as given; the micro-batch is the fastest that fits. Compared: TFLOP/s a GPU with
  recompute.
- NVIDIA DeepLearningExamples BERT-large phase 1: sequence 128, fp16 AMP with fused kernels, LAMB
  (optimizer state as Adam's), eager attention, pure data parallelism; the per-GPU batch is the
  fastest that fits with one micro-batch a step. Compared: sequences/s for the job.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import later_knob_defaults
from autoslapo.cost.estimate import Estimate
from autoslapo.cost.search import best_config
from autoslapo.models.spec import ModelSpec

DATA = Path(__file__).with_name("data") / "published_throughput.csv"


@dataclass(frozen=True)
class PublishedCheck:
    """One published row, the estimate for its schedule, and the relative error."""

    row: dict[str, str]
    estimate: Estimate
    predicted: float
    published: float

    @property
    def error(self) -> float:
        """Signed relative error (predicted / published - 1)."""
        return self.predicted / self.published - 1.0


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """Rows of the published-throughput CSV (the copy shipped in the package by default)."""
    with open(path or DATA, newline="") as f:
        return list(csv.DictReader(f))


def row_model(row: dict[str, str]) -> ModelSpec:
    """The model shape of a row (GPT rows as the gpt2 family; MLP width 4h)."""
    family = "gpt2" if row["family"] == "gpt" else row["family"]
    h = int(row["hidden"])
    return ModelSpec(family=family, hidden=h, layers=int(row["layers"]), heads=int(row["heads"]),
                     ffn=4 * h, seq_len=int(row["seq_len"]), vocab=int(row["vocab"]),
                     preset=f"{row['source']}-{row['params_b']}b")


def check_row(row: dict[str, str]) -> PublishedCheck:
    """Estimate the schedule matching ``row`` and compare with its published figure."""
    model = row_model(row)
    gpus = int(row["gpus"])
    cluster = ClusterSpec(gpus=gpus, gpu_type=row["gpu"], gpus_per_node=min(8, gpus))
    fixed: dict[str, Any] = dict(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                                 precision="fp16", attn_kernel="eager", compile_layers=True,
                                 sequence_parallel=False)
    fixed["ckpt_ratio"] = 1.0 if row["recompute"] == "full" else 0.0
    # the published runs recompute whole layers and compute the loss from whole (shard) logits
    fixed["ckpt_granularity"], fixed["loss_kernel"] = "full", "eager"
    fixed["zero_stage"] = 0  # Megatron's data parallelism of 2021 and DeepSpeed-free BERT: plain allreduce
    fixed.update(later_knob_defaults(fixed))  # knobs added later: the stacks of 2021 had none of them
    gb = int(row["global_batch"]) if row["global_batch"] else None
    est = best_config(model, cluster, global_batch=gb, **fixed)
    metric = row["metric"]
    if metric == "tflops_per_gpu_incl_recompute":
        predicted = est.hw_tflops_per_device
    elif metric == "sequences_per_s":
        predicted = est.samples_per_s
    else:
        raise ValueError(f"unknown metric {metric!r} in the published table")
    return PublishedCheck(row=row, estimate=est, predicted=predicted, published=float(row["value"]))


def check_all(path: Path | None = None) -> list[PublishedCheck]:
    """``check_row`` over every row of the table."""
    return [check_row(r) for r in load_rows(path)]
