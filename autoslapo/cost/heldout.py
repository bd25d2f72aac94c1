"""Check the cost model against published H100 training runs it was never fitted to
(``data/h100_heldout_bf16.csv``). Pure.

Rows (held out: no device or runtime figure was set from them):

* ``dubey2024_llama3_table4``: "The Llama 3 Herd of Models" (Dubey et al., Meta, arXiv
  2407.21783, 2024), table 4: Llama 3 405B pre-training (8,192-token sequences, 16M tokens a
  batch = 2,048 sequences) on 8,192 and 16,384 H100 SXM 80GB GPUs (700 W, HBM3; 8 a server over
  NVLink, 400 Gb/s RoCE a GPU between servers, section 3.3.1), BF16, TP 8, PP 16, DP 64 / 128,
  430 / 400 TFLOP/s a GPU (43 % / 41 % BF16 MFU). The same three rows were shown by P. Balaji at
  SC'24 ("Herding Llamas"). The table's third row (16,384 GPUs with context parallelism 16 at
  131,072 tokens) is left out: the model has no context parallelism.

Each row's schedule: its tp, pp, dp, global batch and precision pinned; its pipeline schedule
(interleaved, section 3.3.2) pinned; what the paper does not give (micro-batch, virtual stages,
checkpointing, kernels) picked as the tuner would: the fastest estimate that fits, over
``best_config``'s search and the interleaved schedule's virtual stages. Llama 3 405B has 126
layers and puts one layer fewer on the first and last of its 16 stages (section 3.3.2); the model
splits layers evenly, so the row is estimated with 128 equal layers. The compared figure is a rate
(model TFLOP/s a GPU: model FLOPs a step over step time), which two more layers move by well under
1 %. Compared: model TFLOP/s a GPU (``Estimate.tflops_per_device``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.cost.estimate import estimate
from autoslapo.cost.field import FieldCheck
from autoslapo.cost.field import load_rows as load_field_rows
from autoslapo.cost.search import best_config
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec

DATA = Path(__file__).with_name("data") / "h100_heldout_bf16.csv"
#: Chunks per pipeline rank tried for an interleaved row (the paper does not give its own).
VIRTUAL_STAGES = (2, 4, 8)


#: One published H100 run, the estimate for its schedule and the relative error: the same record
#: as a field check (``autoslapo.cost.field.FieldCheck``).
HeldOutCheck = FieldCheck


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """Rows of the held-out H100 CSV (the copy shipped in the package by default)."""
    return load_field_rows(path or DATA)


def row_model(row: dict[str, str]) -> ModelSpec:
    """The row's model shape; layers rounded up to a multiple of the pipeline degree (see above)."""
    pp, layers = int(row["pp"]), int(row["layers"])
    return ModelSpec(family=row["family"], hidden=int(row["hidden"]), layers=-(-layers // pp) * pp,
                     heads=int(row["heads"]), kv_heads=int(row["kv_heads"]), ffn=int(row["ffn"]),
                     seq_len=int(row["seq_len"]), vocab=int(row["vocab"]), preset=row["model"],
                     max_positions=int(row["seq_len"]))


def check_row(row: dict[str, str]) -> HeldOutCheck:
    """Estimate the row's schedule (see the module docstring) and compare model TFLOP/s a GPU."""
    if row["metric"] != "model_tflops_per_gpu" or int(row["cp"]) != 1:
        raise ConfigError(f"held-out rows compare model TFLOP/s a GPU without context parallelism: got "
                          f"metric {row['metric']!r}, cp {row['cp']}; drop the row or extend autoslapo.cost.heldout")
    model = row_model(row)
    gpus = int(row["gpus"])
    cluster = ClusterSpec(gpus=gpus, gpu_type=row["gpu"], gpus_per_node=min(8, gpus))
    fixed: dict[str, Any] = dict(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), precision=row["precision"],
                                 pipeline_schedule=row["pipeline_schedule"])
    best = best_config(model, cluster, global_batch=int(row["global_batch"]), **fixed)
    if row["pipeline_schedule"] == "interleaved":
        for v in VIRTUAL_STAGES:
            if model.layers % (int(row["pp"]) * v):
                continue
            e = estimate(model, replace(best.config, virtual_stages=v), cluster)
            if e.fits and e.samples_per_s > best.samples_per_s:
                best = e
    return HeldOutCheck(row=row, estimate=best, predicted=best.tflops_per_device, measured=float(row["value"]))


def check_all(path: Path | None = None) -> list[HeldOutCheck]:
    """``check_row`` over every row of the table."""
    return [check_row(r) for r in load_rows(path)]
