"""Benchmark the cost model: latency of one estimate and of an exhaustive 10^4-point sweep.

Run: ``.venv/bin/python experiments/bench_cost_model.py``; writes
``experiments/results/bench_cost_model.txt``.
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import best_config, estimate, sweep
from autoslapo.cost.device import device_perf
from autoslapo.cost.search import candidate_configs
from autoslapo.models.spec import ModelSpec

OUT = Path(__file__).parent / "results" / "bench_cost_model.txt"


def main() -> None:
    lines = [f"# cost model benchmark ({platform.python_implementation()} {platform.python_version()}, "
             f"{platform.machine()})"]
    model = ModelSpec.from_name("gpt2-xl", heads=32, hidden=2048, ffn=8192)
    cluster = ClusterSpec(gpus=64, gpu_type="a100-80gb")
    cfg = ScheduleConfig(tp=4, pp=4, dp=4, micro_batch=2, grad_accum=16, ckpt_ratio=0.5, zero_stage=1)
    perf = device_perf(cluster)
    for label, kwargs in (("estimate (validated)", {}), ("estimate (fast path, no re-validation)",
                                                         {"perf": perf, "validate": False})):
        runs = []
        for _ in range(5):
            n, t0 = 2000, time.perf_counter()
            for _ in range(n):
                estimate(model, cfg, cluster, **kwargs)  # type: ignore[arg-type]
            runs.append((time.perf_counter() - t0) / n)
        lines.append(f"{label}: median {statistics.median(runs) * 1e6:.1f} us, best {min(runs) * 1e6:.1f} us")

    # An exhaustive space of at least 10^4 valid configs: every layout on 64 GPUs x micro-batch x
    # checkpoint ratio x ZeRO stage x attention kernel x sequence parallelism x compiled layers.
    t0 = time.perf_counter()
    configs = [c for flag in (False, True)
               for g in candidate_configs(model, cluster, global_batch=512, compile_layers=flag) for c in g]
    t_enum = time.perf_counter() - t0
    t0 = time.perf_counter()
    ests = sweep(model, cluster, configs)
    t_sweep = time.perf_counter() - t0
    best = max((e for e in ests if e.fits), key=lambda e: e.samples_per_s)
    lines.append(f"sweep: {len(configs)} valid configs of {model.preset}(h=2048) on 64 x a100-80gb, "
                 f"global batch 512: enumerate {t_enum:.2f} s, estimate {t_sweep:.2f} s "
                 f"({t_sweep / len(configs) * 1e6:.1f} us each)")
    c = best.config
    lines.append(f"  best: tp={c.tp} pp={c.pp} dp={c.dp} mb={c.micro_batch} ckpt={c.ckpt_ratio} zero={c.zero_stage} "
                 f"attn={c.attn_kernel} sp={c.sequence_parallel}: {best.samples_per_s:.1f} samples/s, "
                 f"{best.tflops_per_device:.1f} TFLOP/s a GPU")
    t0 = time.perf_counter()
    b2 = best_config(model, cluster, global_batch=512, compile_layers=False)
    plain = max((e for e in ests if e.fits and not e.config.compile_layers), key=lambda e: e.samples_per_s)
    lines.append(f"best_config, compile_layers off (stops growing the micro-batch at the first OOM): "
                 f"{b2.breakdown['searched']} estimated in {time.perf_counter() - t0:.2f} s; "
                 f"same best as the exhaustive sweep: {b2.config == plain.config}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)


if __name__ == "__main__":
    main()
