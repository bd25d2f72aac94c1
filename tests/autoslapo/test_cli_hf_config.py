"""Every command that takes a model takes a Hugging Face config.json: estimate, tune, best, verify, run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import autoslapo
from autoslapo.cli import main
from autoslapo.result import TrialResult

DATA = Path(__file__).parent / "data" / "hf"
MISTRAL_7B = str(DATA / "mistral-7b.json")


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_of_a_mistral_7b_config_is_llama_7b_with_its_shape(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    got = _json(capsys, ["estimate", MISTRAL_7B, "--gpus", "8", "--json"])
    want = _json(
        capsys, ["estimate", "llama-7b", "--gpus", "8", "--kv-heads", "8", "--ffn", "14336", "--json"]
    )
    model = got.pop("model")
    assert {
        k: model[k] for k in ("family", "hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "seq_len")
    } == {
        "family": "llama",
        "hidden": 4096,
        "layers": 32,
        "heads": 32,
        "kv_heads": 8,
        "ffn": 14336,
        "vocab": 32000,
        "seq_len": 4096,
    }
    assert model["extra"]["hf_config"]["model_type"] == "mistral"
    want.pop("model")
    assert got == want


def test_an_unsupported_model_type_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    assert main(["estimate", str(path), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'mamba'" in err and "mistral" in err and "qwen2" in err, err


@pytest.mark.slow
def test_tune_then_best_finds_the_study_by_the_config_contents(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert (
        main(["tune", MISTRAL_7B, "--gpus", "64", "--trials", "10", "--storage", url, "--no-baselines"]) == 0
    )
    capsys.readouterr()
    moved = tmp_path / "elsewhere" / "config.json"
    moved.parent.mkdir()
    shutil.copy(MISTRAL_7B, moved)
    doc = _json(capsys, ["best", str(moved), "--gpus", "64", "--json", "--storage", url])
    assert doc["model"] == "mistral" and doc["samples_per_s"] > 0
    assert autoslapo.best(str(moved), gpus=64, storage=url).to_dict() == doc["config"]  # the library too
    # another shape is another study
    assert main(["best", str(moved), "--gpus", "64", "--storage", url, "--ffn", "11008"]) == 1
    # two configs of one model_type are told apart in `studies` by their size (both read "mistral")
    assert main(["tune", str(DATA / "mistral-tiny.json"), "--gpus", "64", "--trials", "2", "--storage", url,
                 "--no-baselines"]) == 0
    capsys.readouterr()
    assert main(["studies", "--storage", url]) == 0
    models = [line.split()[1:3] for line in capsys.readouterr().out.splitlines()[1:3]]
    assert models == [["mistral", "7.24B"], ["mistral", "632K"]]


def test_a_config_and_a_module_file_are_sent_to_a_service(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The config is read and asked for by its signature: the request goes out (nothing listens on port 9).
    assert main(["best", MISTRAL_7B, "--gpus", "8", "--server", "http://127.0.0.1:9"]) == 2
    assert "cannot reach the autoslapo server" in capsys.readouterr().err
    # A model file goes as its text: the client does not run it (the server traces it in a child process).
    module = tmp_path / "mine.py"
    module.write_text("raise SystemExit('never run')\n")
    assert main(["tune", str(module), "--gpus", "8", "--server", "http://127.0.0.1:9"]) == 2
    assert "cannot reach the autoslapo server" in capsys.readouterr().err


@pytest.mark.slow
def test_verify_a_tiny_qwen2_config_with_tp2() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoslapo",
            "verify",
            str(DATA / "qwen2-tiny.json"),
            "--tp",
            "2",
            "--seq-len",
            "16",
            "--batch",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify " in proc.stdout and "ok - tp=2 pp=1" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_run_a_tiny_mistral_config_on_two_ranks() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autoslapo",
            "run",
            str(DATA / "mistral-tiny.json"),
            "--gpus",
            "2",
            "--steps",
            "3",
            "--seq-len",
            "32",
            "--json",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = TrialResult.from_dict(json.loads(proc.stdout))
    assert result.status == "complete" and result.measured
    assert result.samples_per_s > 0 and result.tokens_per_s == pytest.approx(result.samples_per_s * 32)


def test_best_and_the_report_show_a_config_models_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``studies`` said ``mistral 632K``; ``best`` and the report's title said ``mistral`` alone."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    tiny = str(DATA / "mistral-tiny.json")
    assert main(["tune", tiny, "--gpus", "2", "--storage", url, "--no-baselines", "--study", "m"]) == 0
    capsys.readouterr()
    assert main(["best", tiny, "--gpus", "2", "--storage", url]) == 0
    assert capsys.readouterr().out.startswith("mistral 632K on 2x a100-80gb")
    assert main(["report", "m", "-o", str(tmp_path / "r"), "--storage", url]) == 0
    assert "mistral 632K (631,552 parameters)" in (tmp_path / "r" / "index.html").read_text()
