"""``TrialResult``: what one trial of one configuration gave, measured or estimated. Pure data."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from autoslapo.errors import ConfigError

TrialStatus = Literal["complete", "oom", "failed", "timeout", "pruned"]
STATUSES: tuple[str, ...] = ("complete", "oom", "failed", "timeout", "pruned")


@dataclass(frozen=True)
class TrialResult:
    """Outcome of a trial. A failed trial is data: ``status`` and ``reason`` say what happened.

    Throughputs are for the whole job (all devices); ``tflops_per_device`` counts model FLOPs
    (Megatron's 6*N*tokens-style count, no recomputation), ``hw_tflops_per_device`` includes the
    recomputed forward passes. ``peak_memory_bytes`` is the largest per-device peak. Step times
    are the median over timed steps after warm-up and their spread (interquartile range).
    """

    status: TrialStatus
    reason: str = ""
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0
    tflops_per_device: float = 0.0
    hw_tflops_per_device: float = 0.0
    peak_memory_bytes: int = 0
    step_time_s: float = 0.0
    step_time_spread_s: float = 0.0
    final_loss: float | None = None
    measured: bool = True
    host: str = ""
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ConfigError(f"trial status must be one of {', '.join(STATUSES)}: got {self.status!r}")
        if self.status == "complete" and not self.samples_per_s > 0:
            raise ConfigError(f"a complete trial needs a positive throughput: got {self.samples_per_s!r}")
        if self.final_loss is not None and not math.isfinite(self.final_loss):
            raise ConfigError(f"final_loss must be finite when given: got {self.final_loss!r}")

    @property
    def ok(self) -> bool:
        return self.status == "complete"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict; ``TrialResult.from_dict(r.to_dict()) == r``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialResult:
        """Inverse of ``to_dict``; unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown trial result keys {unknown}; valid keys are {sorted(known)}")
        return cls(**d)

    @classmethod
    def failure(cls, status: TrialStatus, reason: str, *, measured: bool = True, host: str = "",
                **extra: Any) -> TrialResult:
        """A non-complete result with its reason (first line only, trimmed to 500 characters)."""
        line = (reason.strip().splitlines() or [""])[0][:500]
        return cls(status=status, reason=line, measured=measured, host=host, extra=dict(extra))


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the ``(memory, throughput)`` points no other point beats on both (less memory,
    more throughput), in increasing memory order: throughput rises along the front. Ties on
    memory keep the faster point; a point as fast as a lighter one is dropped."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    keep: list[int] = []
    best = -math.inf
    for i in order:
        if points[i][1] > best:
            keep.append(i)
            best = points[i][1]
    return keep
