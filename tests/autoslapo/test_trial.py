"""run_trial: statuses that are data (oom, failed, timeout), checks before launch, step statistics."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from autoslapo.config import ScheduleConfig
from autoslapo.errors import ConfigError
from autoslapo.models.spec import ModelSpec
from autoslapo.runtime import check_runnable, run_trial, summarize_steps

GPT2 = ModelSpec.from_name("gpt2-tiny", seq_len=32)


def test_a_non_finite_loss_comes_back_failed_with_the_step() -> None:
    r = run_trial(GPT2, ScheduleConfig(precision="fp32"), steps=4, warmup=1, timeout_s=300, device="cpu",
                  lr=1e30)
    assert r.status == "failed"
    assert r.reason.startswith("loss became") and "at step" in r.reason
    assert r.final_loss is None and r.samples_per_s == 0.0


def test_a_memory_cap_below_the_runtime_comes_back_oom() -> None:
    r = run_trial(GPT2, ScheduleConfig(precision="fp32", dp=2), steps=3, warmup=1, timeout_s=300,
                  device="cpu", mem_cap_bytes=150 * 2**20)
    assert r.status == "oom"
    assert "cap of 150 MiB" in r.reason and "(evidence: memory-cap monitor)" in r.reason
    assert r.extra["oom_evidence"] == "memory-cap monitor"
    assert r.extra["memory_kind"] == "cpu_peak_rss"


def test_a_trial_longer_than_its_timeout_comes_back_timeout() -> None:
    r = run_trial(GPT2, ScheduleConfig(precision="fp32", dp=2), steps=3, warmup=1, timeout_s=2, device="cpu")
    assert r.status == "timeout"
    assert "2 s" in r.reason


@pytest.mark.parametrize(
    ("spec", "config", "match"),
    [
        (ModelSpec.from_name("llama-tiny"), ScheduleConfig(tp=4, dp=1), "tp must divide the attention heads"),
        (GPT2, ScheduleConfig(tp=3), "tp must divide the attention heads"),
        (GPT2, ScheduleConfig(pp=2, grad_accum=1), "micro-batch per stage"),
        (GPT2, ScheduleConfig(attn_kernel="flash"), "flash needs a CUDA device"),
    ],
)
def test_configurations_the_runtime_cannot_run_are_rejected_before_launch(
    spec: ModelSpec, config: ScheduleConfig, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        check_runnable(spec, config, device="cpu")
    with pytest.raises(ConfigError, match=match):
        run_trial(spec, config, steps=2, warmup=1, timeout_s=5, device="cpu")


def test_pipelines_with_zero_3_are_rejected_and_with_zero_2_accepted() -> None:
    with pytest.raises(ConfigError, match="pipelines support ZeRO 0-2"):
        ScheduleConfig(pp=2, grad_accum=2, zero_stage=3)
    check_runnable(GPT2, ScheduleConfig(pp=2, dp=2, grad_accum=2, zero_stage=2, precision="fp32"), device="cpu")


@pytest.mark.parametrize(("steps", "warmup"), [(2, 2), (3, -1), (1, 1)])
def test_bad_step_counts_are_rejected(steps: int, warmup: int) -> None:
    with pytest.raises(ConfigError, match="more steps than warm-up"):
        run_trial(GPT2, ScheduleConfig(), steps=steps, warmup=warmup, device="cpu")


def test_step_statistics_are_median_and_interquartile_range() -> None:
    assert summarize_steps([]) == (0.0, 0.0)
    assert summarize_steps([2.0]) == (2.0, 0.0)
    med, iqr = summarize_steps([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0
    assert iqr == pytest.approx(2.0)


def test_tensor_parallel_bf16_on_cpu_ranks_completes() -> None:
    # Regression: the tuner's trials are bf16 (ScheduleConfig's default) where the tests and
    # `autoslapo run` on CPU were fp32. Under bf16 autocast a row-parallel Linear with a bias (BERT's
    # attention output and MLP out) gave a bf16 partial sum on tp rank 0 and an fp32 one on rank 1
    # (fp32 bias subtracted), so the all-reduce mismatched and every tp > 1 trial failed.
    bert = ModelSpec.from_name("bert-tiny", seq_len=32)
    config = ScheduleConfig(tp=2, micro_batch=1, grad_accum=2, attn_kernel="eager", precision="bf16")
    r = run_trial(bert, config, steps=2, warmup=1, timeout_s=300, device="cpu")
    assert r.status == "complete", r.reason
    assert r.final_loss is not None and 0.0 < r.final_loss < 20.0


def _rank_pids(parent: int) -> list[int]:
    """Rank processes (``autoslapo.runtime.worker``) whose parent is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"autoslapo.runtime.worker" in cmd:
            found.append(int(entry))
    return sorted(found)


def test_a_rank_killed_with_sigkill_and_no_cap_reached_comes_back_failed() -> None:
    # A kill -9 from outside is not evidence of an out-of-memory: the trial is failed, not oom.
    def kill_a_rank() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pids = _rank_pids(os.getpid())
            if len(pids) == 2:
                time.sleep(1.0)
                os.kill(pids[-1], signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_rank)
    killer.start()
    r = run_trial(GPT2, ScheduleConfig(precision="fp32", dp=2), steps=200, warmup=1, timeout_s=300,
                  device="cpu", mem_cap_bytes=8 * 2**30)
    killer.join()
    assert r.status == "failed", r.reason
    assert "killed by signal 9 (SIGKILL), no out-of-memory evidence" in r.reason
    assert "oom_evidence" not in r.extra
