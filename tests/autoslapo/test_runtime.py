"""Loss equivalence: a few training steps of the scheduled model on 4 gloo ranks give the losses of
the unscheduled model trained in one process on the same weights and data, across TP/PP/DP/ZeRO,
sequence parallelism and checkpointing. Several configurations share one spawned world."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoslapo.config import KNOBS, ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.layout import inapplicable_knobs
from autoslapo.models.resolve import resolve_model
from autoslapo.models.spec import FAMILIES, ModelSpec, is_convolutional
from autoslapo.runtime.engine import DeepSpeedMPU, deepspeed_config
from autoslapo.runtime.launcher import launch
from autoslapo.runtime.train import reference_losses

STEPS = 2
SEQ = 32
# fp32 on CPU: the layouts differ only by the order of floating-point sums (measured <= 5e-7 over
# 3 steps; a missing gradient sum, e.g. of a norm under sequence parallelism, shows as >= 1e-4).
TOL = 1e-5
# WideResNet under tp: conv2's all-reduced partial sums change the order of sums (step 1 agrees to
# 2.4e-7), and AdamW's first update, about lr x sign(g), turns that into 1.3e-5 at step 2 (measured; a
# relative gradient perturbation of 1e-7 gives 7.5e-5 in one process). A missing gradient sum shows
# as >= 1e-3; ``autoslapo verify`` checks every gradient itself to 2e-7.
TOL_CONV = 5e-5
# channels-last: oneDNN's NHWC convolutions sum the weight gradients in yet another order; step 1 agrees
# to 1.2e-7 and AdamW's first update makes that 5.3e-5 at step 2 (measured; float64 ``autoslapo verify``
# of the same layouts: 1.3e-13), still an order of magnitude under a missing sum
TOL_CHANNELS_LAST = 1e-4

MATRIX: list[dict[str, Any]] = [
    {"tp": 2, "dp": 2, "ckpt_ratio": 0.5},
    {"tp": 2, "pp": 2, "zero_stage": 1, "grad_accum": 2},
    {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2, "pipeline_schedule": "gpipe"},
    {"pp": 2, "dp": 2, "zero_stage": 2, "grad_accum": 2},  # gradients reduced to their owners a micro-batch
    {"dp": 4, "zero_stage": 2, "grad_accum": 2},
    {"tp": 2, "dp": 2, "zero_stage": 3},
    {"tp": 2, "dp": 2, "sequence_parallel": True, "zero_stage": 1, "ckpt_ratio": 1.0},
    {"tp": 2, "dp": 2, "sequence_parallel": True, "zero_stage": 3},
    # bias + GeLU fused (compiled; a no-op for families without a biased GeLU MLP): the fused Linear
    # keeps the unscheduled model's weights (test_build.py checks the meta build in the default run)
    {"tp": 2, "dp": 2, "fuse_bias_gelu": True, "ckpt_ratio": 0.5},
]

# The default run: one configuration per family, every engine path covered once.
MIXED: list[tuple[str, dict[str, Any]]] = [
    # kv_heads 2 < heads 4; both memory-lean kernels: selective recomputation, and the vocab-parallel
    # chunked loss as the last stage's loss_fn (test_lean_kernels.py has more of them, slow)
    ("llama-tiny", {"tp": 2, "pp": 2, "zero_stage": 1, "grad_accum": 2, "ckpt_ratio": 1.0,
                    "ckpt_granularity": "selective", "loss_kernel": "chunked"}),
    ("gpt2-tiny", {"tp": 2, "dp": 2, "zero_stage": 3, "ckpt_ratio": 0.5}),
    # ZeRO-2 over pipeline stages: the tied word embeddings stay whole, the rest go to their owners
    ("gpt2-tiny", {"pp": 2, "dp": 2, "zero_stage": 2, "grad_accum": 2}),
    ("bert-tiny", {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2, "pipeline_schedule": "gpipe"}),
    ("opt-tiny", {"dp": 4, "zero_stage": 2, "grad_accum": 2}),
    ("roberta-tiny", {"tp": 2, "dp": 2, "sequence_parallel": True, "ckpt_ratio": 1.0}),
    # encoder-decoder: TP over self- and cross-attention, checkpoints across both stacks
    ("t5-tiny", {"tp": 2, "dp": 2, "zero_stage": 1, "ckpt_ratio": 0.5}),
    # its pipeline: stages over encoder then decoder blocks, a pair of streams between them, over TP
    # (the one multi-rank check of T5's pipeline in the default run)
    ("t5-tiny", {"tp": 2, "pp": 2, "grad_accum": 2, "ckpt_ratio": 0.5}),
    ("albert-tiny", {"tp": 2, "dp": 2, "zero_stage": 1, "ckpt_ratio": 0.5}),  # a shared layer's calls
    ("gpt-neo-tiny", {"tp": 2, "pp": 2, "grad_accum": 2, "ckpt_ratio": 0.5}),  # local attention over TP/PP
    ("wideresnet-tiny", {"tp": 2, "dp": 2, "zero_stage": 1, "ckpt_ratio": 0.5}),
]

# ALBERT's and WideResNet's pipelines trained by the runtime (slow: on 2 gloo ranks their pipelined
# gradients, and WideResNet's BatchNorm statistics, are checked in the default run by test_pipeline.py
# and ``autoslapo verify`` in test_cli_verify.py; the runtime's pipeline path by MIXED's pp rows).
MIXED_PIPELINES: list[tuple[str, dict[str, Any]]] = [
    # a shared layer's calls over stages
    ("albert-tiny", {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2, "ckpt_ratio": 0.5}),
    ("wideresnet-tiny", {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2}),  # feature maps between stages
]

# LLaMA's relatives from a Hugging Face config.json (Mistral; Qwen2 with q/k/v biases and a tied head);
# a T5 v1.1 config (gated MLP, untied head, a deeper decoder).
HF_CONFIGS = [str(Path(__file__).parent / "data" / "hf" / f"{name}-tiny.json") for name in ("mistral", "qwen2", "t5")]
MIXED.append((HF_CONFIGS[1], {"tp": 2, "pp": 2, "zero_stage": 1, "grad_accum": 2}))


# Model files (a user's own module): no sequence parallelism for them; pipeline stages cut between the
# file's blocks (autoslapo.user_pipeline), interleaved too (4 blocks = 2 ranks x 2 chunks); selective
# recomputation of the file's attention modules with TP and stages.
FILE_MATRIX: list[dict[str, Any]] = [
    {"tp": 2, "dp": 2, "ckpt_ratio": 0.5},
    {"dp": 4, "zero_stage": 2, "grad_accum": 2},
    {"tp": 2, "dp": 2, "zero_stage": 3},
    {"tp": 2, "dp": 2, "fuse_bias_gelu": True, "ckpt_ratio": 0.5, "ckpt_granularity": "selective"},
    {"tp": 4, "zero_stage": 1, "ckpt_ratio": 1.0, "grad_accum": 2},
    {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2},
    {"tp": 2, "pp": 2, "grad_accum": 2, "ckpt_ratio": 0.5, "ckpt_granularity": "selective"},
    {"pp": 2, "dp": 2, "grad_accum": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2},
]
MY_MODEL = str(Path(__file__).resolve().parents[2] / "experiments" / "my_model.py")


# What a family refuses (ALBERT: sequence parallelism) leaves the matrix; these cover it instead: its
# shared layer's calls checkpointed selectively, under ZeRO-3 with data parallelism, and split over
# pipeline stages (each holding the layer).
# An encoder-decoder (T5) refuses sequence parallelism: TP over all 4 heads, selective recomputation
# and checkpointing of every block of both stacks; pipelines cut between the stacks (MATRIX's pp 2)
# and, interleaved (4 chunks of t5-tiny's 2 + 2 blocks), inside each stack too.
MATRIX_EXTRA: dict[str, list[dict[str, Any]]] = {
    "albert": [
        {"tp": 2, "dp": 2, "ckpt_ratio": 0.75, "ckpt_granularity": "selective"},
        {"dp": 4, "zero_stage": 3, "ckpt_ratio": 0.5},
        # stages run calls of the one shared layer, its gradients summed over them (then over dp)
        {"tp": 2, "pp": 2, "grad_accum": 2, "ckpt_ratio": 0.5},
        {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2, "ckpt_ratio": 0.25, "ckpt_granularity": "selective"},
        {"pp": 4, "grad_accum": 4},  # four ranks, one call each
        {"pp": 2, "dp": 2, "grad_accum": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2},
    ],
    # pipeline stages of a convolutional net: feature maps of the cut blocks pass between them
    "wideresnet": [
        {"tp": 2, "pp": 2, "grad_accum": 2, "ckpt_ratio": 0.5},
        {"pp": 4, "grad_accum": 4},
        {"pp": 2, "dp": 2, "grad_accum": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2},
        # channels-last feature maps: under DeepSpeed's ZeRO (which re-lays the weights), over TP,
        # and sent between stages (NCHW on the wire, gradients too)
        {"dp": 4, "zero_stage": 3, "channels_last": True},
        {"tp": 2, "dp": 2, "zero_stage": 2, "ckpt_ratio": 0.5, "channels_last": True},
        {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2, "ckpt_ratio": 0.5, "channels_last": True},
    ],
    "t5": [
        {"tp": 4, "ckpt_ratio": 0.75, "ckpt_granularity": "selective"},
        {"tp": 2, "dp": 2, "zero_stage": 1, "ckpt_ratio": 1.0, "grad_accum": 2},
        {"pp": 2, "dp": 2, "zero_stage": 1, "grad_accum": 2, "pipeline_schedule": "interleaved",
         "virtual_stages": 2, "ckpt_ratio": 0.5},
        {"tp": 2, "pp": 2, "grad_accum": 4, "pipeline_schedule": "1f1b", "ckpt_ratio": 1.0,
         "ckpt_granularity": "selective"},
    ],
}


def _allowed(name: str, knobs: dict[str, Any]) -> bool:
    try:
        ScheduleConfig(**knobs).validate(_spec(name))
    except ConfigError:
        return False
    return True


def _spec(name: str) -> ModelSpec:
    if name.endswith(".py"):
        return resolve_model(name)
    # a convolutional preset keeps its image side (64: BatchNorm needs more than one value a channel)
    spec = resolve_model(name)
    return spec if is_convolutional(spec.family) else resolve_model(name, seq_len=SEQ)


def _matrix(family: str) -> list[dict[str, Any]]:
    """MATRIX less what the family refuses: a convolutional family runs without the knobs of
    attention, tokens and vocabularies (``layout.inapplicable_knobs``)."""
    spec = _spec(f"{family}-tiny")
    skip = set(inapplicable_knobs(spec, KNOBS))
    if not is_convolutional(family):
        return MATRIX
    return [kw for kw in MATRIX if not skip & set(kw)]


def _check(runs: list[tuple[str, dict[str, Any]]]) -> None:
    configs = [(_spec(n), ScheduleConfig(precision="fp32", **kw)) for n, kw in runs]
    payload = {"runs": [{"spec": s.to_dict(), "config": c.to_dict(), "steps": STEPS, "warmup": 0}
                        for s, c in configs]}
    out = launch("autoslapo.runtime.train:train_many_entry", 4, payload, timeout_s=900)
    assert out.status == "complete", (out.reason, out.logs[0][-3000:])
    for (name, kw), (spec, config), got in zip(runs, configs, out.values[0], strict=True):
        want = reference_losses(spec, global_batch=config.global_batch, micro_batch=config.micro_batch,
                                steps=STEPS)
        tol = TOL_CHANNELS_LAST if config.channels_last else TOL_CONV if is_convolutional(spec.family) else TOL
        assert got["losses"] == pytest.approx(want, abs=tol), (name, kw)
        assert len(got["losses"]) == STEPS
    # every rank agrees on the losses
    for values in out.values[1:]:
        for a, b in zip(values, out.values[0], strict=True):
            assert a["losses"] == b["losses"]


@pytest.mark.slow
def test_scheduled_losses_match_the_unscheduled_model_for_every_family() -> None:
    _check(MIXED)


@pytest.mark.slow
def test_pipelined_losses_match_for_albert_and_wideresnet() -> None:
    _check(MIXED_PIPELINES)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_full_matrix_per_family(family: str) -> None:
    name = f"{family}-tiny"
    runs = [kw for kw in [*_matrix(family), *MATRIX_EXTRA.get(family, [])] if _allowed(name, kw)]
    assert len(runs) >= 3, runs  # tp, dp, ZeRO 2 and 3, checkpointing at least
    _check([(name, kw) for kw in runs])


@pytest.mark.slow
@pytest.mark.parametrize("path", HF_CONFIGS, ids=lambda p: Path(p).stem)
def test_full_matrix_per_hf_config(path: str) -> None:
    family = _spec(path).family
    _check([(path, kw) for kw in [*MATRIX, *MATRIX_EXTRA.get(family, [])] if _allowed(path, kw)])


@pytest.mark.slow
@pytest.mark.parametrize("model", [MY_MODEL])
def test_full_matrix_for_model_files(model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    _check([(model, kw) for kw in FILE_MATRIX])


def test_deepspeed_config_and_mpu_follow_the_knobs() -> None:
    c = ScheduleConfig(tp=2, dp=4, micro_batch=3, grad_accum=5, zero_stage=3)
    d = deepspeed_config(c)
    assert d["train_batch_size"] == 3 * 5 * 4 == c.global_batch
    assert d["zero_optimization"]["stage"] == 3
    assert d["gradient_accumulation_steps"] == 5 and d["train_micro_batch_size_per_gpu"] == 3

    class Groups:
        tp, dp, pp = 2, 4, 1
        tp_rank, dp_rank, pp_rank = 1, 3, 0
        tp_group, dp_group, pp_group = "tpg", "dpg", "ppg"

    mpu = DeepSpeedMPU(Groups())
    assert (mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()) == (2, 1)
    assert (mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()) == (4, 3)
    assert mpu.get_data_parallel_group() == "dpg" and mpu.get_tensor_model_parallel_group() == "tpg"
