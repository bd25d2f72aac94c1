"""``autoslapo tune``: what Ctrl-C says, --patience refused by a sweep, a sweep's --timeout, a baseline's rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslapo.cli import main
from store import open_store

TUNE = ["tune", "bert-tiny", "--gpus", "4", "--gpu-type", "cpu", "--backend", "sim", "--trials", "3", "--no-baselines"]


def test_ctrl_c_names_the_study_and_the_exact_resume_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    import tuner.study

    def interrupted(self: tuner.study.StudyRunner) -> None:
        raise KeyboardInterrupt

    url = f"sqlite:///{tmp_path / 'c.db'}"
    monkeypatch.setattr(tuner.study.StudyRunner, "run", interrupted)
    rc = main([*TUNE, "--sampler", "tpe", "--storage", url])
    err = capsys.readouterr().err
    assert rc == 130
    assert (f"autoslapo tune: study bert-tiny-4xcpu-sim stopped; resume it with: autoslapo tune bert-tiny --gpus 4 --gpu-type cpu "
            f"--backend sim --trials 3 --storage {url} --sampler tpe --no-baselines --resume --study "
            "bert-tiny-4xcpu-sim\n") in err, err
    monkeypatch.undo()
    # the command it printed goes on with that study
    rc = main(["tune", "bert-tiny", "--gpus", "4", "--gpu-type", "cpu", "--backend", "sim", "--trials", "3", "--storage", url,
               "--sampler", "tpe", "--no-baselines", "--resume", "--study", "bert-tiny-4xcpu-sim"])
    assert rc == 0 and open_store(url).get_study("bert-tiny-4xcpu-sim").status == "complete"


def test_resume_without_study_says_which_study_it_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert main([*TUNE, "--sampler", "tpe", "--storage", url]) == 0
    assert main([*TUNE, "--sampler", "tpe", "--storage", url]) == 0
    open_store(url).set_study_status("bert-tiny-4xcpu-sim-2", "stopped")
    capsys.readouterr()
    assert main([*TUNE, "--sampler", "tpe", "--storage", url, "--resume"]) == 0
    out = capsys.readouterr()
    assert "autoslapo tune: resuming study bert-tiny-4xcpu-sim-2\n" in out.err
    assert out.out.startswith("study bert-tiny-4xcpu-sim-2: ")


def test_patience_with_a_sweep_is_one_line_exit_2_and_stores_nothing(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    rc = main([*TUNE, "--patience", "5", "--storage", url])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert ("--patience stops a sampled search after K trials without a new best: got --patience 5 with --backend "
            "sim and no --sampler") in err and "pass --sampler tpe" in err
    assert open_store(url).list_studies() == []


def test_a_sweep_stopped_by_timeout_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import tuner.sweep
    import tuner.walk

    monkeypatch.setattr(tuner.walk, "TICK", 1)  # look at the deadline after every configuration
    url = f"sqlite:///{tmp_path / 't.db'}"
    real = tuner.sweep.sweep_space

    def past_deadline(*a, **kw):  # type: ignore[no-untyped-def]
        return real(*a, **{**kw, "deadline": 0.0})  # time ran out once the first configuration was scored

    monkeypatch.setattr(tuner.sweep, "sweep_space", past_deadline)
    rc = main([*TUNE[:-1], "--timeout", "30", "--storage", url, "--study", "to"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "study to: stopped by timeout after scoring 1 of " in out and "best of the 1 configurations scored " \
        "before the timeout" in out
    assert open_store(url).get_study("to").status == "stopped"


def test_a_baseline_that_cannot_split_the_batch_says_which_rule(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    rc = main([*TUNE[:-1], "--global-batch", "3", "--storage", url])
    out = capsys.readouterr().out
    assert rc == 0
    assert ("speedup over deepspeed-style baseline: n/a (baseline failed: no deepspeed-style configuration is valid "
            "here: micro_batch*dp must divide the global batch: got 1*4 for 3") in out, out
    assert "baseline oom" not in out
