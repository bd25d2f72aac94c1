"""Flags ``run``, ``verify`` and ``serve`` refuse up front (one line, exit 2, nothing launched), and the
messages' singulars and plurals (in-process through ``main``; no trial runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autoslapo.cli import main
from autoslapo.config import KNOB, KNOBS
from autoslapo.errors import UsageError


class Launched(Exception):
    """What the stand-in for the trial launcher raises: the command got past its checks."""


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run_trial`` and ``verify``'s ``spawn`` raise ``Launched`` (AUTOSLAPO_DEBUG lets it through ``main``)."""
    import autoslapo.dist
    import autoslapo.runtime

    def launched(*_a: Any, **_k: Any) -> None:
        raise Launched

    monkeypatch.setattr(autoslapo.runtime, "run_trial", launched)
    monkeypatch.setattr(autoslapo.dist, "spawn", launched)
    monkeypatch.setenv("AUTOSLAPO_DEBUG", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err and captured.out == "", captured.err
    return lines[0]


RUN = ["run", "bert-tiny", "--gpus", "2", "--steps", "3", "--device", "cpu"]
VERIFY = ["verify", "bert-tiny"]


@pytest.mark.parametrize("command", [RUN, VERIFY])
@pytest.mark.parametrize(("flags", "fix"), [
    (["--ckpt-granularity", "selective"], "pass --ckpt-ratio 1 (or another ratio above 0), or drop --ckpt-granularity"),
    (["--ckpt-granularity", "op", "--ckpt-ratio", "0"], "or drop --ckpt-granularity"),
    (["--ckpt-placement", "back"], "pass --ckpt-ratio 0.5 (or another ratio strictly between 0 and 1), or drop "
                                   "--ckpt-placement"),
])
def test_a_refining_knob_with_its_knob_at_the_default_is_refused(
        no_launch: None, capsys: pytest.CaptureFixture[str], command: list[str], flags: list[str], fix: str) -> None:
    """``--ckpt-granularity selective`` alone ran with no layer checkpointed (header ckpt=0.00, no gran=),
    so selective recomputation was never exercised; the same for a placement."""
    line = _refused(capsys, [*command, *flags])
    assert f"{flags[0]} {flags[1]} acts on checkpointed layers: got it with --ckpt-ratio 0 (none checkpointed)" in line
    assert fix in line


@pytest.mark.parametrize("command", [RUN, VERIFY])
@pytest.mark.parametrize("flags", [
    ["--ckpt-ratio", "0.5", "--ckpt-granularity", "selective", "--ckpt-placement", "back"],
    ["--ckpt-ratio", "1", "--ckpt-placement", "back"],  # inert at 1, but the ratio is the user's
    ["--ckpt-granularity", "full", "--ckpt-placement", "front"],  # the defaults, given
])
def test_refining_knobs_that_act_or_sit_at_their_default_still_launch(no_launch: None, command: list[str],
                                                                      flags: list[str]) -> None:
    with pytest.raises(Launched):
        main([*command, *flags])


def test_other_inert_knobs_still_launch(no_launch: None) -> None:
    """Only refining knobs are refused: ZeRO with one replica, a schedule without a pipeline run as before."""
    with pytest.raises(Launched):
        main(["run", "bert-tiny", "--gpus", "1", "--zero-stage", "2", "--pipeline-schedule", "gpipe", "--device", "cpu"])


def test_every_refining_knob_is_refused_at_the_refined_default() -> None:
    """Written once for every knob that refines another: each of its values but the default is refused."""
    from autoslapo.cli._knobs import REFINES, check_refinements

    assert REFINES["ckpt_granularity"] == "ckpt_ratio" and REFINES["ckpt_placement"] == "ckpt_ratio"
    assert all(KNOB[name].refines in ("", refined) for name, refined in REFINES.items())
    defaults = {k.name: k.default for k in KNOBS}
    check_refinements(defaults)
    for name, refined in REFINES.items():
        for value in KNOB[name].domain:
            if value == KNOB[name].default:
                continue
            with pytest.raises(UsageError, match=f"{KNOB[name].flag} {value} acts on .* {KNOB[refined].flag}"):
                check_refinements({**defaults, name: value})


def test_estimate_still_searches_ratios_for_a_pinned_granularity(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json

    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for flag, value in (("--ckpt-granularity", "selective"), ("--ckpt-placement", "back")):
        assert main(["estimate", "bert-tiny", "--gpus", "2", flag, value, "--json"]) == 0
        config = json.loads(capsys.readouterr().out)["config"]
        assert config["ckpt_ratio"] > 0 and config[flag[2:].replace("-", "_")] == value


# --- run: memory cap, seed, CPU ranks ------------------------------------------------------------


@pytest.mark.parametrize(("flags", "needle"), [
    (["--mem-cap", "1KiB"], "--mem-cap must be at least 400 MiB"),
    (["--mem-cap", "399MiB"], "got '399MiB' (418,381,824 bytes)"),
    (["--seed", "-1"], "--seed must be a whole number from 0 to 2**32 - 1 (4,294,967,295"),
    (["--seed", str(2**32)], f"got {2**32}"),
])
def test_run_refuses_a_hopeless_cap_and_a_seed_out_of_range(no_launch: None, capsys: pytest.CaptureFixture[str],
                                                            flags: list[str], needle: str) -> None:
    assert needle in _refused(capsys, [*RUN, *flags])


def test_run_takes_a_cap_a_rank_can_keep_and_the_extreme_seeds(no_launch: None) -> None:
    for flags in (["--mem-cap", "400MiB"], ["--seed", "0"], ["--seed", str(2**32 - 1)]):
        with pytest.raises(Launched):
            main([*RUN, *flags])


def test_a_gpu_cap_needs_64_mib() -> None:
    from autoslapo.cli.run import _mem_cap

    assert _mem_cap("64MiB", "cuda") == 64 * 2**20 and _mem_cap(None, "cuda") is None
    with pytest.raises(UsageError, match="--mem-cap must be at least 64 MiB"):
        _mem_cap("63MiB", "cuda")


def test_run_refuses_more_than_four_cpu_ranks_a_core(no_launch: None, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    line = _refused(capsys, ["run", "bert-tiny", "--gpus", "64", "--device", "cpu"])
    assert "got --gpus 64 on 2 cores (at most 8); pass fewer --gpus" in line and "--backend sim" in line
    assert "got --gpus 9 on 2 cores" in _refused(capsys, ["run", "bert-tiny", "--gpus", "9", "--device", "cpu"])


def test_more_cpu_ranks_than_cores_within_the_bound_warn_and_run(no_launch: None, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for gpus in ("8", "4"):
        with pytest.raises(Launched):
            main(["run", "llama-tiny", "--gpus", gpus, "--tp", "2", "--pp", "2", "--device", "cpu"])
        err = capsys.readouterr().err
        assert err == f"autoslapo run: warning: {gpus} CPU ranks share 2 cores: samples/s reads lower than with a core each\n"
    with pytest.raises(Launched):
        main(["run", "bert-tiny", "--gpus", "2", "--device", "cpu"])
    assert capsys.readouterr().err == ""


def test_gpu_ranks_are_not_counted_against_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoslapo.cli.run import _check_cpu_ranks

    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    _check_cpu_ranks(64, "cuda")


# --- serve: only the wrong flags ------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "want", "not_named"), [
    (["--port", "99999"], "--port must be 0-65535 (0 picks a free one): got 99999", ("--workers", "--max-body")),
    (["--max-body", "0"], "--max-body must be at least 1 byte: got 0", ("--workers", "--port")),
    (["--workers", "-1", "--port", "-5"], "--workers must be 0 or more: got -1; --port must be 0-65535 (0 picks a "
                                          "free one): got -5", ("--max-body",)),
])
def test_serve_names_only_the_wrong_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str],
                                          want: str, not_named: tuple[str, ...]) -> None:
    db = tmp_path / "s.db"
    line = _refused(capsys, ["serve", *flags, "--storage", f"sqlite:///{db}"])
    assert line == f"autoslapo serve: error: {want}"
    assert not any(flag in line for flag in not_named) and not db.exists()


# --- singular and plural ----------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "want"), [
    (["--steps", "3"], "--steps cannot be sent; drop it or tune locally"),
    (["--steps", "3", "--repeats", "2"], "--repeats, --steps cannot be sent; drop them or tune locally"),
])
def test_tune_server_says_it_for_one_flag_and_them_for_more(capsys: pytest.CaptureFixture[str], flags: list[str],
                                                            want: str) -> None:
    assert want in _refused(capsys, ["tune", "bert", "--gpus", "8", *flags, "--server", "http://127.0.0.1:9"])


@pytest.mark.parametrize(("flags", "want"), [
    (["--storage", "sqlite:///x.db"], "--storage cannot be sent; drop it,"),
    (["--storage", "sqlite:///x.db", "--profile", "p.json"], "--profile and --storage cannot be sent; drop them,"),
])
def test_estimate_server_says_it_for_one_flag_and_them_for_more(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                                want: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert want in _refused(capsys, ["estimate", "bert", "--gpus", "8", *flags, "--server", "http://127.0.0.1:9"])
    assert list(tmp_path.iterdir()) == []


def test_export_of_one_trial_says_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.autoslapo.test_cli_results import make_study

    url = f"sqlite:///{tmp_path / 'one.db'}"
    make_study(url, "one", n=1)
    assert main(["export", "one", "--output", str(tmp_path / "t.csv"), "--storage", url]) == 0
    assert capsys.readouterr().out.startswith("wrote 1 trial of one to ")
