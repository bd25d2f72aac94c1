"""``estimate(model, config, cluster)``: throughput, memory and fit of one schedule. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoslapo.cost.conv import estimate_conv_memory, estimate_conv_time
from autoslapo.cost.device import DevicePerf, device_perf
from autoslapo.cost.flops import hw_flops_per_sample, model_flops_per_sample
from autoslapo.cost.memory import MemoryBreakdown, estimate_memory
from autoslapo.cost.time import TimeBreakdown, estimate_time
from autoslapo.models.spec import is_convolutional

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.spec import ModelSpec
    from autoslapo.result import TrialResult


@dataclass(frozen=True)
class Estimate:
    """What the cost model predicts for one schedule on one cluster (whole-job throughputs)."""

    samples_per_s: float
    tokens_per_s: float
    tflops_per_device: float
    hw_tflops_per_device: float
    memory_per_device_bytes: int
    memory_capacity_bytes: int
    fits: bool
    step_time_s: float
    config: ScheduleConfig
    memory: MemoryBreakdown
    time: TimeBreakdown
    breakdown: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict: the headline figures, the config and both breakdowns."""
        return {
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_device": self.tflops_per_device,
            "hw_tflops_per_device": self.hw_tflops_per_device,
            "memory_per_device_bytes": self.memory_per_device_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "config": self.config.to_dict(),
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
        }

    def to_trial_result(self) -> TrialResult:
        """The estimate as an unmeasured ``TrialResult``; ``oom`` when it does not fit."""
        from autoslapo.result import TrialResult

        extra: dict[str, Any] = {"estimate": self.to_dict()}
        if not self.fits:
            return TrialResult.failure(
                "oom",
                f"predicted {self.memory_per_device_bytes / 2**30:.1f} GiB per device exceeds "
                f"{self.memory_capacity_bytes / 2**30:.1f} GiB",
                measured=False, estimate=extra["estimate"],
            )
        return TrialResult(
            status="complete",
            samples_per_s=self.samples_per_s,
            tokens_per_s=self.tokens_per_s,
            tflops_per_device=self.tflops_per_device,
            hw_tflops_per_device=self.hw_tflops_per_device,
            peak_memory_bytes=self.memory_per_device_bytes,
            step_time_s=self.step_time_s,
            measured=False,
            extra=extra,
        )


def estimate_family_memory(model: ModelSpec, config: ScheduleConfig, perf: DevicePerf,
                           dropout: bool | None = None) -> MemoryBreakdown:
    """Per-device memory by the terms of ``model``'s family: ``estimate_memory`` (transformers) or
    ``autoslapo.cost.conv.estimate_conv_memory`` (a convolutional family)."""
    if is_convolutional(model.family):
        return estimate_conv_memory(model, config, perf)
    return estimate_memory(model, config, perf, dropout)


def estimate(model: ModelSpec, config: ScheduleConfig, cluster: ClusterSpec, *,
             profile: dict[str, Any] | None = None, perf: DevicePerf | None = None,
             validate: bool = True, dropout: bool | None = None) -> Estimate:
    """Predict throughput and per-device memory of ``config`` for ``model`` on ``cluster``.

    Takes an optional measured ``profile`` (from ``autoslapo profile``; its device figures should
    already be applied to ``cluster`` with ``ClusterSpec.with_profile``) or a ready ``perf``.
    ``dropout``: whether training applies dropout (default: the family's; the local runtime trains
    with it off). Returns an ``Estimate``. Raises ``ConfigError`` when the config does not suit the model or
    cluster (``validate=False`` skips that check, for sweeps that built valid configs).
    """
    if validate:
        config.validate(model, cluster)
    if perf is None:
        perf = device_perf(cluster, profile)
    mem = estimate_family_memory(model, config, perf, dropout)
    if is_convolutional(model.family):  # WideResNet: convolutions, not a transformer's layers
        tb = estimate_conv_time(model, config, cluster, perf)
    else:
        tb = estimate_time(model, config, cluster, perf, dropout)
    step = tb.total
    samples = config.global_batch / step
    world = config.world_size
    return Estimate(
        samples_per_s=samples,
        tokens_per_s=samples * model.seq_len,
        tflops_per_device=samples * model_flops_per_sample(model) / world / 1e12,
        hw_tflops_per_device=samples * hw_flops_per_sample(model, config) / world / 1e12,
        memory_per_device_bytes=mem.total,
        memory_capacity_bytes=cluster.memory_bytes,
        fits=mem.total <= cluster.memory_bytes,
        step_time_s=step,
        config=config,
        memory=mem,
        time=tb,
    )
