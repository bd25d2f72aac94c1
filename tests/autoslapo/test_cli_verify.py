"""``autoslapo verify``: bad input exits 2 before any rank starts; a real run exits 0 with a summary."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoslapo.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["verify", "bret"], "unknown model 'bret'"),
        (["verify", "bert-tiny", "--tp", "3"], "tp must divide the attention heads"),
        (["verify", "llama-tiny", "--tp", "4"], "2 key/value heads"),
        (["verify", "gpt2-tiny", "--pp", "5"], "pipeline chunks must each hold a layer, but the first and the last"),
        (["verify", "gpt2-tiny", "--pp", "2", "--batch", "3"], "--batch must split into --grad-accum"),
        (["verify", "gpt2-tiny", "--pp", "2", "--grad-accum", "1"], "a pipeline needs at least one micro-batch per stage"),
        (["verify", "gpt2-tiny", "--ckpt-ratio", "2"], "ckpt_ratio must be between 0 and 1"),
        (["verify", "wideresnet-tiny", "--pp", "5"], "pipeline chunks must each hold a block: got 4 blocks for pp=5"),
        (["verify", "wideresnet-tiny", "--attn", "flash"], "attn_kernel does not apply to wideresnet"),
        (["verify", "bert-tiny", "--channels-last"], "channels_last applies to a convolutional family only"),
        (["verify", "bert-tiny", "--norm-kernel", "fused"], "norm_kernel applies to the llama, t5 families only"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import autoslapo.dist

    def no_spawn(*a: object, **k: object) -> None:
        raise AssertionError("spawn must not run for bad input")

    monkeypatch.setattr(autoslapo.dist, "spawn", no_spawn)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def _verify(*args: str) -> tuple[int, str, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "autoslapo", "verify", *args], capture_output=True, text=True, timeout=600
    )
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def test_tiny_tp2_passes_with_a_summary() -> None:
    rc, out, _ = _verify("bert-tiny", "--tp", "2", "--seq-len", "8", "--batch", "2")
    assert rc == 0, out
    line = [x for x in out.splitlines() if x.startswith("verify ")]
    assert len(line) == 1 and "ok - tp=2 pp=1" in line[0] and "on 2 ranks" in line[0], out


@pytest.mark.slow
def test_wideresnet_tiny_tp2_passes() -> None:
    # every block at full depth, half of them checkpointed: outputs and every gradient equal
    rc, out, _ = _verify("wideresnet-tiny", "--tp", "2", "--layers", "0", "--ckpt-ratio", "0.5")
    assert rc == 0, out
    line = [x for x in out.splitlines() if x.startswith("verify ")]
    assert len(line) == 1 and "ok - tp=2 pp=1 ckpt_ratio=0.5" in line[0] and "4 layers" in line[0], out


@pytest.mark.slow
def test_wideresnet_tiny_channels_last_over_tp_and_stages_passes() -> None:
    # NHWC feature maps over TP's all-reduces, checkpointed blocks and 2 stages (NCHW on the wire):
    # in float64 every output and gradient equals the unscheduled NCHW model's up to summation order
    rc, out, _ = _verify("wideresnet-tiny", "--tp", "2", "--pp", "2", "--grad-accum", "2", "--ckpt-ratio", "0.5",
                         "--channels-last", "--dtype", "float64")
    assert rc == 0, out
    line = next(x for x in out.splitlines() if x.startswith("verify "))
    assert "ok - tp=2 pp=2" in line and "on 4 ranks" in line, out
    assert float(line.split("max abs diff ")[1].split(";")[0]) < 1e-10, line


def test_llama_tiny_fused_rmsnorm_over_tp_sequence_parallelism_and_stages_passes() -> None:
    # the one-op RMSNorm in every layer and the final norm, with TP 2 + sequence parallelism (its
    # gradients summed over the group) and 2 stages (each stage's modules rebound to their own copy)
    rc, out, _ = _verify("llama-tiny", "--tp", "2", "--pp", "2", "--grad-accum", "2", "--sequence-parallel",
                         "--norm-kernel", "fused", "--ckpt-ratio", "0.5", "--seq-len", "16")
    assert rc == 0, out
    line = next(x for x in out.splitlines() if x.startswith("verify "))
    assert "ok - tp=2 pp=2" in line and "sp" in line and "fused-rmsnorm" in line and "on 4 ranks" in line, out


@pytest.mark.slow
def test_pipelined_albert_and_wideresnet_pass() -> None:
    # ALBERT's shared layer over 2 stages; WideResNet's blocks over 2 stages (feature maps between them)
    for model in ("albert-tiny", "wideresnet-tiny"):
        rc, out, _ = _verify(model, "--pp", "2", "--layers", "0")
        assert rc == 0, out
        line = [x for x in out.splitlines() if x.startswith("verify ")]
        assert len(line) == 1 and "ok - tp=1 pp=2" in line[0] and "pipeline 2 stages" in line[0], out


@pytest.mark.slow
def test_uneven_stages_pass_for_presets_and_a_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 layers over 2 stages (2 + 3); WideResNet's, the worked model file's and T5's 4 blocks over 3
    # (1 + 2 + 1), with grad_accum = pp micro-batches by default
    rc, out, _ = _verify("gpt2-tiny", "--pp", "2", "--layers", "5", "--ckpt-ratio", "0.5", "--seq-len", "16")
    assert rc == 0 and "ok - tp=1 pp=2 ckpt_ratio=0.5" in out and "5 of 2 layers" in out, out
    rc, out, _ = _verify("wideresnet-tiny", "--pp", "3", "--layers", "0")
    assert rc == 0 and "ok - tp=1 pp=3" in out and "pipeline 3 stages x 3 micro-batches" in out, out
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    rc, out, _ = _verify(str(Path(__file__).parents[2] / "experiments" / "my_model.py"), "--pp", "3")
    assert rc == 0 and "ok - tp=1 pp=3" in out and "pipeline 3 stages x 3 micro-batches" in out, out
    # 2 layers over 4 stages: the first embeds, the last runs the head (Llama 3 405B's end stages)
    rc, out, _ = _verify("gpt2-tiny", "--pp", "4", "--layers", "2", "--seq-len", "16")
    assert rc == 0 and "ok - tp=1 pp=4" in out and "pipeline 4 stages x 4 micro-batches" in out, out
    # T5's 2 + 2 blocks in one list over 3 stages: the middle one holds an encoder and a decoder block
    rc, out, _ = _verify("t5-tiny", "--pp", "3", "--ckpt-ratio", "0.5")
    assert rc == 0 and "ok - tp=1 pp=3 ckpt_ratio=0.5" in out and "pipeline 3 stages x 3 micro-batches" in out, out


@pytest.mark.slow
def test_tiny_tp2_pp2_with_checkpointing_passes() -> None:
    rc, out, _ = _verify("gpt2-tiny", "--tp", "2", "--pp", "2", "--ckpt-ratio", "0.5", "--seq-len", "16")
    assert rc == 0, out
    line = [x for x in out.splitlines() if x.startswith("verify ")]
    assert len(line) == 1 and "ok - tp=2 pp=2 ckpt_ratio=0.5" in line[0], out
    assert "pipeline 2 stages x 2 micro-batches" in line[0] and "max abs diff" in line[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [("bert", "--tp", "2"), ("gpt2", "--tp", "4"), ("gpt2", "--tp", "2", "--pp", "2", "--ckpt-ratio", "0.5")],
)
def test_acceptance_commands(args: tuple[str, ...]) -> None:
    """The issue's three commands: real widths, 2 layers per stage, exit 0 (under a minute when idle)."""
    rc, out, seconds = _verify(*args)
    assert rc == 0, out
    assert f"verify {args[0]}: ok" in out
    print(f"{' '.join(args)}: {seconds:.1f} s")
