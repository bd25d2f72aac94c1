"""The RMSNorm kernel knob (``norm_kernel``): one autograd op in place of transformers' chain, equal
to it in values and gradients, keeping less for backward by the bytes the cost model counts, and
priced and searched where a family has RMSNorms (LLaMA, T5) and refused where it has none."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.t5.modeling_t5 import T5LayerNorm

from autoslapo.cluster import ClusterSpec
from autoslapo.config import KNOB, RMS_NORM_FAMILIES, ScheduleConfig
from autoslapo.cost import candidate_configs
from autoslapo.cost.estimate import estimate
from autoslapo.cost.kernels import rms_norm_saved_extra
from autoslapo.cost.memory import estimate_activation_bytes
from autoslapo.errors import ConfigError, ScheduleError
from autoslapo.models.build import build_model, example_batch
from autoslapo.models.spec import ModelSpec
from autoslapo.plan import apply_schedule
from autoslapo.primitives.norm import is_rms_norm, rms_norm
from autoslapo.schedule import create_schedule
from autoslapo.verify import Verify
from tests.autoslapo.saved import saved_activation_bytes

NORMS = [(LlamaRMSNorm, True), (T5LayerNorm, False)]
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
          (torch.bfloat16, torch.float32), (torch.float64, torch.float64)]


def _saved(fn: object) -> tuple[int, torch.Tensor]:
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()  # type: ignore[operator]
    return sum(seen.values()), out


@pytest.mark.parametrize(("cls", "llama"), NORMS, ids=["llama", "t5"])
@pytest.mark.parametrize(("x_dtype", "w_dtype"), DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_the_one_op_norm_equals_transformers_chain(cls: type[nn.Module], llama: bool, x_dtype: torch.dtype,
                                                   w_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    mod = cls(64).to(w_dtype)
    with torch.no_grad():
        mod.weight.normal_()
    x = torch.randn(3, 5, 64, dtype=x_dtype, requires_grad=True)
    grad = torch.randn(3, 5, 64)
    want = mod(x)
    (want * grad.to(want.dtype)).sum().backward()
    want_dx, want_dw = x.grad, mod.weight.grad
    x.grad, mod.weight.grad = None, None
    got = rms_norm(x, mod.weight, mod.variance_epsilon, llama=llama)
    (got * grad.to(got.dtype)).sum().backward()
    assert got.dtype == want.dtype and torch.equal(got, want)  # the same ops forward
    assert torch.equal(mod.weight.grad, want_dw)
    # dx: the same formula in another order (T5's 16-bit chain rounds its two paths to the input's dtype)
    tol = 1e-2 if x_dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(x.grad, want_dx, rtol=tol, atol=tol * want_dx.abs().max().item())


@pytest.mark.parametrize(("cls", "llama"), NORMS, ids=["llama", "t5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_it_keeps_its_input_and_one_rstd_a_row_and_the_cost_model_counts_what_the_chain_keeps_more(
        cls: type[nn.Module], llama: bool, dtype: torch.dtype) -> None:
    mod = cls(256).to(dtype)
    x = torch.randn(64, 256, dtype=dtype, requires_grad=True)
    chain, _ = _saved(lambda: mod(x))
    lean, _ = _saved(lambda: rms_norm(x, mod.weight, mod.variance_epsilon, llama=llama))
    weight = mod.weight.untyped_storage().nbytes()
    assert lean == x.untyped_storage().nbytes() + 64 * 4 + weight  # x, rstd (fp32 a row), the weight
    family = "llama" if llama else "t5"
    assert (chain - lean) / x.numel() == rms_norm_saved_extra(family, x.element_size(), "eager", False, False)


def test_the_primitive_swaps_the_forward_and_back_and_a_deep_copy_runs_its_own_weight() -> None:
    norm = LlamaRMSNorm(8)
    sch = create_schedule(nn.Sequential(norm))
    x = torch.randn(2, 8)
    want = norm(x)
    sch["0"].rms_norm_kernel("fused")
    assert "forward" in vars(norm) and torch.equal(norm(x), want)
    twin = copy.deepcopy(norm)
    with torch.no_grad():
        twin.weight.mul_(2)
    torch.testing.assert_close(twin(x), 2 * want)  # bound to the copy, not to the original
    sch["0"].rms_norm_kernel("eager")
    assert "forward" not in vars(norm)
    with pytest.raises(ScheduleError, match="needs an RMSNorm module"):
        create_schedule(nn.Sequential(nn.LayerNorm(8)))["0"].rms_norm_kernel("fused")
    with pytest.raises(ScheduleError, match="norm kernel must be one of eager, fused"):
        sch["0"].rms_norm_kernel("apex")


@pytest.mark.parametrize("family", RMS_NORM_FAMILIES)
def test_the_schedule_runs_every_rmsnorm_fused_and_equals_the_unscheduled_model(family: str) -> None:
    spec = ModelSpec.from_name(f"{family}-tiny")
    model = build_model(spec, seed=0, dropout=0.1)
    batch = example_batch(spec, 2, 32, seed=1)
    sch = create_schedule(model)
    with Verify(sch, batch, loss_fn=lambda out: out.loss) as v:
        apply_schedule(sch, spec, ScheduleConfig(precision="fp32", norm_kernel="fused", ckpt_ratio=0.5))
    assert any(c.startswith("gradient of") for c in v.checked)
    norms = [m for m in model.modules() if is_rms_norm(m)]
    assert norms and all("forward" in vars(m) for m in norms)  # the layers' and the final ones
    assert sch.meta["plan"]["norm_kernel"] == "fused"


@pytest.mark.parametrize("family", RMS_NORM_FAMILIES)
def test_the_cost_model_predicts_the_saved_bytes_it_measures(family: str) -> None:
    """Under autoslapo's runtime (fp32 here; its autocast keeps an fp32 residual stream) the eager
    chain keeps 4 bytes an element of every norm more than the one-op kernel: measured on the tiny
    preset, layers and final norms, and predicted to the byte."""
    spec = ModelSpec.from_name(f"{family}-tiny")
    batch = example_batch(spec, 4, seed=1)
    got, want = {}, {}
    for kernel in ("eager", "fused"):
        config = ScheduleConfig(precision="fp32", micro_batch=4, norm_kernel=kernel)
        model = build_model(spec, seed=0, dropout=0.0)
        apply_schedule(model, spec, config)
        got[kernel] = saved_activation_bytes(model, batch)[0]
        want[kernel] = estimate_activation_bytes(spec, config, dropout=False, runtime="autoslapo")
    assert got["eager"] > got["fused"]
    assert want["eager"] - want["fused"] == got["eager"] - got["fused"]


def test_the_knob_is_priced_searched_and_refused_by_family() -> None:
    cluster = ClusterSpec(gpus=8, gpu_type="h100-80gb")
    llama = ModelSpec.from_name("llama-7b")
    eager = ScheduleConfig(dp=8, micro_batch=2, zero_stage=2)
    fused = eager.with_(norm_kernel="fused")
    e, f = estimate(llama, eager, cluster), estimate(llama, fused, cluster)
    assert f.time.total < e.time.total and f.memory_per_device_bytes < e.memory_per_device_bytes
    # compiled layers fuse the chain either way: the knob then moves only the final norm
    compiled = eager.with_(compile_layers=True)
    c_e, c_f = estimate(llama, compiled, cluster), estimate(llama, compiled.with_(norm_kernel="fused"), cluster)
    assert 0 <= c_e.memory_per_device_bytes - c_f.memory_per_device_bytes < 0.1 * (
        e.memory_per_device_bytes - f.memory_per_device_bytes)
    # the sweep tries both kernels for LLaMA, only the default for BERT (LayerNorm, one kernel already)
    pins: dict[str, Any] = dict(tp=1, pp=1, micro_batch=2, zero_stage=2, global_batch=16)
    kernels = {c.norm_kernel for group in candidate_configs(llama, cluster, **pins) for c in group}
    assert kernels == set(KNOB["norm_kernel"].choices)
    bert = ModelSpec.from_name("bert-large")
    assert {c.norm_kernel for group in candidate_configs(bert, cluster, **pins) for c in group} == {"eager"}
    with pytest.raises(ConfigError, match="norm_kernel applies to the llama, t5 families only"):
        fused.validate(bert, cluster)


@pytest.mark.slow
def test_training_losses_match_with_the_fused_norm_under_zero3_and_a_pipeline() -> None:
    # ZeRO-3 gathers each norm's weight in its module hooks, around the swapped forward; a pipeline
    # stage runs the layers' and (last stage) the final norm fused
    from tests.autoslapo.test_lean_kernels import train_and_compare

    train_and_compare([("llama-tiny", {"dp": 4, "zero_stage": 3, "norm_kernel": "fused"}),
                       ("llama-tiny", {"tp": 2, "pp": 2, "grad_accum": 2, "norm_kernel": "fused", "ckpt_ratio": 1.0})])


@pytest.mark.slow
def test_training_losses_match_with_the_fused_norm_for_t5() -> None:
    from tests.autoslapo.test_lean_kernels import train_and_compare

    train_and_compare([("t5-tiny", {"dp": 4, "zero_stage": 3, "norm_kernel": "fused"}),
                       ("t5-tiny", {"tp": 2, "dp": 2, "norm_kernel": "fused", "ckpt_ratio": 1.0,
                                    "ckpt_granularity": "selective"})])
