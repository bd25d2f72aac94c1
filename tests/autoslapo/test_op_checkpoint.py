"""Per-op recomputation (``ckpt_granularity="op"``, torchtitan's selective op policy): every other
linear output and the fused attention kernel's output kept, the rest recomputed. Equal losses and
gradients to the unscheduled model for every family that offers it, the bytes it keeps measured
against the cost model's count, and its price between full recomputation and none."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import pytest
import torch

from autoslapo import layout
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost.encdec import op_kept_block_bytes
from autoslapo.cost.estimate import estimate
from autoslapo.cost.memory import estimate_activation_bytes, layer_linears, op_kept_bytes_per_token
from autoslapo.dist import spawn
from autoslapo.errors import ConfigError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.resolve import resolve_model
from autoslapo.models.spec import FAMILIES, ModelSpec, is_convolutional
from autoslapo.plan import apply_schedule
from autoslapo.schedule import create_schedule
from autoslapo.verify import Verify
from tests.autoslapo.test_lean_kernels import MY_MODEL, train_and_compare, verify_tp2

OP = {"ckpt_ratio": 1.0, "ckpt_granularity": "op"}
OP_FAMILIES = sorted(f for f in FAMILIES if not is_convolutional(f))


@pytest.mark.parametrize("family", OP_FAMILIES)
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_op_recomputation_matches_the_unscheduled_model(family: str, kernel: str) -> None:
    spec = ModelSpec.from_name(f"{family}-tiny")
    model = build_model(spec, attn_kernel=kernel, seed=0, dropout=0.1)
    batch = example_batch(spec, 2, 32, seed=1)
    sch = create_schedule(model)
    with Verify(sch, batch, loss_fn=lambda out: out.loss) as v:
        apply_schedule(sch, spec, ScheduleConfig(attn_kernel=kernel, precision="fp32", **OP))
    assert v.mode == "train (dropout on)"  # recomputed dropout draws the same masks
    assert any(c.startswith("gradient of") for c in v.checked)
    assert sch.meta["plan"]["ckpt_granularity"] == "op"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ["arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"]]


def _allocated() -> int:
    """Bytes glibc's malloc has handed out and not had back (heap chunks in use and mmapped ones)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


def _held_after_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    model(**batch).loss.backward()  # warm: lazily built buffers are not what a forward holds
    held = []
    for _ in range(2):
        gc.collect()
        before = _allocated()
        loss = model(**batch).loss
        held.append(_allocated() - before)
        loss.backward()
        del loss
    return min(held)


# the default run measures three families (a fused q/k/v, a gated MLP, two stacks); CI all of them
MEASURED = [f if f in ("gpt2", "llama", "t5") else pytest.param(f, marks=pytest.mark.slow) for f in OP_FAMILIES]


@pytest.mark.parametrize("family", MEASURED)
def test_op_keeps_what_the_cost_model_counts(family: str) -> None:
    # a selective-checkpoint cache is not seen by saved-tensor hooks: measure what the forward leaves
    # allocated (glibc's own count), per op against full recomputation, and compare with the model
    try:
        _allocated()
    except (OSError, AttributeError):
        pytest.skip("needs glibc 2.33+ (mallinfo2) to read the allocator's bytes in use")
    torch.manual_seed(0)
    spec, b = ModelSpec.from_name(f"{family}-tiny"), 4
    s = spec.seq_len if spec.encoder_decoder else 128
    batch = example_batch(spec, b, s, seed=1)
    held = {}
    for gran in ("full", "op"):
        model = build_model(spec, attn_kernel="sdpa", seed=0, dropout=0.0)
        config = ScheduleConfig(attn_kernel="sdpa", precision="fp32", ckpt_ratio=1.0, ckpt_granularity=gran,
                                micro_batch=b)
        apply_schedule(model, spec, config)
        held[gran] = _held_after_forward(model, batch)
    if spec.encoder_decoder:  # T5: both stacks' blocks, less the input that full recomputation keeps too
        inputs = {False: b * s * spec.hidden * 4, True: b * spec.decoder_seq_len * spec.hidden * 4}
        predicted = sum(n * (op_kept_block_bytes(spec, config, dec, "autoslapo") - inputs[dec])
                        for dec, n in ((False, spec.layers), (True, spec.decoder_layers)))
    else:
        predicted = spec.layers * b * s * op_kept_bytes_per_token(spec, config)
    assert held["op"] - held["full"] == pytest.approx(predicted, rel=0.03)


def test_the_kept_products_alternate_in_the_forward_order() -> None:
    llama, gpt2 = ModelSpec.from_name("llama-7b"), ModelSpec.from_name("gpt2")
    h, f = llama.hidden, llama.ffn
    assert layer_linears(llama) == [(h, h, False), (h, h, False), (h, h, False), (h, h, True),
                                    (f, h, False), (f, h, False), (h, f, True)]
    assert [w for w, _, _ in layer_linears(gpt2)] == [3 * gpt2.hidden, gpt2.hidden, gpt2.ffn, gpt2.hidden]
    # kept: q, v, gate, down (row-parallel: whole on every rank); fused attention adds O and its lse
    config = ScheduleConfig(tp=2, attn_kernel="sdpa", **OP)
    assert op_kept_bytes_per_token(llama, config) == pytest.approx(
        2 * (h / 2 + h / 2 + f / 2 + h) + (2 * h + 4 * llama.heads) / 2)


def test_op_recomputation_matches_under_tensor_parallelism() -> None:
    verdicts = spawn(verify_tp2, 2, ["gpt2", "llama"], OP, timeout=600)[0]
    assert all(v.startswith("ok") for v in verdicts.values()), verdicts


@pytest.mark.slow
def test_op_recomputation_matches_under_tensor_parallelism_for_every_family() -> None:
    verdicts = spawn(verify_tp2, 2, OP_FAMILIES, OP, timeout=900)[0]
    assert all(v.startswith("ok") for v in verdicts.values()), verdicts


@pytest.mark.slow  # the runtime's training loop with per-op recomputation (4 ranks, ~25 s); CI runs it
def test_training_losses_match_with_op_recomputation() -> None:
    train_and_compare([("gpt2-tiny", {"tp": 2, "dp": 2, **OP}),
                       ("llama-tiny", {"pp": 2, "dp": 2, "grad_accum": 2, "zero_stage": 1, **OP})])


def test_op_is_priced_between_full_recomputation_and_none() -> None:
    model, cluster = ModelSpec.from_name("llama-7b"), ClusterSpec(gpus=8)
    base = ScheduleConfig(dp=8, micro_batch=2, zero_stage=3, attn_kernel="sdpa", loss_kernel="chunked")
    none, full, op = base, base.with_(ckpt_ratio=1.0), base.with_(**OP)
    act = [estimate_activation_bytes(model, c) for c in (full, op, none)]
    assert act[0] < act[1] < act[2]
    t_full, t_op = estimate(model, full, cluster).time, estimate(model, op, cluster).time
    # it reruns the layer less the kept products and the attention kernel: less than full, more than none
    assert 0 < t_op.recompute < t_full.recompute
    assert estimate(model, none, cluster).time.recompute == 0


def test_op_is_refused_where_it_is_not_priced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a user's module file: its traced shape does not say its products
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    spec = resolve_model(str(MY_MODEL))
    with pytest.raises(ConfigError, match="cannot take ckpt_granularity=op"):
        ScheduleConfig(**OP).validate(spec)
    assert not layout.user_knob_ok("ckpt_granularity", "op", spec)
    ScheduleConfig(ckpt_granularity="op").validate(spec)  # inert without checkpointing: not refused
    # a convolutional family has no products to alternate over
    with pytest.raises(ConfigError, match="ckpt_granularity"):
        ScheduleConfig(**OP).validate(ModelSpec.from_name("wideresnet-tiny"))


def test_t5_op_is_priced_over_both_stacks() -> None:
    t5 = ModelSpec.from_name("t5-base")
    full = ScheduleConfig(dp=8, micro_batch=8, attn_kernel="sdpa", ckpt_ratio=1.0)
    op = full.with_(ckpt_granularity="op")
    assert estimate_activation_bytes(t5, full) < estimate_activation_bytes(t5, op) < estimate_activation_bytes(
        t5, full.with_(ckpt_ratio=0.0))
    cluster = ClusterSpec(gpus=8)
    assert 0 < estimate(t5, op, cluster).time.recompute < estimate(t5, full, cluster).time.recompute
