"""``measure_profile``: measure this machine's achievable rates for the cost model (side effects).

Runs ``world`` CPU ranks over gloo at once (as ``autoslapo run`` does, so they contend for cores
and memory bandwidth the same way) and measures, per rank: GEMM rates over a range of sizes (fp32),
copy bandwidth, the per-op dispatch cost of eager autograd, the resident memory of a process with
torch and a gloo group, and the ring allreduce's bandwidth and per-hop latency. The result is a
JSON-safe dict that ``ClusterSpec.with_profile`` and ``DevicePerf.from_profile`` apply. On a GPU
node the same keys can be filled for that GPU type; this module measures CPU ranks only.

Imports torch lazily, inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_DIR = Path("~/.cache/autoslapo/profiles")


def default_profile_path(gpu_type: str) -> Path:
    """Where a profile for ``gpu_type`` is saved by default."""
    return DEFAULT_DIR.expanduser() / f"{gpu_type}.json"


def save_profile(profile: dict[str, Any], path: Path) -> Path:
    """Write ``profile`` as JSON to ``path`` (parents created); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def load_profile(path: Path) -> dict[str, Any]:
    """Read a saved profile. Raises ``UsageError`` if it is missing or not a profile."""
    from autoslapo.errors import UsageError

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"profile not found: {path}; run `autoslapo profile` first") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"profile {path} is not readable JSON: {e}; re-run `autoslapo profile`") from None
    if not isinstance(data, dict) or "gpu_type" not in data:
        raise UsageError(f"{path} is not an autoslapo profile (no gpu_type); re-run `autoslapo profile`")
    return data


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
    layer checkpointed, micro-batch 16. With ``A`` the activations the model predicts for a run and
    ``F`` those of the same run un-checkpointed, peak RSS = fixed + states + s A + r F:

    * the two un-checkpointed runs (A = F) give the slope ``s + r``;
    * checkpointing at micro-batch 16 changes only A, which gives ``s`` (``activation_slack``:
      autograd's temporaries beyond the accounted tensors) and so ``r`` (``heap_retention``: what
      the allocator keeps of the activations every layer builds in forward and rebuilds in
      backward, see ``DevicePerf``);
    * the intercept, less the model states, is the process's fixed overhead.
    """
    try:
        from autoslapo.models.build import build_model
        from autoslapo.plan import apply_schedule
    except ImportError:
        return {}
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost.memory import estimate_activation_bytes, estimate_state_bytes
    from autoslapo.models.spec import ModelSpec

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
    total = (peaks["b16"] - peaks["b4"]) / (pred["b16"] - pred["b4"])
    slack = (peaks["b16"] - peaks["b16_ckpt"]) / (pred["b16"] - pred["b16_ckpt"])
    # s may fall below 1: the transients the model counts at the backward peak (a layer's gradients)
    # are not all live at once in a checkpointed step
    total = max(total, 0.5)
    slack = min(max(slack, 0.5), total)
    retention = max(total - slack, 0.0)
    # the model that steps holds weights, gradients and Adam's state; the idle one weights and state
    w, g, o = estimate_state_bytes(spec, ScheduleConfig(precision="fp32"), "autoslapo")
    fixed = peaks["b4"] - (slack + retention) * pred["b4"] - (w + g + o) - (w + o)
    return {"activation_slack": slack, "heap_retention": retention, "fixed_overhead_bytes": int(max(fixed, 0)),
            "calibration_peaks": peaks}


def _rank(rank: int, world: int, init: str, threads: int, out_dir: str, quick: bool) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        dist.barrier()
        # A trial's process also holds the training stack (transformers, DeepSpeed, the runtime):
        # load what of it is installed so the resident baseline matches what `autoslapo run` sees.
        import importlib

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
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The tiny model of the runtime calibration: its step is almost all fixed cost.
TINY = {"family": "bert", "hidden": 64, "layers": 2, "heads": 2, "ffn": 256, "seq_len": 32, "vocab": 512,
        "preset": "profile-tiny", "max_positions": 64}


def calibrate_runtime(profile: dict[str, Any], world: int, steps: int = 9, warmup: int = 2) -> dict[str, Any]:
    """Fixed costs of autoslapo's runtime, from two tiny real trials (``run_trial``) on ``world`` ranks.

    A tiny model's step is almost all fixed cost: DeepSpeed's engine bookkeeping, Python dispatch,
    barriers. One optimizer step of 1 micro-batch and one of 4 give a cost a step and a cost a
    micro-batch, each the measured step time less what the cost model (with ``profile``'s rates
    and no fixed cost) predicts for the tiny model's compute and communication. The first trial's
    peak resident memory, less the states, activations and buffers the model predicts, is the
    process's fixed memory (Python, torch, transformers, DeepSpeed, gloo); a third trial with
    ZeRO-1 gives what DeepSpeed's ZeRO optimizer adds on top. Returns the keys
    ``step_overhead_s``, ``microbatch_overhead_s``, ``fixed_overhead_bytes``,
    ``zero_overhead_bytes`` and the raw figures;
    ``{}`` where the runtime is not installed. Raises ``TrialError`` when a trial fails.
    """
    try:
        from autoslapo.runtime import run_trial
    except ImportError:
        return {}
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost.estimate import estimate
    from autoslapo.errors import TrialError
    from autoslapo.models.spec import ModelSpec

    spec = ModelSpec.from_dict(TINY)
    cluster = ClusterSpec(gpus=world, gpu_type="cpu", gpus_per_node=world).with_profile(profile)
    bare = {**profile, "step_overhead_s": 0.0, "microbatch_overhead_s": 0.0, "fixed_overhead_bytes": 0}
    out: dict[str, Any] = {}
    residual = {}
    for accum, zero in ((1, 0), (4, 0), (1, 1)):
        cfg = ScheduleConfig(dp=world, micro_batch=2, grad_accum=accum, zero_stage=zero, precision="fp32")
        res = run_trial(spec, cfg, steps=steps, warmup=warmup, timeout_s=600, device="cpu", dropout=0.0)
        if res.status != "complete" or res.step_time_s is None:
            raise TrialError(f"runtime calibration trial failed ({res.status}): {res.reason}")
        est = estimate(spec, cfg, cluster, profile=bare, dropout=False)
        unexplained = res.peak_memory_bytes - est.memory_per_device_bytes
        if zero:
            out["zero_overhead_bytes"] = int(max(unexplained - out["fixed_overhead_bytes"], 0))
            out["calibration_peak_rss_bytes_zero1"] = res.peak_memory_bytes
            continue
        residual[accum] = res.step_time_s - est.step_time_s
        out[f"calibration_step_s_accum{accum}"] = res.step_time_s
        if accum == 1:
            out["fixed_overhead_bytes"] = int(max(unexplained, 0))
            out["calibration_peak_rss_bytes"] = res.peak_memory_bytes
    # A one-micro-batch step carries one micro-batch's overhead: its residual bounds the figure (a
    # loaded machine can slow the 4-micro-batch trial alone and inflate the difference).
    per_mb = min(max((residual[4] - residual[1]) / 3, 0.0), max(residual[1], 0.0))
    out["microbatch_overhead_s"] = per_mb
    out["step_overhead_s"] = max(residual[1] - per_mb, 0.0)
    return out


def measure_profile(world: int = 2, threads: int | None = None, quick: bool = False,
                    runtime: bool = True) -> dict[str, Any]:
    """Measure ``world`` concurrent CPU ranks over gloo; returns a ``cpu`` profile dict.

    Takes the rank count, torch threads a rank (default: cores // world), ``quick`` (fewer GEMM
    sizes) and ``runtime`` (also calibrate the runtime's fixed costs with two tiny real trials, see
    ``calibrate_runtime``). The load average while measuring is recorded (``load_avg``).
    Raises ``TrialError`` if a rank or a calibration trial fails.
    """
    import torch.multiprocessing as mp

    from autoslapo.errors import TrialError

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
    # Slowest rank governs a synchronous step: take the minimum rate, the maximum latency.
    curve = [(ranks[0]["gemm_curve"][i][0], min(r["gemm_curve"][i][1] for r in ranks))
             for i in range(len(ranks[0]["gemm_curve"]))]
    small = max(r["allreduce_small_s"] for r in ranks)
    big = max(r["allreduce_big_s"] for r in ranks)
    nbytes = ranks[0]["allreduce_big_bytes"]
    steps = 2 * (world - 1)
    hop = small / max(1, steps)
    # ring: big = 2 (p-1)/p * n / bw + 2 (p-1) * hop
    bw = (2 * (world - 1) / world * nbytes) / max(big - steps * hop, 1e-9) / 1e9 if world > 1 else 1.0
    peak = max(r for _, r in curve)
    total_mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    prof = {
        "gpu_type": "cpu",
        "host": socket.gethostname(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "world": world,
        "threads_per_rank": threads,
        "peak_tflops": peak,
        "peak_tflops_fp32": peak,
        "gemm_curve": curve,
        "hbm_gbps": min(r["hbm_gbps"] for r in ranks),
        "mem_curve": [(ranks[0]["mem_curve"][i][0], min(r["mem_curve"][i][1] for r in ranks))
                      for i in range(len(ranks[0]["mem_curve"]))],
        "op_latency_s": max(r["op_latency_s"] for r in ranks),
        "coll_latency_s": hop,
        "intra_node_gbps": bw,
        "inter_node_gbps": bw,
        "comm_eff": 1.0,
        # measured by a training step where the model builder exists; else the loaded stack's RSS
        "fixed_overhead_bytes": int(max(r.get("fixed_overhead_bytes") or r["rss_bytes"] for r in ranks)),
        "activation_slack": max(r.get("activation_slack", 1.0) for r in ranks),
        "heap_retention": max(r.get("heap_retention", 0.0) for r in ranks),
        "memory_bytes": int(total_mem // world),
        "load_avg": os.getloadavg()[0],
    }
    if runtime:
        prof.update(calibrate_runtime(prof, world))
    return prof
