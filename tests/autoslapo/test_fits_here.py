"""``runtime.check.check_fits_here``: a shape whose CPU ranks need more memory than this machine has
available is refused before any process starts (``run``, ``verify``); one too slow for ``verify``'s
``--timeout`` ends with what happened and its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.config import ScheduleConfig
from autoslapo.cost.device import PERF
from autoslapo.cost.estimate import estimate_family_memory
from autoslapo.errors import UsageError
from autoslapo.models.resolve import resolve_model
from autoslapo.runtime.check import check_fits_here, memory_available_bytes

GiB = 2**30


def test_mem_available_is_read_from_meminfo_and_absent_without_it(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert memory_available_bytes(str(meminfo)) == 20000000 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")  # a kernel before 3.14
    assert memory_available_bytes(str(meminfo)) is None
    assert memory_available_bytes(str(tmp_path / "missing")) is None


def test_the_ranks_memory_is_the_cost_models_a_rank_times_the_ranks() -> None:
    spec = resolve_model("bert-tiny").with_overrides(seq_len=4096)
    config = ScheduleConfig(tp=2, micro_batch=4, precision="fp32")
    per_rank = estimate_family_memory(spec, config, PERF["cpu"], dropout=False).total
    check_fits_here(spec, config, device="cpu", fix="x", available=2 * per_rank)  # fits exactly
    with pytest.raises(UsageError, match=r"the ranks must fit in this machine's available memory: 2 CPU ranks need "
                                         r"at least .* GiB by the cost model .* and .* GiB is available; lower it"):
        check_fits_here(spec, config, device="cpu", fix="lower it", available=2 * per_rank - 1)


def test_gpu_ranks_and_a_machine_without_meminfo_are_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = resolve_model("bert-tiny").with_overrides(seq_len=1_000_000)
    config = ScheduleConfig(micro_batch=64, precision="fp32")
    check_fits_here(spec, config, device="cuda", fix="x", available=1)
    import autoslapo.runtime.check as check

    monkeypatch.setattr(check, "memory_available_bytes", lambda path=check.MEMINFO: None)
    check_fits_here(spec, config, device="cpu", fix="x")


@pytest.mark.parametrize("argv", [
    ["verify", "bert-tiny", "--seq-len", "1000000", "--batch", "64"],
    ["run", "bert-tiny", "--gpus", "1", "--seq-len", "1000000", "--micro-batch", "64", "--device", "cpu"],
])
def test_a_shape_too_large_for_this_machine_is_refused_before_any_rank_starts(
        argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """bert-tiny at a million tokens, 64 sequences: ~1.3-1.8 TiB by the cost model."""
    import autoslapo.dist
    import autoslapo.runtime

    def no_ranks(*a: object, **k: object) -> None:
        raise AssertionError("no rank may start for a shape that cannot fit")

    monkeypatch.setattr(autoslapo.dist, "spawn", no_ranks)
    monkeypatch.setattr(autoslapo.runtime, "run_trial", no_ranks)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "the ranks must fit in this machine's available memory: 1 CPU rank needs at least" in err
    assert "lower --seq-len" in err


def test_verify_too_slow_for_its_timeout_says_so_with_the_fix(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import autoslapo.dist

    def times_out(*a: object, **k: object) -> None:
        raise autoslapo.dist.SpawnTimeout("spawn timed out after 5 s with 0/2 ranks done; raise timeout=", done=0)

    monkeypatch.setattr(autoslapo.dist, "spawn", times_out)
    assert main(["verify", "bert-tiny", "--tp", "2", "--seq-len", "64", "--timeout", "5"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("verify's ranks must finish within --timeout: 0 of 2 done after 5 s, the others still computing or "
            "waiting on one that is; raise --timeout, or lower --seq-len or --batch (got 4x64)") in err
    assert "collective" not in err
