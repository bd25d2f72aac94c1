"""Check the cost model against measured FSDP runs of MosaicML LLM Foundry (``data/llmfoundry_a100_bf16.csv``). Pure.

The rows (a copy of ``shared/reference/llmfoundry_a100_bf16.csv``) come from LLM Foundry's throughput
table (``scripts/train/benchmarking/README.md`` of mosaicml/llm-foundry, A100-80GB and A100-40GB, bf16):
MPT models (GPT-style decoder, ALiBi, no biases, FlashAttention, GeLU MLP of width 4h, dropout 0 in
its ``scripts/train/yamls/pretrain/mpt-*.yaml``) trained with PyTorch FSDP, no tensor or pipeline
parallelism. Every row ran, so a cost model must predict that it fits.

Each run's memory techniques are pinned as knobs: FSDP FULL_SHARD as ``zero_stage=3`` (SHARD_GRAD_OP
as 2), activation checkpointing of every block as ``ckpt_ratio=1`` (the row's ``ckpt``), the fused
cross-entropy of its configs (``loss_fn: fused_crossentropy``, flash-attn's xentropy kernel, which
writes the logits' gradient in place and keeps no fp32 softmax) as ``loss_kernel="chunked"``,
FlashAttention as ``attn_kernel="flash"``, the single-kernel GeLU (no bias to fuse) as
``fuse_bias_gelu=True``. The micro-batch and gradient accumulation are the row's; a row whose global
batch is not ``gpus x micro_batch x grad_accum`` (LLM Foundry splits the remainder) is estimated at
the product, which leaves tokens/s per GPU unchanged. Compared: tokens/s per GPU.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost.estimate import Estimate, estimate
from autoslapo.models.spec import ModelSpec

DATA = Path(__file__).with_name("data") / "llmfoundry_a100_bf16.csv"
SOURCE = "llmfoundry_a100"


@dataclass(frozen=True)
class FieldCheck:
    """One measured run, the estimate for its pinned schedule, and the relative error."""

    row: dict[str, str]
    estimate: Estimate
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        """Signed relative error of throughput (predicted / measured - 1)."""
        return self.predicted / self.measured - 1.0

    @property
    def refused(self) -> bool:
        """Whether the model predicts that this run, which ran, does not fit in memory."""
        return not self.estimate.fits


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """Rows of the LLM Foundry CSV (the copy shipped in the package by default)."""
    with open(path or DATA, newline="") as f:
        return list(csv.DictReader(f))


def row_model(row: dict[str, str]) -> ModelSpec:
    """The MPT shape of a row, as the gpt2 family (GeLU MLP of width ``ffn``, causal)."""
    return ModelSpec(family="gpt2", hidden=int(row["hidden"]), layers=int(row["layers"]), heads=int(row["heads"]),
                     ffn=int(row["ffn"]), seq_len=int(row["seq_len"]), vocab=int(row["vocab"]),
                     preset=f"mpt-{row['model']}")


def row_config(row: dict[str, str]) -> ScheduleConfig:
    """The schedule the run used, its memory techniques as knobs (see the module's docstring)."""
    return ScheduleConfig(tp=1, pp=1, dp=int(row["gpus"]), micro_batch=int(row["micro_batch"]),
                          grad_accum=int(row["grad_accum"]), zero_stage=int(row["zero_stage"]),
                          ckpt_ratio=float(row["ckpt"]), ckpt_granularity="full", loss_kernel="chunked",
                          attn_kernel="flash", fuse_bias_gelu=True, precision="bf16", sequence_parallel=False)


def check_row(row: dict[str, str]) -> FieldCheck:
    """Estimate the run's schedule (dropout off, as MPT trains) and compare tokens/s per GPU."""
    gpus = int(row["gpus"])
    cluster = ClusterSpec(gpus=gpus, gpu_type=row["gpu"], gpus_per_node=min(8, gpus))
    est = estimate(row_model(row), row_config(row), cluster, dropout=False)
    return FieldCheck(row=row, estimate=est, predicted=est.tokens_per_s / gpus,
                      measured=float(row["tokens_per_s_per_gpu"]))


def check_all(path: Path | None = None) -> list[FieldCheck]:
    """``check_row`` over every row of the table."""
    return [check_row(r) for r in load_rows(path)]
