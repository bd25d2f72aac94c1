"""The cost model: per-device memory and step time of a schedule on a described cluster. Pure.

``estimate(model, config, cluster)`` predicts one schedule; ``best_config(model, cluster, **fixed)``
searches every valid schedule exhaustively; ``sweep`` estimates many. No torch, ray, sqlalchemy or
subprocess is imported here; measuring this machine's profile is the runtime's job
(``autoslapo.runtime.profile``), reading and fitting one is ``autoslapo.cost.profile``'s.
"""

from __future__ import annotations

from autoslapo.cost.device import PERF, DevicePerf, device_perf
from autoslapo.cost.estimate import Estimate, estimate
from autoslapo.cost.flops import hw_flops_per_sample, model_flops_per_sample
from autoslapo.cost.memory import MemoryBreakdown, estimate_memory
from autoslapo.cost.search import best_config, candidate_configs, sweep
from autoslapo.cost.time import TimeBreakdown, estimate_time

__all__ = [
    "PERF",
    "DevicePerf",
    "Estimate",
    "MemoryBreakdown",
    "TimeBreakdown",
    "best_config",
    "candidate_configs",
    "device_perf",
    "estimate",
    "estimate_memory",
    "estimate_time",
    "hw_flops_per_sample",
    "model_flops_per_sample",
    "sweep",
]
