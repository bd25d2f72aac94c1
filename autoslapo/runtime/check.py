"""Can the runtime run this configuration here? Checked before any process starts.

``ScheduleConfig.validate`` says whether a configuration makes sense for a model; this module adds
what the runtime's engines cannot do together, and what this machine lacks. Pure apart from asking
torch how many GPUs there are (only for ``device="cuda"``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError, UsageError
from autoslapo.models.spec import ModelSpec

__all__ = ["check_fits_here", "check_runnable", "resolve_device", "runtime_limits"]

MAX_CPU_RANKS = 64
#: /proc/meminfo: the memory Linux says it can give new processes without swapping (``check_fits_here``).
MEMINFO = "/proc/meminfo"
# What the runtime trains in (fp16 with dynamic loss scaling, ``autoslapo.runtime.scaler``).
RUNTIME_PRECISIONS = ("bf16", "fp16", "fp32")


def resolve_device(device: str, world_size: int) -> str:
    """``auto`` -> ``cuda`` when at least one GPU is visible, else ``cpu``; others pass through.

    Raises: ConfigError for an unknown device name.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda: got {device!r}")
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 1 else "cpu"
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cpu"


def check_runnable(spec: ModelSpec, config: ScheduleConfig, *, device: str = "cpu",
                   this_machine: bool = True) -> None:
    """Raise ConfigError (rule, values, fix) if the runtime cannot run ``config`` on ``device``.

    ``this_machine=False``: the ranks run on other machines (a trial spanning a Ray cluster, whose
    placement group reserves their devices), so this machine's GPU count is not checked.

    Rules beyond ``config.validate(spec)``:
    * flash attention needs CUDA and the ``flash_attn`` package;
    * ZeRO-3 with pp > 1: a pipeline stage keeps its weights whole, so ZeRO 0-2 fit (already a
      ``ScheduleConfig`` rule, repeated for old configs);
    * a pipeline needs at least as many micro-batches (``grad_accum``) as stages;
    * cuda: one GPU per rank; cpu: at most 64 ranks.
    """
    config.validate(spec)
    if config.attn_kernel == "flash":
        if device != "cuda":
            raise ConfigError(f"attn_kernel flash needs a CUDA device: got device={device}; use sdpa or eager")
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError("attn_kernel flash needs the flash_attn package, which is not installed; use sdpa")
    if config.pp > 1 and config.zero_stage >= 3:
        raise ConfigError(
            f"zero_stage {config.zero_stage} cannot run with pipeline parallelism (pp={config.pp}): "
            "pipelines support ZeRO 0-2; use zero_stage <= 2 or pp=1"
        )
    stages = config.pp * config.virtual_stages
    if config.pp > 1 and config.grad_accum < config.pp:
        raise ConfigError(
            f"a pipeline needs at least one micro-batch per stage: got grad_accum={config.grad_accum} "
            f"micro-batches for pp={config.pp} ({stages} stages); raise grad_accum to >= {config.pp}"
        )
    if device == "cuda" and this_machine:
        import torch

        have = torch.cuda.device_count()
        if config.world_size > have:
            raise ConfigError(
                f"the runtime runs one rank per GPU: got tp*pp*dp={config.world_size} ranks with {have} "
                f"GPU(s) here; lower the degrees or run on CPU ranks"
            )
    elif config.world_size > MAX_CPU_RANKS:
        raise ConfigError(
            f"CPU trials run at most {MAX_CPU_RANKS} ranks: got tp*pp*dp={config.world_size}; "
            "lower the degrees or use the sim backend"
        )


def runtime_limits(model: ModelSpec, gpu_type: str) -> dict[str, Any]:
    """What an estimate of this runtime on a cluster of ``gpu_type`` devices needs
    (``cost.answer.calibrated_ranking``'s ``refusal`` and ``precisions``): why the runtime cannot
    run a configuration ("" when it can; ``check_runnable`` on the cluster's devices, not this
    machine's) and the precisions it trains in."""
    device = "cpu" if gpu_type == "cpu" else "cuda"

    def refusal(config: ScheduleConfig) -> str:
        try:
            check_runnable(model, config, device=device, this_machine=False)
        except UsageError as err:
            return str(err)
        return ""

    return {"refusal": refusal, "precisions": RUNTIME_PRECISIONS}


def check_seed(seed: object, state: str) -> None:
    """UsageError unless ``seed`` is a whole number from 0 to 2**32 - 1, what numpy's and torch's
    generators and Optuna's samplers take (``run``'s and ``tune``'s ``--seed``); ``state``: what it seeds."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise UsageError(f"--seed must be a whole number from 0 to 2**32 - 1 (4,294,967,295; {state}): got {seed!r}")


def memory_available_bytes(path: str = MEMINFO) -> int | None:
    """``MemAvailable`` of ``path`` in bytes: what Linux can give new processes without swapping
    (None where there is no such file or line: not Linux, or a kernel before 3.14)."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits_here(spec: ModelSpec, config: ScheduleConfig, *, device: str, fix: str,
                    available: int | None = None) -> None:
    """UsageError when ``config``'s CPU ranks need more memory than this machine has available, by
    the cost model's memory for autoslapo's runtime on a CPU rank (its fixed 400 MiB a process, the
    weights, optimizer state and activations), times the ranks. On the shapes measured it is at or
    below the real peak (bert-tiny's tuned trials within 1 %; at sequence 8,192, micro-batch 4,
    1,369 MiB predicted against a 1,644 MiB peak), so it refuses only what cannot fit by a margin
    the model does not see, not every shape that would. Checked before any process starts,
    as a shape too large for the machine would otherwise swap until its timeout or wake the kernel's
    out-of-memory killer. ``fix``: what the command's user can change. ``available``: bytes (default:
    ``memory_available_bytes``; without it nothing is checked). GPU ranks are not checked here: a
    device out of memory fails at once and is reported as oom."""
    if device != "cpu":
        return
    have = memory_available_bytes() if available is None else available
    if have is None:
        return
    from autoslapo.cost.device import PERF
    from autoslapo.cost.estimate import estimate_family_memory

    try:
        per_rank = estimate_family_memory(spec, config, PERF["cpu"], dropout=False).total
    except ConfigError:  # a shape the cost model cannot price: the runtime's own checks speak
        return
    need = per_rank * config.world_size
    if need > have:
        gib = 2**30
        raise UsageError(f"the ranks must fit in this machine's available memory: {config.world_size} CPU rank"
                         f"{'s need' if config.world_size != 1 else ' needs'} at least {need / gib:.1f} GiB by the cost model "
                         f"({per_rank / gib:.1f} GiB a rank) and {have / gib:.1f} GiB is available; {fix}")
