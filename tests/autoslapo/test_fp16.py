"""fp16 training with dynamic loss scaling (``autoslapo.runtime.scaler``) on CPU ranks.

Each layout trains under fp16 autocast with the loss scaled and every parameter's gradient
unscaled where it is produced, so its losses equal the unscheduled model's trained the same way
(``reference_losses(precision="fp16")``). The tiny GPT-2's activation gradients overflow fp16 from
a loss scale of about 2**20 (measured on the one-process run: none at 2**19, every step at 2**26 and
above); the default 2**16 never overflows, and from 2**30 every step overflows: each is skipped on
every rank (weights and moments untouched, or the losses would part from the reference's, which
skips them too) and the scale halves each time. (Between the two the step where a layout's scale
meets the threshold can differ from the reference's by its order of sums, so the test keeps away.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec
from autoslapo.runtime.check import check_runnable
from autoslapo.runtime.launcher import launch
from autoslapo.runtime.scaler import DynamicLossScaler, SkippableAdamW
from autoslapo.runtime.train import reference_losses

HERE = "tests.autoslapo.test_fp16"
STEPS = 4
SPEC = ModelSpec.from_name("gpt2-tiny", seq_len=32)
# DeepSpeed with TP and ZeRO-0, DeepSpeed's ZeRO-3, a pipeline with ZeRO-2 over its dp group
LAYOUTS = [dict(tp=2, dp=2), dict(dp=4, zero_stage=3), dict(pp=2, dp=2, zero_stage=2)]
# fp16 on CPU: the layouts differ from the one-process run by the order of sums (measured <= 3e-5);
# a step applied where the reference skipped it (or the reverse) moves the loss by >= 2e-2.
TOL = 1e-4


@pytest.mark.slow
def test_fp16_layouts_match_the_unscheduled_model_and_skip_the_same_overflowing_steps() -> None:
    runs = [(kw, scale) for scale in (2.0**16, 2.0**30) for kw in LAYOUTS]
    configs = [ScheduleConfig(precision="fp16", micro_batch=2, grad_accum=2, **kw) for kw, _ in runs]
    payload = {"runs": [{"spec": SPEC.to_dict(), "config": c.to_dict(), "steps": STEPS, "warmup": 0,
                         "loss_scale": scale} for c, (_, scale) in zip(configs, runs, strict=True)]}
    out = launch("autoslapo.runtime.train:train_many_entry", 4, payload, timeout_s=900)
    assert out.status == "complete", (out.reason, out.logs[0][-3000:])
    fp32 = reference_losses(SPEC, global_batch=8, micro_batch=2, steps=STEPS)
    for i, ((kw, scale), config, got) in enumerate(zip(runs, configs, out.values[0], strict=True)):
        want = reference_losses(SPEC, global_batch=config.global_batch, micro_batch=2, steps=STEPS,
                                precision="fp16", loss_scale=scale)
        assert got["losses"] == pytest.approx(want, abs=TOL), (kw, scale)
        skipped = 0 if scale == 2.0**16 else STEPS
        assert got["skipped_steps"] == skipped, (kw, scale)
        assert got["loss_scale"] == scale / 2**skipped
        if skipped:  # no step changed the weights: step 1's loss is not the trained model's
            assert abs(got["losses"][1] - fp32[1]) > 10 * TOL
        for values in out.values[1:]:  # every rank skipped the same steps and agrees on the losses
            mine = values[i]
            assert mine["losses"] == got["losses"] and mine["skipped_steps"] == skipped


def overflow_on_rank_1(ctx: Any, payload: dict[str, Any]) -> list[bool]:
    """Rank 1 alone sees an infinite gradient in step 0; both ranks must skip step 0 and not step 1."""
    scaler = DynamicLossScaler("cpu")
    w = torch.nn.Parameter(torch.ones(3))
    scaler.attach([w])
    out = []
    for step in range(2):
        x = torch.tensor([1.0, float("inf") if step == 0 and ctx.rank == 1 else 2.0, 3.0])
        scaler.scale_loss((w * x).sum()).backward()
        out.append(scaler.end_step())
    assert dist.get_world_size() == 2
    return out


def test_one_rank_s_overflow_skips_the_step_on_every_rank() -> None:
    out = launch(f"{HERE}:overflow_on_rank_1", 2, timeout_s=120)
    assert out.status == "complete", out.reason
    assert out.values == [[True, False], [True, False]]


def test_the_scale_halves_on_overflow_and_doubles_after_its_growth_interval() -> None:
    scaler = DynamicLossScaler("cpu", init_scale=8.0, growth_interval=2, distributed=False)
    w = torch.nn.Parameter(torch.tensor([2.0]))
    scaler.attach([w])
    scaler.scale_loss(w.sum() * 3.0).backward()
    assert w.grad is not None and w.grad.item() == 3.0  # unscaled where produced
    assert scaler.should_skip() is False
    for skipped, want in ((True, 4.0), (False, 4.0), (False, 8.0), (True, 4.0)):
        scaler.update(skipped)
        assert scaler.scale == want
    assert scaler.state() == {"loss_scale": 4.0, "skipped_steps": 2}
    opt = SkippableAdamW([w], lr=0.1)
    opt.skip = True
    opt.step()
    assert w.item() == 2.0
    opt.skip = False
    opt.step()
    assert w.item() != 2.0
    with pytest.raises(ValueError, match="growth_factor > 1"):
        DynamicLossScaler("cpu", growth_factor=1.0)


def test_fp16_is_runnable() -> None:
    check_runnable(SPEC, ScheduleConfig(precision="fp16", tp=2), device="cpu")


def engine_compute_dtypes(ctx: Any, payload: dict[str, Any]) -> list[list[str]]:
    """The dtype of a Linear's output inside DeepSpeed's engine, called with and without an outer
    autocast, when DeepSpeed reads the autocast flag of the device in use (as it does on CUDA:
    ``torch.is_autocast_enabled()`` without a device is CUDA's flag, so on CPU it would not see it)."""
    import deepspeed.runtime.torch_autocast as ds_autocast

    from autoslapo.dist import build_groups
    from autoslapo.runtime.engine import build_deepspeed_engine
    from autoslapo.runtime.train import build_scheduled, step_batch

    real = torch.is_autocast_enabled

    class _DeviceFlag:  # DeepSpeed's module-level ``torch`` with CUDA's semantics for this device
        def __getattr__(self, name: str) -> Any:
            if name == "is_autocast_enabled":
                return lambda *a: real(*a) if a else real("cpu")
            return getattr(torch, name)

    ds_autocast.torch = _DeviceFlag()  # type: ignore[assignment]
    groups = build_groups(1, 1, 1, device_type="cpu")
    out: list[list[str]] = []
    for precision in payload["precisions"]:
        config = ScheduleConfig(precision=precision, micro_batch=2)
        _, model = build_scheduled(SPEC, config, groups, seed=0, device="cpu", dropout=0.0)
        engine = build_deepspeed_engine(model, config, groups, lr=1e-3, device_type="cpu")
        seen: list[str] = []
        linear = next(m for m in engine.module.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda _m, _i, o, seen=seen: seen.append(str(o.dtype)))
        batch = step_batch(SPEC, 2, 0, 0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            engine(**batch)
        engine(**batch)
        out.append(seen)
    return out


def test_the_engine_computes_in_the_schedule_s_precision_whatever_deepspeed_does_with_outer_autocast() -> None:
    # Regression: DeepSpeed's forward turns off an autocast entered outside it unless its own
    # torch_autocast is configured; on a GPU every pp == 1 bf16 trial trained in fp32. (An fp32
    # schedule under an outer bf16 autocast: DeepSpeed turns that off, so fp32 both times.)
    want = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
    out = launch(f"{HERE}:engine_compute_dtypes", 1, {"precisions": list(want)}, timeout_s=300)
    assert out.status == "complete", (out.reason, out.logs[0][-3000:])
    assert out.values[0] == [[dtype, dtype] for dtype in want.values()]
