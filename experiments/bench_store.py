"""Benchmark the store: insert rates, and the best-schedule query over 100,000 trials.

    .venv/bin/python experiments/bench_store.py [--trials 100000] [--no-postgres] [--pg-url URL]

Runs on SQLite (a temporary file) and on PostgreSQL: ``--pg-url``, else a private server started
with tests/pgserver.py when the binaries are installed. Target: best() under 50 ms on SQLite.
Committed output: experiments/results/bench_store.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store import Store, open_store  # noqa: E402

STUDIES = 10  # half of them match the query (same model, GPU count and type)
SINGLE = 2_000
BATCH = 5_000
TARGET_MS = 50.0


def _study_kwargs(i: int) -> dict[str, Any]:
    gpus = 64 if i % 2 == 0 else 32
    return dict(
        model=dict(
            family="bert",
            preset="bert-large",
            hidden=1024,
            layers=24,
            heads=16,
            kv_heads=16,
            ffn=4096,
            seq_len=512,
            vocab=30522,
        ),
        cluster=dict(gpus=gpus, gpus_per_node=8, gpu_type="a100-80gb", memory_bytes=80 * 2**30),
        space_name="transformer",
        space_version="1",
        objective="samples_per_s",
        backend="sim",
        model_signature="sig-bert-large",
        cluster_fingerprint=f"fp-{gpus}",
    )


def _trial(n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    status = ("complete", "complete", "complete", "oom", "failed", "pruned")[n % 6]
    config = dict(
        tp=2 ** (n % 4),
        pp=2 ** (n % 3),
        micro_batch=n,
        ckpt_ratio=(n % 5) / 4,
        zero=n % 4,
        attention=("sdpa", "flash", "eager")[n % 3],
    )
    speed = (n * 7919) % 100_003 / 10.0 if status == "complete" else None
    result = dict(
        status=status,
        reason="" if status == "complete" else f"{status} at step 1",
        samples_per_s=speed,
        tokens_per_s=None if speed is None else speed * 512,
        tflops_per_device=None if speed is None else speed / 100,
        peak_memory_bytes=(20 + n % 62) * 2**30,
        step_time_s=0.5,
        step_time_spread_s=0.01,
        measured=n % 10 == 0,
        host="bench",
    )
    return config, result


def _ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    fn()  # warm the caches and the statement cache
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def run(url: str, trials: int, label: str) -> list[str]:
    """Fill a fresh store at ``url`` and time inserts and queries; return the report lines."""
    lines = [f"== {label}"]
    start = time.perf_counter()
    db: Store = open_store(url)
    lines.append(f"open (create + migrate): {(time.perf_counter() - start) * 1000:.0f} ms")
    for i in range(STUDIES):
        db.create_study(f"s{i}", **_study_kwargs(i))

    start = time.perf_counter()
    for n in range(SINGLE):
        db.add_trial("s0", n, *_trial(n))
    rate = SINGLE / (time.perf_counter() - start)
    lines.append(f"add_trial, one transaction each: {rate:,.0f} trials/s ({SINGLE:,} trials)")

    start = time.perf_counter()
    n, stored = SINGLE, SINGLE
    while stored < trials:
        study = f"s{(stored // BATCH) % STUDIES}"
        count = min(BATCH, trials - stored)
        db.add_trials(study, [(n + k, *_trial(n + k)) for k in range(count)])
        n, stored = n + count, stored + count
    bulk = (trials - SINGLE) / (time.perf_counter() - start)
    lines.append(f"add_trials, batches of {BATCH:,}: {bulk:,.0f} trials/s ({trials - SINGLE:,} trials)")
    total = sum(db.count_trials(f"s{i}") for i in range(STUDIES))
    lines.append(f"trials stored: {total:,} in {STUDIES} studies ({STUDIES // 2} match the query)")

    queries: list[tuple[str, Callable[[], object]]] = [
        ("best(bert-large, 64, a100-80gb)", lambda: db.best_trials("bert-large", 64, "a100-80gb")),
        ("best(..., measured_only=True)", lambda: db.best_trials("bert-large", 64, "a100-80gb", measured_only=True)),
        (
            "best(..., min_headroom_fraction=0.5)",
            lambda: db.best_trials("bert-large", 64, "a100-80gb", min_headroom_fraction=0.5),
        ),
        ("best(..., limit=10, by signature)", lambda: db.best_trials("sig-bert-large", 64, "a100-80gb", limit=10)),
    ]
    for name, query in queries:
        median, worst = _ms(query, repeat=30)
        verdict = (
            ""
            if "sqlite" not in label
            else (" (target < 50 ms: " + ("met)" if median < TARGET_MS else "MISSED)"))
        )
        lines.append(f"{name}: median {median:.2f} ms, max {worst:.2f} ms{verdict}")
    best = db.best_trials("bert-large", 64, "a100-80gb")[0]
    lines.append(f"  -> study {best.study} trial {best.number}: {best.samples_per_s:,.1f} samples/s")
    median, _ = _ms(lambda: db.trials("s0"), repeat=3)
    lines.append(f"trials(s0) ({db.count_trials('s0'):,} rows as records): median {median:.0f} ms")
    median, _ = _ms(lambda: db.to_dataframe("s1"), repeat=3)
    lines.append(f"to_dataframe(s1): median {median:.0f} ms")
    db.close()
    start = time.perf_counter()
    open_store(url).close()
    lines.append(f"reopen (integrity check + revision check): {(time.perf_counter() - start) * 1000:.0f} ms")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--pg-url", default=os.environ.get("AUTOSLAPO_BENCH_PG_URL"))
    args = parser.parse_args()

    print(
        f"# bench_store: {args.trials:,} trials; python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for line in run(f"sqlite:///{tmp}/bench.db", args.trials, "sqlite (WAL, synchronous=NORMAL)"):
            print(line, flush=True)
        size = Path(tmp, "bench.db").stat().st_size
        print(f"file size: {size / 2**20:.1f} MiB", flush=True)
    if args.no_postgres:
        return
    if args.pg_url:
        for line in run(args.pg_url, args.trials, "postgresql (given URL)"):
            print(line, flush=True)
        return
    from tests.pgserver import PgServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"== postgresql: skipped ({reason})")
        return
    with PgServer() as server:
        url = server.create_database("bench")
        for line in run(url, args.trials, "postgresql 15 (private server, fsync off)"):
            print(line, flush=True)


if __name__ == "__main__":
    main()
