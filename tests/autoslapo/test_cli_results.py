"""The result commands: studies, show, export, report (in-process through ``main``, plus exit codes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoslapo.cli import main
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec

GiB = 1024**3
STUDY = "bert-64"


def make_study(url: str, name: str = STUDY, *, n: int = 12, model: str = "bert", gpus: int = 64,
               gpu_type: str = "a100-80gb", measured_every: int = 0) -> list[dict[str, Any]]:
    """A study of ``n`` trials written through the store API; returns what was written, in order.

    Throughput falls with tp and pp and rises with micro_batch, so the best trial is known;
    every fifth trial is an OOM with no metrics.
    """
    from store import open_store

    spec = ModelSpec.from_name(model)
    cluster = ClusterSpec(gpus=gpus, gpu_type=gpu_type)
    written = []
    with open_store(url) as db:
        db.create_study(name, model=spec.to_dict(), cluster=cluster.to_dict(), space_name=spec.family,
                        space_version="1", objective="samples_per_s", backend="sim",
                        model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
        for i in range(n):
            tp = (1, 2, 4)[i % 3]
            pp = (1, 2)[(i // 3) % 2]
            mb = (4, 8, 16)[(i // 6) % 3]
            config = ScheduleConfig(tp=tp, pp=pp, dp=gpus // (tp * pp), micro_batch=mb,
                                    ckpt_ratio=0.5 if i % 2 else 0.0).to_dict()
            measured = bool(measured_every and i % measured_every == 0)
            if i % 5 == 4:
                result: dict[str, Any] = {"status": "oom", "reason": f"needs {90 + i} GiB, device has 80 GiB",
                                          "measured": measured}
            else:
                value = 1000.0 * mb / (tp * pp) + i
                result = {"status": "complete", "samples_per_s": value, "tokens_per_s": value * spec.seq_len,
                          "tflops_per_device": value / 100, "peak_memory_bytes": int((10 + mb / tp) * GiB),
                          "step_time_s": 1.0, "measured": measured}
            db.add_trial(name, i, config, result)
            written.append({"number": i, "config": config, **result})
    return written


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'results.db'}"
    make_study(url)
    return url


def _best(written: list[dict[str, Any]]) -> dict[str, Any]:
    return max((w for w in written if w["status"] == "complete"), key=lambda w: w["samples_per_s"])


def test_studies_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    written = make_study(url)
    make_study(url, "gpt2-8", n=4, model="gpt2", gpus=8)
    assert main(["studies", "--storage", url]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["STUDY", "MODEL", "CLUSTER"]
    row = next(line for line in lines if line.startswith(STUDY))
    assert "bert-large" in row and "64 x a100-80gb" in row and " sim " in row
    assert f"{_best(written)['samples_per_s']:.4g}" in row
    assert main(["studies", "--storage", url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in data] == [STUDY, "gpt2-8"]
    first = data[0]
    assert first["trials"] == 12 and first["trials_by_status"] == {"complete": 10, "oom": 2}
    assert first["best_samples_per_s"] == _best(written)["samples_per_s"]
    assert first["best_trial"] == _best(written)["number"]
    assert main(["studies", "--storage", url, "--gpus", "8", "--json"]) == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)] == ["gpt2-8"]
    assert main(["studies", "--storage", url, "--model", "gpt2xl"]) == 0  # a typo: the filter matched none
    assert capsys.readouterr().err.startswith("no studies match --model gpt2xl in ")


def test_a_running_study_whose_tuner_is_gone_reads_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    from store import open_store

    path = tmp_path / "r.db"
    make_study(f"sqlite:///{path}")
    make_study(f"sqlite:///{path}", "live", n=2)
    with open_store(f"sqlite:///{path}") as db:
        db.set_study_status(STUDY, "running")
        db.set_study_status("live", "running")
    with sqlite3.connect(path) as conn:  # its tuner was killed 12 minutes ago: no heartbeat since
        conn.execute("UPDATE autoslapo_studies SET updated_at = datetime('now', '-12 minutes') WHERE name = ?", (STUDY,))
    assert main(["studies", "--storage", f"sqlite:///{path}"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(STUDY))
    assert row.endswith("running (no tuner for 12 min)")
    assert next(line for line in out.splitlines() if line.startswith("live")).endswith("running")
    assert "--resume` takes it over" in out
    assert main(["studies", "--storage", f"sqlite:///{path}", "--json"]) == 0
    silent = {d["name"]: d["silent_s"] for d in json.loads(capsys.readouterr().out)}
    assert 700 < silent[STUDY] < 740 and silent["live"] is None
    assert main(["show", STUDY, "--storage", f"sqlite:///{path}", "--limit", "1"]) == 0
    assert "status running (no tuner for 12 min)" in capsys.readouterr().out


def test_studies_on_a_missing_store_creates_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "nothing.db"
    assert main(["studies", "--storage", f"sqlite:///{target}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["studies", "--storage", f"sqlite:///{target}"]) == 0
    assert "yet (the file does not exist or holds no tables)" in capsys.readouterr().err
    assert not target.exists()
    assert main(["show", "x", "--storage", f"sqlite:///{target}"]) == 2
    err = capsys.readouterr().err
    assert "no store at" in err and len(err.strip().splitlines()) == 1
    assert not target.exists()


def test_studies_uses_the_environment_store(tmp_path: Path, db: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AUTOSLAPO_STORAGE", db)
    assert main(["studies", "--json"]) == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)] == [STUDY]


def test_show_sorts_filters_and_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    written = make_study(url)
    assert main(["show", STUDY, "--storage", url, "--json", "--sort", "samples"]) == 0
    data = json.loads(capsys.readouterr().out)
    values = [t["samples_per_s"] for t in data["trials"]]
    complete = sorted((w["samples_per_s"] for w in written if w["status"] == "complete"), reverse=True)
    assert values[: len(complete)] == complete and values[len(complete):] == [None, None]
    assert data["trials"][0]["config"] == _best(written)["config"]
    assert data["study"]["model"] == "bert-large"

    assert main(["show", STUDY, "--storage", url, "--json", "--sort", "samples", "--asc", "--limit", "3"]) == 0
    asc = [t["samples_per_s"] for t in json.loads(capsys.readouterr().out)["trials"]]
    assert asc == sorted(complete)[:3]

    assert main(["show", STUDY, "--storage", url, "--json", "--status", "oom"]) == 0
    ooms = json.loads(capsys.readouterr().out)["trials"]
    assert [t["number"] for t in ooms] == [4, 9] and "device has 80 GiB" in ooms[0]["reason"]


def test_show_table_lists_knobs_status_and_reason(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", STUDY, "--storage", db]) == 0
    out = capsys.readouterr().out
    assert "bert-large on 64 x a100-80gb" in out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("#"))
    for column in ("STATUS", "samples/s", "GiB/dev", "KNOBS", "REASON"):
        assert column in header
    oom = next(line for line in out.splitlines() if line.split()[:2] == ["4", "oom"])
    assert "tp=2" in oom and "needs 94 GiB" in oom
    # Knobs that never change are said once, not repeated per row.
    assert "same in every trial shown:" in out and "zero_stage=0" in out.split("\n", 3)[1]


@pytest.mark.parametrize("argv, needle", [
    (["show", "missing"], "no study named 'missing'"),
    (["show", STUDY, "--limit", "0"], "--limit must be a positive integer"),
    (["export", STUDY, "--output", "x.txt"], "--output must end in .csv or .parquet"),
    (["report", "missing", "--output", "out"], "no study named 'missing'"),
    (["studies", "--gpus", "0"], "--gpus must be a positive integer"),
])
def test_bad_input_is_one_line_and_exit_2(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--storage", db]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "x.txt").exists()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_round_trips(db: str, tmp_path: Path, suffix: str, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    target = tmp_path / f"trials{suffix}"
    assert main(["export", STUDY, "--output", str(target), "--storage", db, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == 12 and info["path"] == str(target)
    frame = pd.read_csv(target) if suffix == ".csv" else pd.read_parquet(target)
    assert len(frame) == 12
    assert {"number", "status", "samples_per_s", "config.tp", "config.micro_batch"} <= set(frame.columns)
    assert list(frame.sort_values("number")["status"]).count("oom") == 2


def test_report_command_writes_the_page(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report" / "nested"
    assert main(["report", STUDY, "--output", str(out), "--storage", db, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert Path(info["html"]) == out / "index.html"
    assert set(info["images"]) >= {"throughput_over_trials", "throughput_vs_memory", "knob_effects"}
    for path in info["images"].values():
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_refuses_a_file_as_output(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    assert main(["report", STUDY, "--output", str(target), "--storage", db]) == 2
    assert "--output must be a directory" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_exit_codes_in_a_subprocess(db: str, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "autoslapo", *args, "--storage", db],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    ok = run("show", STUDY, "--sort", "samples", "--limit", "2")
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.strip().splitlines()) == 5  # title, shared knobs, header, 2 trials
    bad = run("show", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    usage = run("export", STUDY)  # --output missing: argparse's one line
    assert usage.returncode == 2 and "--output" in usage.stderr and "Traceback" not in usage.stderr


def test_real_trials_show_export_and_plot_their_prediction(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pandas as pd

    from store import open_store

    url = f"sqlite:///{tmp_path / 'p.db'}"
    make_study(url, n=6)
    with open_store(url) as db:  # two real trials of the study, each with the prediction it was proposed with
        for number, status in ((6, "complete"), (7, "oom")):
            config = ScheduleConfig(tp=8, pp=number - 5, dp=64 // (8 * (number - 5)), micro_batch=2).to_dict()
            extra = {"predicted_samples_per_s": 900.0 + number, "predicted_memory_bytes": 30 * GiB}
            result: dict[str, Any] = ({"status": "complete", "samples_per_s": 700.0, "peak_memory_bytes": 35 * GiB,
                                       "measured": True, "extra": extra} if status == "complete" else
                                      {"status": "oom", "reason": "CUDA out of memory", "measured": True,
                                       "extra": {**extra, "oom_evidence": "allocator"}})
            db.add_trial(STUDY, number, config, result)
    assert main(["show", STUDY, "--storage", url, "--json"]) == 0
    trials = {t["number"]: t for t in json.loads(capsys.readouterr().out)["trials"]}
    assert (trials[6]["predicted_samples_per_s"], trials[6]["predicted_memory_bytes"]) == (906.0, 30 * GiB)
    assert trials[7]["predicted_samples_per_s"] == 907.0
    assert trials[0]["predicted_samples_per_s"] is None and "predicted_memory_bytes" in trials[0]
    target = tmp_path / "t.csv"
    assert main(["export", STUDY, "--output", str(target), "--storage", url]) == 0
    frame = pd.read_csv(target).set_index("number")
    assert frame.loc[6, "predicted_samples_per_s"] == 906.0 and frame.loc[7, "predicted_memory_bytes"] == 30 * GiB
    capsys.readouterr()
    assert main(["report", STUDY, "--output", str(tmp_path / "rep"), "--storage", url, "--json"]) == 0
    images = json.loads(capsys.readouterr().out)["images"]
    assert Path(images["predicted_vs_measured"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_shows_the_metric_it_ranked_by_and_says_when_a_measurement_was_not_repeated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--metric tokens_per_s`` printed samples/s only; a stopped study's best, measured once, looked final."""
    from autoslapo.cli import main
    from store import open_store

    url = f"sqlite:///{tmp_path / 'b.db'}"
    written = make_study(url, n=6, measured_every=1)
    best = max((w for w in written if w["status"] == "complete"), key=lambda w: w["tokens_per_s"])
    assert main(["best", "bert", "--gpus", "64", "--metric", "tokens_per_s", "--storage", url]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f"{best['tokens_per_s']:,.0f} tokens/s, {best['samples_per_s']:,.1f} samples/s (measured" in first
    with open_store(url) as db:
        db.set_study_status(STUDY, "stopped")
    assert main(["best", "bert", "--gpus", "64", "--storage", url]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note.startswith(f"  one measurement: study {STUDY} is stopped") and "--resume" in note
    with open_store(url) as db:
        db.set_study_status(STUDY, "complete")
    assert main(["best", "bert", "--gpus", "64", "--storage", url]) == 0
    assert "one measurement" not in capsys.readouterr().out


def test_show_of_a_baselines_study_names_the_one_that_found_no_configuration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A baseline none of whose configurations fitted is stored as {"baseline": kind}: `show` printed
    tp=None attn_kernel=None ... for it and baseline=None for the other."""
    from store import open_store

    url = f"sqlite:///{tmp_path / 'b.db'}"
    spec, cluster = ModelSpec.from_name("t5-tiny"), ClusterSpec(gpus=2, gpu_type="cpu")
    with open_store(url) as db:
        db.create_study("s.baselines", model=spec.to_dict(), cluster=cluster.to_dict(), space_name="baselines",
                        space_version="1", objective="samples_per_s", backend="sim",
                        model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
        db.add_trial("s.baselines", 0, ScheduleConfig(dp=2, micro_batch=4, zero_stage=2).to_dict(),
                     {"status": "complete", "samples_per_s": 10.0, "extra": {"baseline": "deepspeed"}})
        db.add_trial("s.baselines", 1, {"baseline": "megatron"},
                     {"status": "oom", "reason": "no megatron-style configuration fits", "extra": {"baseline": "megatron"}})
    assert main(["show", "s.baselines", "--storage", url]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "(no megatron configuration)" in out, out


def test_best_names_its_global_batch_and_keeps_to_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``best`` did not say the global batch its answer ran at, nor take one: studies of one model and
    cluster tuned at different batches gave the best of any, as if batches did not change a schedule."""
    import autoslapo.best_batch
    from autoslapo.api import best_trial
    from autoslapo.errors import UsageError

    url = f"sqlite:///{tmp_path / 'b.db'}"
    written = make_study(url)  # trials of dp 8-64 and micro-batches 4-16: global batches 32 to 512
    complete = [w for w in written if w["status"] == "complete"]
    batch = {w["number"]: w["config"]["micro_batch"] * w["config"]["grad_accum"] * w["config"]["dp"] for w in complete}
    top = _best(written)
    assert main(["best", "bert", "--gpus", "64", "--json", "--storage", url]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch"] == batch[top["number"]] == 512
    at = 128  # not the best's batch: the best of the trials that ran at it
    want = max((w for w in complete if batch[w["number"]] == at), key=lambda w: w["samples_per_s"])
    monkeypatch.setattr(autoslapo.best_batch, "FIRST_PAGE", 2)  # the ranking read a few trials a page
    monkeypatch.setattr(autoslapo.best_batch, "GROWTH", 2)
    assert main(["best", "bert", "--gpus", "64", "--global-batch", str(at), "--json", "--storage", url]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["trial"], doc["global_batch"]) == (want["number"], at), doc
    assert main(["best", "bert", "--gpus", "64", "--global-batch", str(at), "--storage", url]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f"samples/s (estimated at global batch {at}, study {STUDY} trial {want['number']})" in first, first
    assert best_trial("bert", gpus=64, storage=url, global_batch=at).number == want["number"]
    # none at that batch: the batches stored for this model and cluster, and the fix
    assert main(["best", "bert", "--gpus", "64", "--global-batch", "48", "--storage", url]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "with --global-batch 48 in sqlite:///" in err, err
    assert ("its trials ran at global batch 32, 64, 128, 256 and 512; give --global-batch one of those, or run "
            "`autoslapo tune bert --gpus 64 --global-batch 48` first") in err, err
    assert main(["best", "bert", "--gpus", "8", "--global-batch", "48", "--storage", url]) == 1
    assert "`autoslapo tune bert --gpus 8 --global-batch 48` first" in capsys.readouterr().err  # none tuned
    assert main(["best", "bert", "--gpus", "64", "--global-batch", str(at), "--measured", "--storage", url]) == 1
    assert "with --global-batch 128 passes --measured" in capsys.readouterr().err
    for bad in ("0", "-4"):  # bad input: exit 2, one line, no traceback, before the store is read
        assert main(["best", "bert", "--gpus", "64", "--global-batch", bad, "--storage", url]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--global-batch must be a positive integer: got {bad}" in err, err
    with pytest.raises(UsageError, match=r"^global_batch must be a positive integer: got 0;"):
        best_trial("bert", gpus=64, storage=url, global_batch=0)
