"""``measure_profile``: measure this machine's achievable rates for the cost model (side effects).

Runs ``world`` CPU ranks over gloo at once (as ``autoslapo run`` does, so they contend for cores
and memory bandwidth the same way) and measures, per rank: GEMM rates over a range of sizes (fp32),
copy bandwidth, the per-op dispatch cost of eager autograd, the resident memory of a process with
torch and a gloo group, and the ring allreduce's bandwidth and per-hop latency; then calibrates the
runtime's fixed costs with tiny real trials (``run_trial``). The arithmetic that turns these
measurements into a profile is pure and lives in ``autoslapo.cost.profile``. On a GPU node the same
keys can be filled for that GPU type; this module measures CPU ranks only.

Imports torch inside the functions: ``autoslapo profile --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost.estimate import estimate
from autoslapo.cost.memory import estimate_activation_bytes, estimate_state_bytes
from autoslapo.cost.profile import (
    CalibrationRun,
    combine_rank_measurements,
    fit_memory_calibration,
    fit_runtime_overheads,
)
from autoslapo.errors import TrialError
from autoslapo.models.spec import ModelSpec
from autoslapo.runtime.trial import run_trial

__all__ = ["TINY", "calibrate_runtime", "measure_profile"]

# The tiny model of the runtime calibration: its step is almost all fixed cost.
TINY = {"family": "bert", "hidden": 64, "layers": 2, "heads": 2, "ffn": 256, "seq_len": 32, "vocab": 512,
        "preset": "profile-tiny", "max_positions": 64}


def _timeit(fn: Any, min_time: float = 0.1, warmup: int = 2, repeats: int = 3) -> float:
    """Seconds a call: the fastest of ``repeats`` windows of at least ``min_time`` each.

    On a shared machine other processes take the core for parts of a window; the fastest window
    is the rate this rank reaches when it has its core, which is what a trial's steps (each a
    median over several) see most of the time.
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            el = time.perf_counter() - start
            if el >= min_time and n >= 3:
                break
        best = min(best, el / n)
    return best


def _timed_collective(fn: Any, n: int, dist: Any) -> float:
    for _ in range(3):
        fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> bool:
    # Writing 5 to clear_refs resets the peak resident set (Linux >= 4.0).
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory_calibration(torch: Any) -> dict[str, Any]:
    """Peak RSS of real training steps, against the cost model's activation terms.

    Three runs of a small GPT-2 in this process, in rising order of peak (so what the heap kept
    from one run does not hide the next one's growth): micro-batch 4, micro-batch 16 with every
    layer checkpointed, micro-batch 16; ``fit_memory_calibration`` fits them.
    """
    try:
        from autoslapo.models.build import build_model
        from autoslapo.plan import apply_schedule
    except ImportError:  # transformers absent: no model to step
        return {}

    spec = ModelSpec(family="gpt2", hidden=256, layers=4, heads=4, ffn=1024, seq_len=128, vocab=2048,
                     preset="profile", max_positions=128)
    runs = {"b4": ScheduleConfig(micro_batch=4, precision="fp32"),
            "b16_ckpt": ScheduleConfig(micro_batch=16, ckpt_ratio=1.0, precision="fp32"),
            "b16": ScheduleConfig(micro_batch=16, precision="fp32")}
    plain = build_model(spec, attn_kernel="sdpa", seed=0, dropout=0.0)
    ckpt = build_model(spec, attn_kernel="sdpa", seed=0, dropout=0.0)
    apply_schedule(ckpt, spec, runs["b16_ckpt"])  # tp 1: only the checkpointing applies
    models = {"b4": plain, "b16_ckpt": ckpt, "b16": plain}
    opts = {id(m): torch.optim.Adam(m.parameters(), lr=1e-4) for m in (plain, ckpt)}

    def step(model: Any, b: int) -> None:
        model.train()
        ids = torch.randint(0, spec.vocab, (b, spec.seq_len))
        model(input_ids=ids, labels=ids).loss.backward()
        opts[id(model)].step()
        opts[id(model)].zero_grad(set_to_none=True)

    for model, b in ((plain, 4), (plain, 4), (ckpt, 1)):  # both models' optimizer states exist from here on
        step(model, b)
    peaks = {}
    for name, cfg in runs.items():
        if not _reset_hwm():
            return {}
        for _ in range(4):  # as a trial does: repeated steps fragment the heap the allocator keeps
            step(models[name], cfg.micro_batch)
        peaks[name] = _hwm_bytes()
    pred = {name: estimate_activation_bytes(spec, cfg, dropout=False, runtime="autoslapo", transients=True)
            for name, cfg in runs.items()}
    # the model that steps holds weights, gradients and Adam's state; the idle one weights and state
    w, g, o = estimate_state_bytes(spec, ScheduleConfig(precision="fp32"), "autoslapo")
    return fit_memory_calibration(peaks, pred, (w + g + o) + (w + o))


def _rank(rank: int, world: int, init: str, threads: int, out_dir: str, quick: bool) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        dist.barrier()
        # A trial's process also holds the training stack (transformers, DeepSpeed, the runtime):
        # load what of it is installed so the resident baseline matches what `autoslapo run` sees.
        for name in ("transformers", "deepspeed", "autoslapo.models.build", "autoslapo.runtime.train",
                     "autoslapo.runtime.engine"):
            with contextlib.suppress(Exception):  # an absent optional module just isn't counted
                importlib.import_module(name)
        dist.barrier()
        res: dict[str, Any] = {"rss_bytes": _rss_bytes()}
        # First, before the benchmarks' large buffers inflate the heap the allocator keeps.
        res.update(_memory_calibration(torch))
        dist.barrier()
        sizes = [(256, 64, 256), (512, 256, 512), (1024, 512, 1024), (2048, 1024, 1024)]
        if not quick:
            sizes = [(128, 32, 128), *sizes, (4096, 1024, 2048)]
        # Copy bandwidth by size: small tensors stay in the caches, large ones stream from DRAM.
        copies = (64 * 1024, 1024 * 1024, 16 * 1024 * 1024)  # elements: 256 KiB .. 64 MiB
        # Round-robin over the sizes, keeping each one's fastest window: a change in the machine's
        # load while profiling then affects every size alike instead of bending the curve.
        gemm_t = [float("inf")] * len(sizes)
        copy_t = [float("inf")] * len(copies)
        mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in sizes]
        bufs = [(torch.randn(n), torch.empty(n)) for n in copies]
        for _ in range(3):
            for i, (a, b) in enumerate(mats):
                dist.barrier()
                gemm_t[i] = min(gemm_t[i], _timeit(lambda a=a, b=b: torch.mm(a, b), repeats=1))
            for i, (x, y) in enumerate(bufs):
                dist.barrier()
                copy_t[i] = min(copy_t[i], _timeit(lambda x=x, y=y: y.copy_(x), repeats=1))
        del mats, bufs
        res["gemm_curve"] = [(2.0 * m * k * n, 2.0 * m * k * n / t / 1e12)
                             for (m, k, n), t in zip(sizes, gemm_t, strict=True)]
        mem_curve = [(2.0 * n * 4, 2 * n * 4 / t / 1e9) for n, t in zip(copies, copy_t, strict=True)]
        res["mem_curve"] = mem_curve
        res["hbm_gbps"] = mem_curve[-1][1]
        w = torch.randn(8, requires_grad=True)

        def tiny() -> None:
            z = w
            for _ in range(50):
                z = z * 1.0001
            z.sum().backward()

        res["op_latency_s"] = _timeit(tiny) / 101  # 50 forward + 50 backward nodes + the rest
        # Collectives: every rank must issue the same number, so count iterations, not time.
        lat_buf = torch.zeros(16)
        res["allreduce_small_s"] = _timed_collective(lambda: dist.all_reduce(lat_buf), 50, dist)
        big = torch.zeros(4 * 1024 * 1024)  # 16 MiB
        res["allreduce_big_s"] = _timed_collective(lambda: dist.all_reduce(big), 10, dist)
        res["allreduce_big_bytes"] = big.numel() * 4
        res["rss_after_bytes"] = _rss_bytes()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # The results are on disk and every rank is past the last barrier: leave without the
    # interpreter's teardown, where background threads of gloo (and of DeepSpeed, imported above)
    # can abort a finished rank ("terminate called without an active exception", SIGABRT), which
    # failed a measurement that had completed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def calibrate_runtime(profile: dict[str, Any], world: int, steps: int = 9, warmup: int = 2) -> dict[str, Any]:
    """Fixed costs of autoslapo's runtime, from three tiny real trials (``run_trial``) on ``world`` ranks.

    A tiny model's step is almost all fixed cost: DeepSpeed's engine bookkeeping, Python dispatch,
    barriers. Runs 1 and 4 micro-batches a step, and 1 under ZeRO-1, and compares each to what the
    cost model (with ``profile``'s rates and no fixed cost) predicts; ``fit_runtime_overheads``
    turns the differences into ``step_overhead_s``, ``microbatch_overhead_s``,
    ``fixed_overhead_bytes`` and ``zero_overhead_bytes`` (plus the raw figures), which it returns.
    Raises ``TrialError`` when a trial fails.
    """
    spec = ModelSpec.from_dict(TINY)
    cluster = ClusterSpec(gpus=world, gpu_type="cpu", gpus_per_node=world).with_profile(profile)
    bare = {**profile, "step_overhead_s": 0.0, "microbatch_overhead_s": 0.0, "fixed_overhead_bytes": 0}
    runs = []
    for accum, zero in ((1, 0), (4, 0), (1, 1)):
        cfg = ScheduleConfig(dp=world, micro_batch=2, grad_accum=accum, zero_stage=zero, precision="fp32")
        res = run_trial(spec, cfg, steps=steps, warmup=warmup, timeout_s=600, device="cpu", dropout=0.0)
        if res.status != "complete" or res.step_time_s is None:
            raise TrialError(f"runtime calibration trial failed ({res.status}): {res.reason}")
        est = estimate(spec, cfg, cluster, profile=bare, dropout=False)
        runs.append(CalibrationRun(grad_accum=accum, zero_stage=zero, step_s=res.step_time_s,
                                   predicted_step_s=est.step_time_s, peak_bytes=res.peak_memory_bytes,
                                   predicted_bytes=est.memory_per_device_bytes))
    return fit_runtime_overheads(runs)


def measure_profile(world: int = 2, threads: int | None = None, quick: bool = False,
                    runtime: bool = True) -> dict[str, Any]:
    """Measure ``world`` concurrent CPU ranks over gloo; returns a ``cpu`` profile dict.

    Takes the rank count, torch threads a rank (default: cores // world), ``quick`` (fewer GEMM
    sizes) and ``runtime`` (also calibrate the runtime's fixed costs with tiny real trials, see
    ``calibrate_runtime``). The load average while measuring is recorded (``load_avg``).
    Raises ``TrialError`` if a rank or a calibration trial fails.
    """
    import torch.multiprocessing as mp

    cores = os.cpu_count() or 1
    threads = threads or max(1, cores // world)
    with tempfile.TemporaryDirectory(prefix="autoslapo-profile-") as out:
        init = f"tcp://127.0.0.1:{_free_port()}"
        try:
            mp.start_processes(_rank, args=(world, init, threads, out, quick), nprocs=world,
                               join=True, start_method="spawn")
        except Exception as e:  # a rank's traceback arrives as ProcessRaisedException
            raise TrialError(f"profile rank failed: {str(e).strip().splitlines()[-1][:300]}") from None
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    total_mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    prof = {
        "gpu_type": "cpu",
        "host": socket.gethostname(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "world": world,
        "threads_per_rank": threads,
        **combine_rank_measurements(ranks, world),
        "memory_bytes": int(total_mem // world),
        "load_avg": os.getloadavg()[0],
    }
    if runtime:
        prof.update(calibrate_runtime(prof, world))
    return prof
