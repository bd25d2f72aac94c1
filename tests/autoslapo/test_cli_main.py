"""The CLI dispatcher: fast help, one-line errors, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoslapo.cli import SUBCOMMANDS, main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autoslapo", *args], capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_every_command_without_heavy_imports() -> None:
    code = (
        "import sys; from autoslapo.cli import main\n"
        "try: main(['--help'])\nexcept SystemExit: pass\n"
        "print([m for m in ('torch','ray','sqlalchemy','optuna','transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for name in SUBCOMMANDS:
        assert name in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert "usage: autoslapo" in capsys.readouterr().out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``autoslapo --version`` answers (no command takes it: before, the flag-before-command rule refused it)."""
    from autoslapo import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"autoslapo {__version__}"


def test_unknown_command_is_one_line_exit_2() -> None:
    r = _run("frobnicate")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "no command 'frobnicate'; the commands: run, tune" in r.stderr
    assert "Traceback" not in r.stderr
    r = _run("studes")
    assert r.returncode == 2 and r.stderr.strip() == (
        "autoslapo: error: no command 'studes'; did you mean studies? (see autoslapo --help)")


def test_token_list_creates_no_store_and_a_revoked_name_says_so(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert main(["token", "list", "--storage", url]) == 0
    assert "no store at" in capsys.readouterr().err and not (tmp_path / "t.db").exists()  # it made an empty one
    assert main(["token", "create", "--name", "ci", "--storage", url]) == 0
    assert "token 'ci' (read) created" in capsys.readouterr().err  # it said "(None)"
    assert main(["token", "revoke", "--name", "ci", "--storage", url]) == 0
    capsys.readouterr()
    assert main(["token", "create", "--name", "ci", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert "'ci' exists, revoked " in err and "pick another name" in err and "revoke it" not in err, err


def test_ctrl_c_while_following_a_served_study_says_it_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """It said only "interrupted": the study runs on at the server, unsaid, with no way back named."""
    from autoslapo import remote

    def follow(self: object, path: str, **params: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(remote.Client, "post", lambda self, path, body=None: {"name": "svc-1"})
    monkeypatch.setattr(remote.Client, "get", follow)
    assert main(["tune", "bert-tiny", "--gpus", "2", "--server", "http://127.0.0.1:9"]) == 130
    err = capsys.readouterr().err
    assert "stopped following study 'svc-1', which goes on at http://127.0.0.1:9" in err
    assert "--study svc-1 --join" in err and "POST /v1/studies/svc-1/cancel" in err


def test_flags_are_named_in_any_spelling_and_a_negative_value_is_no_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``-gpus`` and ``--TRIALS`` were left to argparse ("--gpus is required"); a flag before the
    command had its value read as the command. A negative number stays a value."""
    assert main(["tune", "bert-tiny", "--gpus", "2", "-tp", "2", "--backend", "sim"]) == 2
    assert "-tp: did you mean --tp?" in capsys.readouterr().err
    assert main(["--storage", "sqlite:////tmp/x.db", "studies", "--json"]) == 2
    err = capsys.readouterr().err
    assert "write autoslapo studies --storage sqlite:////tmp/x.db ..." in err and len(err.splitlines()) == 1
    assert main(["tune", "bert-tiny", "--gpus", "2", "--seed", "-1", "--backend", "sim"]) == 2
    err = capsys.readouterr().err
    assert "seed" in err and "unrecognized" not in err, err
    assert main(["tune", "bert-tiny", "--gpus", "2", "--seed", "-1", "-tp", "2"]) == 2  # the value between: no matter
    assert "-tp: did you mean --tp?" in capsys.readouterr().err
    # a short option with its value attached, and a value that starts with a dash, are argparse's to read
    assert main(["report", "s", "-o/tmp/x", "--storage", "sqlite:////nonexistent/x.db"]) == 2
    assert "unrecognized" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse's own error (exit 2)
        main(["tune", "bert-tiny", "--gpus", "2", "--study", "-x"])
    assert e.value.code == 2 and "argument --study: expected one argument" in capsys.readouterr().err


def test_a_flag_before_the_command_is_suggested_spelled_as_the_command_takes_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``autoslapo -gpus 8 tune bert-tiny`` suggested ``autoslapo tune -gpus 8 ...``: refused again."""
    assert main(["-gpus", "8", "tune", "bert-tiny"]) == 2
    err = capsys.readouterr().err
    assert "got -gpus 8 before it; write autoslapo tune --gpus 8 ... (see" in err and err.count("\n") == 1, err
    assert main(["--Storage", "sqlite:////tmp/x.db", "-JSON", "studies"]) == 2
    assert "write autoslapo studies --storage sqlite:////tmp/x.db --json ..." in capsys.readouterr().err
    assert main(["-TRIALS=3", "tune", "bert-tiny"]) == 2  # the value it was written with stays
    assert "write autoslapo tune --trials=3 ..." in capsys.readouterr().err
    assert main(["-gpus", "8"]) == 2  # no command: the flag as some command takes it
    assert "write autoslapo COMMAND --gpus 8, a COMMAND of run, " in capsys.readouterr().err
    # several close flags: left as written, and named; none: said so
    assert main(["--gpu", "8", "tune", "bert-tiny"]) == 2
    err = capsys.readouterr().err
    assert "write autoslapo tune --gpu 8 ...; --gpu: did you mean --gpu-type or --gpus or --gpus-per-node?" in err
    assert main(["--frob", "8", "studies"]) == 2
    assert "write autoslapo studies --frob 8 ...; autoslapo studies takes no --frob (see" in capsys.readouterr().err
    # one close flag that differs in more than dashes or case is a guess: named, not written in
    # (``--bogus`` became ``--gpus`` in the command to write, silently)
    assert main(["--bogus", "8", "tune", "bert-tiny"]) == 2
    assert "write autoslapo tune --bogus 8 ...; --bogus: did you mean --gpus? (see" in capsys.readouterr().err
    # the suggestion runs as written (up to the flags it takes)
    assert main(["-json", "--storage", "sqlite:////nonexistent-dir/x.db", "studies"]) == 2
    fixed = capsys.readouterr().err.split("write ", 1)[1].split(" ...")[0].split()[1:]
    assert fixed == ["studies", "--json", "--storage", "sqlite:////nonexistent-dir/x.db"]
