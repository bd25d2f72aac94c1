"""``run_trial``: one configuration, trained for real on local ranks, measured as a TrialResult.

Called in-process by the tuner's local backend and by Ray trainables; it starts the rank processes
itself (``autoslapo.runtime.launcher``) and never raises for what happens in them: a crash, a hang,
a non-finite loss or an out-of-memory is a TrialResult with its status and reason.

Measurement: a step is one optimizer step (all micro-batches), timed from barrier to barrier on
every rank; the trial reports the median of the steps after warm-up and their interquartile range.
samples/s = global batch / median step; tokens/s = samples/s * seq_len; TFLOP/s per device from
``autoslapo.cost.flops`` (Megatron's count; ``hw_`` adds recomputed forwards). Peak memory per
device: CUDA ``max_memory_allocated``; CPU the peak resident set (``VmHWM`` / ``ru_maxrss``) of each
rank process, which includes the Python + torch runtime (~0.3-0.5 GB). ``extra`` says which.
"""

from __future__ import annotations

import platform
import statistics
from typing import Any

from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.result import TrialResult
from autoslapo.runtime.check import check_runnable, resolve_device
from autoslapo.runtime.launcher import launch

__all__ = ["run_trial", "summarize_steps"]

ENTRY = "autoslapo.runtime.train:train_entry"


def summarize_steps(times: list[float]) -> tuple[float, float]:
    """Median and interquartile range of step times (IQR 0 for fewer than 2 steps)."""
    if not times:
        return 0.0, 0.0
    med = statistics.median(times)
    if len(times) < 2:
        return med, 0.0
    q = statistics.quantiles(times, n=4, method="inclusive")
    return med, q[2] - q[0]


def _strip_rank(reason: str) -> str:
    # "rank 0: FloatingPointError: loss became nan at step 3" -> "loss became nan at step 3"
    marker = "FloatingPointError: "
    return reason.split(marker, 1)[1] if marker in reason else reason


def run_trial(
    spec: ModelSpec,
    config: ScheduleConfig,
    *,
    steps: int = 6,
    warmup: int = 2,
    timeout_s: float = 600.0,
    mem_cap_bytes: int | None = None,
    device: str = "auto",
    seed: int = 0,
    data: str = "random",
    lr: float = 1e-3,
    dropout: float | None = 0.0,
    ranks_per_node: list[int] | None = None,
    threads: int | None = None,
) -> TrialResult:
    """Run ``config`` on ``config.world_size`` local ranks (or across machines) and measure it.

    Takes: the model spec and knobs; optimizer steps in all and how many of them are warm-up (not
    timed); the wall-clock limit for the whole trial (start-up included); an optional per-rank
    memory cap (CPU: peak resident memory; going over it is status ``oom``; an ``oom`` result names
    its evidence in ``extra["oom_evidence"]``); ``device`` auto, cpu
    (gloo ranks) or cuda (nccl, one GPU per rank); the seed of weights and data; ``data`` (only
    "random": the family's example batches); learning rate; dropout (0: off, ``None``: the family's);
    ``ranks_per_node``: split the ranks over that many machines of the Ray cluster this process is
    joined to (``autoslapo.runtime.multinode``; Ray must be initialized), else all run here;
    ``threads`` per CPU rank (default: this machine's cores shared out over the ranks).
    Returns: a TrialResult (complete, oom, failed or timeout).
    Raises: ConfigError before anything starts when the configuration cannot run here
    (``check_runnable``) or the arguments are bad.
    """
    if not isinstance(steps, int) or not isinstance(warmup, int) or warmup < 0 or steps <= warmup:
        raise ConfigError(
            f"a trial needs more steps than warm-up steps: got steps={steps}, warmup={warmup}; "
            "raise steps or lower warmup"
        )
    if data != "random":
        raise ConfigError(f"data must be 'random' (the family's example batches): got {data!r}")
    if timeout_s <= 0:
        raise ConfigError(f"timeout_s must be positive: got {timeout_s}")
    dev = resolve_device(device, config.world_size)
    spans = ranks_per_node is not None and len(ranks_per_node) > 1
    check_runnable(spec, config, device=dev, this_machine=not spans)
    payload = {
        "spec": spec.to_dict(),
        "config": config.to_dict(),
        "steps": steps,
        "warmup": warmup,
        "seed": seed,
        "lr": lr,
        "dropout": dropout,
    }
    if spans:
        assert ranks_per_node is not None
        if sum(ranks_per_node) != config.world_size:
            raise ConfigError(f"the ranks of the machines must add up to the world size: got {ranks_per_node} "
                              f"for tp*pp*dp = {config.world_size}; split {config.world_size} ranks")
        from autoslapo.runtime.multinode import launch_on_nodes

        out = launch_on_nodes(ENTRY, payload, ranks_per_node, timeout_s=timeout_s, mem_cap_bytes=mem_cap_bytes,
                              device=dev, bundle_offset=1)
    else:
        out = launch(ENTRY, config.world_size, payload, timeout_s=timeout_s, mem_cap_bytes=mem_cap_bytes,
                     device=dev, threads=threads)
    host = platform.node()
    peaks = out.peak_rss_bytes
    memory_kind = "cuda_max_allocated" if dev == "cuda" else "cpu_peak_rss"
    common: dict[str, Any] = {
        "device": dev,
        "world_size": config.world_size,
        "memory_kind": memory_kind,
        "peak_rss_bytes_per_rank": peaks,
        "wall_s": round(out.elapsed_s, 3),
        "machines": len(ranks_per_node) if ranks_per_node else 1,
    }
    if out.status == "oom":
        common["oom_evidence"] = out.oom_evidence
    if out.status != "complete":
        return TrialResult.failure(out.status, _strip_rank(out.reason), host=host, **common)
    values = [v for v in out.values if isinstance(v, dict)]
    first = next((v for v in values if v.get("rank") == 0), values[0])
    times = [float(t) for t in first["step_times_s"]]
    # A step ends at a barrier, so every rank sees the same step; the slowest rank's clock is the
    # step time (they differ only by how late each left the barrier).
    per_rank = [[float(t) for t in v["step_times_s"]] for v in values]
    times = [max(ts) for ts in zip(*per_rank, strict=True)] if per_rank else times
    median, spread = summarize_steps(times)
    if not median > 0:
        return TrialResult.failure("failed", "no timed step was recorded", host=host, **common)
    from autoslapo.cost.flops import hw_flops_per_sample, model_flops_per_sample

    samples = config.global_batch / median
    world = config.world_size
    tflops = model_flops_per_sample(spec) * samples / world / 1e12
    hw_tflops = hw_flops_per_sample(spec, config) * samples / world / 1e12
    if dev == "cuda":
        mem = [int(v.get("peak_memory_bytes") or 0) for v in values]
    else:
        mem = list(peaks)
    losses = [float(x) for x in first["losses"]]
    return TrialResult(
        status="complete",
        samples_per_s=samples,
        tokens_per_s=samples * spec.seq_len,
        tflops_per_device=tflops,
        hw_tflops_per_device=hw_tflops,
        peak_memory_bytes=max(mem) if mem else 0,
        step_time_s=median,
        step_time_spread_s=spread,
        final_loss=losses[-1] if losses else None,
        measured=True,
        host=host,
        steps=steps,
        extra={
            **common,
            "peak_memory_bytes_per_rank": mem,
            "losses": losses,
            "step_times_s": times,
            "warmup": warmup,
            "setup_s": round(float(first.get("setup_s", 0.0)), 3),
            "plan": first.get("plan", {}),
            # fp16: the loss scale the last step used and the steps skipped for overflowing gradients
            **{k: first[k] for k in ("loss_scale", "skipped_steps") if k in first},
        },
    )
