"""``autoslapo run``: one real trial, JSON output, and impossible configurations refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.cli.run import _table
from autoslapo.config import ScheduleConfig
from autoslapo.result import TrialResult


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "autoslapo", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_run_prints_a_complete_trial_as_json() -> None:
    r = _run("llama-tiny", "--gpus", "2", "--tp", "2", "--steps", "3", "--seq-len", "32", "--json",
             "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    result = TrialResult.from_dict(json.loads(r.stdout))
    assert result.status == "complete"
    assert result.samples_per_s > 0 and result.tokens_per_s == pytest.approx(result.samples_per_s * 32)
    assert result.tflops_per_device > 0 and result.peak_memory_bytes > 0
    assert result.final_loss is not None and 0 < result.final_loss < 20
    assert result.extra["plan"]["tp"] == 2
    assert len(result.extra["step_times_s"]) == 2
    # the configuration run, as the table prints it (micro-batch, accumulation, ZeRO stage ...)
    config = ScheduleConfig.from_dict(result.extra["config"])
    assert (config.tp, config.pp, config.dp) == (2, 1, 1) and config.micro_batch >= 1 and config.grad_accum >= 1


def test_a_working_directory_shadowing_the_standard_library_does_not_break_a_trial(tmp_path: Path) -> None:
    """The ranks import what the tuner imports: from the console script, the working directory is not on
    its path, so a ``queue.py`` there must not replace the standard library's in the ranks (it did)."""
    (tmp_path / "queue.py").write_text("raise RuntimeError('the working directory shadowed queue')\n")
    script = Path(sys.executable).parent / "autoslapo"
    r = subprocess.run([str(script), "run", "bert-tiny", "--gpus", "1", "--steps", "2", "--warmup", "1", "--json",
                        "--device", "cpu"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert TrialResult.from_dict(json.loads(r.stdout)).status == "complete"


@pytest.mark.slow
def test_run_wideresnet_tiny_with_tensor_parallelism() -> None:
    r = _run("wideresnet-tiny", "--gpus", "2", "--tp", "2", "--ckpt-ratio", "0.5", "--steps", "3", "--json",
             "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    result = TrialResult.from_dict(json.loads(r.stdout))
    assert result.status == "complete" and result.samples_per_s > 0 and result.tflops_per_device > 0
    assert result.extra["plan"]["sharded"] == ["conv1", "bn1", "conv2"] and result.extra["plan"]["checkpointed"] == [0, 1]
    assert result.final_loss is not None and 0 < result.final_loss < 20


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("wideresnet-tiny", "--gpus", "5", "--pp", "5"), "pipeline chunks must each hold a block: got 4 blocks for pp=5"),
        (("llama-tiny", "--gpus", "4", "--tp", "3"), "tp*pp must divide --gpus"),
        (("bert-tiny", "--gpus", "3", "--tp", "3"), "tp must divide the attention heads"),
        (("gpt2-tiny", "--gpus", "2", "--pp", "2", "--grad-accum", "1"), "micro-batch per stage"),
        (("gpt2-tiny", "--gpus", "1", "--mem-cap", "lots"), "--mem-cap"),
        (("no-such-model", "--gpus", "1"), "unknown model"),
    ],
)
def test_impossible_configurations_exit_2_with_one_line_before_starting(args: tuple[str, ...], match: str) -> None:
    t0 = time.monotonic()
    r = _run(*args, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], r.stderr
    assert r.stdout == ""
    assert time.monotonic() - t0 < 60


def test_parse_bytes() -> None:
    from autoslapo.cli.run import parse_bytes

    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("800m") == 800 * 2**20
    assert parse_bytes("123") == 123


@pytest.mark.slow
def test_run_with_repeats_reports_the_median_and_spread_over_runs() -> None:
    r = _run("gpt2-tiny", "--gpus", "1", "--steps", "3", "--seq-len", "32", "--json", "--device", "cpu",
             "--repeats", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    result = TrialResult.from_dict(json.loads(r.stdout))
    samples = result.extra["repeats_samples_per_s"]
    assert result.status == "complete" and len(samples) == 3 and result.extra["repeats"] == 3
    assert result.samples_per_s == sorted(samples)[1] and result.extra["samples_per_s_spread"] >= 0
    text = _table(result, "gpt2-tiny", ScheduleConfig(precision="fp32"), "gpt2")
    assert "over repeats     median of 3 runs, IQR" in text


def test_run_refuses_zero_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "gpt2-tiny", "--gpus", "1", "--repeats", "0", "--device", "cpu"]) == 2
    assert "--repeats must be a positive number of runs: got 0" in capsys.readouterr().err
