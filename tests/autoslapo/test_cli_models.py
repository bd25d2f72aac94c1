"""``autoslapo models``: every preset with its family and shape, as a table or JSON; the shape flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.models.spec import ALIASES, PRESETS


def test_models_json_lists_every_preset_with_its_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(PRESETS)
    for r in rows:
        spec = PRESETS[r["name"]]
        for key in ("family", "hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            assert r[key] == getattr(spec, key), (r["name"], key)
        assert r["params"] == spec.num_params()
    by_name = {r["name"]: r for r in rows}
    assert by_name["llama-70b"]["kv_heads"] == 8 and by_name["bert-large"]["aliases"] == ["bert"]
    assert sorted(a for r in rows for a in r["aliases"]) == sorted(ALIASES)


def test_models_table_has_a_row_a_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["PRESET", "(ALIASES)", "FAMILY"] and "KV_HEADS" in lines[0]
    assert len(lines) == 1 + len(PRESETS)
    llama70 = next(line for line in lines if line.startswith("llama-70b "))
    assert llama70.split()[1:8] == ["llama", "8192", "80", "64", "8", "28672", "32000"]
    assert llama70.split()[-1] == "69.0B"


def test_unknown_model_points_to_the_models_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "gpt", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "autoslapo models" in err and "did you mean gpt2" in err and len(err.strip().splitlines()) == 1
    assert main(["models"]) == 0  # ... and that command exists


def _estimate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_estimate_shape_flags_keep_the_model_consistent(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    big = _estimate(capsys, "gpt2", "--gpus", "512", "--hidden", "8192", "--layers", "48", "--heads", "64")
    assert big["model"]["ffn"] == 32768 and big["model"]["kv_heads"] == 64 and big["model"]["hidden"] == 8192
    gqa = _estimate(capsys, "llama-7b", "--gpus", "8", "--kv-heads", "8")
    assert gqa["model"]["kv_heads"] == 8 and gqa["model"]["heads"] == 32
    mha = _estimate(capsys, "llama-7b", "--gpus", "8")
    assert mha["model"]["kv_heads"] == 32
    assert gqa["memory"] != mha["memory"]  # fewer key/value heads: smaller weights and activations
    narrow = _estimate(capsys, "gpt2", "--gpus", "512", "--hidden", "8192", "--layers", "48", "--heads", "64",
                       "--ffn", "3072")
    assert narrow["model"]["ffn"] == 3072 and narrow["samples_per_s"] > big["samples_per_s"]


@pytest.mark.parametrize("command", ["tune", "estimate", "best", "run", "verify"])
def test_every_model_command_takes_the_same_shape_flags(command: str) -> None:
    from autoslapo.cli import build_parser
    from autoslapo.cli._shape import SHAPE_FLAGS

    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]  # type: ignore[attr-defined]
    flags = {o for a in sub._actions for o in a.option_strings}
    assert {f"--{n.replace('_', '-')}" for n in SHAPE_FLAGS} <= flags


def test_existing_shape_defaults_are_kept() -> None:
    from autoslapo.cli import build_parser

    for command, seq_len in [("tune", None), ("best", None), ("run", None), ("estimate", None), ("verify", 32)]:
        args = build_parser(only=command).parse_args([command, "bert-tiny", *(["--gpus", "1"]
                                                                             if command != "verify" else [])])
        assert args.seq_len == seq_len and args.layers is None and args.hidden is None, command
