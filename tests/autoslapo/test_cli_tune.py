"""``autoslapo tune`` and ``autoslapo best`` end to end on the sim backend."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.cluster import ClusterSpec
from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from search_spaces import load_space


def test_tune_then_best_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    rc = main(["tune", "bert", "--gpus", "64", "--trials", "20", "--storage", url, "--study", "cli"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "study cli: scored every valid configuration" in out.out and "stored the best 20;" in out.out
    assert "optimum of the cost model over the space: " in out.out
    assert "speedup over deepspeed-style baseline" in out.out and "speedup over megatron-style baseline" in out.out
    assert "20/20" in out.err  # the progress line reached the budget
    rc = main(["best", "bert", "--gpus", "64", "--json", "--storage", url])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["model"] == "bert-large" and doc["gpus"] == 64
    assert doc["config"]["tp"] * doc["config"]["pp"] * doc["config"]["dp"] == 64
    assert doc["samples_per_s"] > 0 and doc["measured"] is False
    rc = main(["best", "bert", "--gpus", "64", "--storage", url])
    assert rc == 0 and "samples/s" in capsys.readouterr().out


@pytest.mark.slow
def test_resume_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["tune", "bert-base", "--gpus", "8", "--gpu-type", "v100-32gb", "--storage", url, "--no-baselines"]
    assert main([*base, "--trials", "5", "--study", "s"]) == 0
    assert main([*base, "--trials", "9", "--study", "s", "--resume"]) == 0
    assert "study s: scored every valid configuration" in (out := capsys.readouterr().out)
    assert "stored the best 9;" in out
    assert "estimates of the published runs' Megatron-LM / DeepSpeed stack" in out  # which stack: said
    assert main([*base, "--trials", "3", "--study", "nope", "--resume"]) == 2
    assert "no study named 'nope'" in capsys.readouterr().err
    assert main([*base, "--trials", "0"]) == 2
    assert "--trials must be a positive integer" in capsys.readouterr().err
    assert main(["best", "bert", "--gpus", "3", "--storage", url]) == 1
    assert "no complete trial" in capsys.readouterr().err
    # trials exist but none passes a filter: say so, not "tune first"
    assert main(["best", "bert-base", "--gpus", "8", "--measured", "--storage", url]) == 1
    err = capsys.readouterr().err
    assert "passes --measured" in err and "tune with a measuring backend" in err and "first" not in err
    assert main(["best", "bert-base", "--gpus", "8", "--headroom", "31", "--storage", url]) == 1
    assert "passes --headroom 31" in (err := capsys.readouterr().err) and "relax it" in err
    # how much any leaves free (it said "(trials without them are stored)")
    assert "the most a stored trial leaves free is 26.8 GiB of 31.7 GiB a device; relax it" in err, err
    # the answer names its node size; --gpus-per-node keeps to one
    assert main(["best", "bert-base", "--gpus", "8", "--storage", url]) == 0
    assert "on 8x v100-32gb (8 a node):" in capsys.readouterr().out
    assert main(["best", "bert-base", "--gpus", "8", "--gpus-per-node", "4", "--storage", url]) == 1
    assert "--gpus-per-node 4` first" in capsys.readouterr().err
    # the tuner's companion studies of baselines are not offered as names to show or resume
    assert main([*base[:-1], "--trials", "2", "--study", "b"]) == 0
    capsys.readouterr()
    assert main(["show", "nope", "--storage", url]) == 2
    assert ".baselines" not in (err := capsys.readouterr().err) and "known studies are" in err
    with pytest.raises(SystemExit) as e:
        main(["tune", "bert", "--gpus", "8", "--sampler", "bogus"])
    assert e.value.code == 2


def test_user_space_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "s.toml"
    space.write_text('name = "mine"\n[knobs]\ntp = [1, 2]\nmicro_batch = [1, 2]\n')
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    rc = main(["tune", "bert-base", "--gpus", "8", "--space", str(space), "--trials", "50", "--storage", url,
               "--no-baselines"])
    out = capsys.readouterr().out
    n = len(load_space(space).bind(ModelSpec.from_name("bert-base"), ClusterSpec(gpus=8, gpu_type="a100-80gb")).configs())
    assert rc == 0 and f"scored every valid configuration, {n}: {n} fit" in out and f"stored the best {n};" in out
    rc = main(["tune", "bert-base", "--gpus", "8", "--space", str(space), "--trials", "50", "--storage", url,
               "--no-baselines", "--sampler", "random", "--study", "sampled"])
    assert rc == 0 and "stopped by exhausted" in capsys.readouterr().out  # an explicit sampler samples
    space.write_text('name = "mine"\n[knobs]\ntp = [3]\n')
    assert main(["tune", "bert-base", "--gpus", "8", "--space", str(space), "--storage", url]) == 2
    assert "no value of tp" in capsys.readouterr().err


@pytest.mark.slow
def test_nsga2_prints_its_pareto_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["tune", "bert", "--gpus", "64", "--sampler", "nsga2", "--trials", "40", "--no-baselines",
               "--top", "50", "--storage", f"sqlite:///{tmp_path / 'n.db'}"])
    out = capsys.readouterr().out
    assert rc == 0 and "Pareto front of throughput vs memory per device" in out
    numbers = [int(line.split()[0]) for line in out.splitlines() if line[:4].strip().isdigit()]
    from store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'n.db'}")
    try:
        by_number = {t.number: t for t in store.trials("bert-large-64xa100-80gb-sim")}
    finally:
        store.close()
    speed = [by_number[n].samples_per_s or 0.0 for n in numbers]
    mem = [by_number[n].peak_memory_bytes or 0 for n in numbers]
    assert len(numbers) >= 2 and speed == sorted(speed, reverse=True)
    # fastest first, and each slower schedule of the front needs less memory than every faster one
    assert all(mem[i + 1] < mem[i] for i in range(len(mem) - 1)), (speed, mem)
    # and no complete trial beats one of them on both
    done = [t for t in by_number.values() if t.status == "complete"]
    for n in numbers:
        t = by_number[n]
        assert not any((o.samples_per_s or 0) > (t.samples_per_s or 0) and (o.peak_memory_bytes or 0) <
                       (t.peak_memory_bytes or 0) for o in done)


def test_cli_modules_import_nothing_heavy() -> None:
    code = ("import sys, autoslapo.cli.tune, autoslapo.cli.best; "
            "print([m for m in ('optuna', 'ray', 'sqlalchemy', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_absurd_gpu_count_is_one_line_and_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOSLAPO_STORAGE", raising=False)
    assert main(["tune", "bert", "--gpus", "1000000000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpus must be at most 1,048,576" in err[0] and "got 1,000,000,000,000" in err[0]
    assert list(tmp_path.iterdir()) == []  # no autoslapo.db (nor anything else) was written


def test_a_speedup_line_carries_its_interval_and_says_when_it_is_noise() -> None:
    from autoslapo.cli.tune import speedup_line

    config = {"tp": 1, "pp": 1, "dp": 2, "micro_batch": 4, "grad_accum": 1, "ckpt_ratio": 0.0, "zero_stage": 0,
              "attn_kernel": "sdpa"}
    ci = {"speedup": 1.19, "low": 1.07, "high": 1.31, "significant": True, "repeats": 3}
    b = {"speedup": 1.19, "samples_per_s": 10.0, "config": config, "status": "complete", "reason": "",
         "speedup_ci95": ci}
    assert speedup_line("deepspeed", b).startswith(
        "speedup over deepspeed-style baseline: 1.19x (95% CI 1.07-1.31, 3 interleaved repeats; baseline 10.0")
    # a resumed study's finalist holds the samples of both runs; the baseline those it was picked with
    mixed = {**b, "speedup_ci95": {**ci, "repeats": 1, "n_tuned": 5, "n_baseline": 3}}
    assert "(95% CI 1.07-1.31, medians of 5 and 3 measurements; baseline" in speedup_line("deepspeed", mixed)
    noise = {**b, "speedup_ci95": {**ci, "low": 0.96, "significant": False}}
    assert speedup_line("deepspeed", noise).startswith(
        "speedup over deepspeed-style baseline: no significant speed-up, 1.19x (95% CI 0.96-1.31, 3 interleaved")
    assert speedup_line("megatron", {**b, "speedup_ci95": None}) == (
        "speedup over megatron-style baseline: 1.19x (baseline 10.0 samples/s: tp=1 pp=1 dp=2 mb=4 accum=1 "
        "ckpt=0.00 zero=0 attn=sdpa)")


@pytest.mark.slow
def test_a_local_study_prints_speedups_with_intervals_and_best_carries_them(tmp_path: Path) -> None:
    # Real CPU ranks: 4 trials, the baselines, then 3 interleaved rounds of finalists and baselines.
    url = f"sqlite:///{tmp_path / 'local.db'}"
    tune = subprocess.run([sys.executable, "-m", "autoslapo", "tune", "bert-tiny", "--gpus", "2", "--backend", "local",
                           "--trials", "4", "--storage", url], capture_output=True, text=True, timeout=1800)
    assert tune.returncode == 0, tune.stderr[-2000:]
    lines = [ln for ln in tune.stdout.splitlines() if ln.startswith("speedup over")]
    assert len(lines) == 2, tune.stdout
    assert all("(95% CI " in ln and ", 3 interleaved repeats;" in ln for ln in lines if "n/a" not in ln), tune.stdout
    best = subprocess.run([sys.executable, "-m", "autoslapo", "best", "bert-tiny", "--gpus", "2", "--json",
                           "--storage", url], capture_output=True, text=True, timeout=300)
    doc = json.loads(best.stdout)
    # The best trial may be a baseline (they are measured trials too): both carry the same keys.
    assert len(doc["repeats_samples_per_s"]) == 4
    assert doc["samples_per_s"] == pytest.approx(statistics.median(doc["repeats_samples_per_s"]))
    assert doc["speedup_ci95"] and all(c["low"] <= c["speedup"] <= c["high"] for c in doc["speedup_ci95"].values())


@pytest.mark.slow
def test_a_study_on_a_described_network_keeps_its_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from store import open_store

    url = f"sqlite:///{tmp_path / 'links.db'}"
    assert main(["tune", "gpt2-xl", "--gpus", "64", "--trials", "5", "--inter-node-gbps", "6.25", "--storage", url,
                 "--study", "slow", "--no-baselines"]) == 0
    assert "(gpt2-xl on 64 x a100-80gb (inter-node 6.25 GB/s), backend sim)" in capsys.readouterr().out
    assert main(["tune", "gpt2-xl", "--gpus", "64", "--trials", "5", "--storage", url, "--study", "dgx",
                 "--no-baselines"]) == 0
    assert "(gpt2-xl on 64 x a100-80gb, backend sim)" in capsys.readouterr().out
    assert main(["show", "slow", "--storage", url]) == 0
    assert "study slow: gpt2-xl on 64 x a100-80gb (inter-node 6.25 GB/s), backend sim" in capsys.readouterr().out
    assert main(["studies", "--storage", url]) == 0
    listed = capsys.readouterr().out
    assert "64 x a100-80gb (inter-node 6.25 GB/s)" in listed and "64 x a100-80gb  " in listed
    assert main(["tune", "gpt2-xl", "--gpus", "64", "--storage", url, "--study", "slow", "--resume"]) == 2
    assert "tuned gpt2-xl on 64 x a100-80gb (inter-node 6.25 GB/s); pass the same" in capsys.readouterr().err
    with open_store(url) as store:
        slow, dgx = store.get_study("slow"), store.get_study("dgx")
        assert slow.cluster["inter_node_gbps"] == 6.25 and dgx.cluster["inter_node_gbps"] == 25.0
        assert slow.cluster_fingerprint != dgx.cluster_fingerprint
        best = {name: max(t.samples_per_s or 0 for t in store.trials(name)) for name in ("slow", "dgx")}
    assert best["slow"] < best["dgx"]
    assert main(["tune", "gpt2-xl", "--gpus", "64", "--inter-node-gbps", "-2", "--storage", url]) == 2
    assert "--inter-node-gbps is GB/s a device" in capsys.readouterr().err
    # best: any network unless links are given, then only studies of a cluster with those links
    for extra, study in (([], "dgx"), (["--inter-node-gbps", "6.25"], "slow"), (["--inter-node-gbps", "25"], "dgx")):
        assert main(["best", "gpt2-xl", "--gpus", "64", "--storage", url, "--json", *extra]) == 0
        assert json.loads(capsys.readouterr().out)["study"] == study
    assert main(["best", "gpt2-xl", "--gpus", "64", "--storage", url, "--inter-node-gbps", "12.5"]) == 1
    err = capsys.readouterr().err
    assert "on 64 devices with --inter-node-gbps 12.5" in err
    assert "run `autoslapo tune gpt2-xl --gpus 64 --inter-node-gbps 12.5` first" in err
    from autoslapo import api

    assert api.best_trial("gpt2-xl", gpus=64, storage=url, links={"inter_node_gbps": 6.25}).study == "slow"
    with pytest.raises(UsageError, match=r"with inter_node_gbps 12\.5"):
        api.best_trial("gpt2-xl", gpus=64, storage=url, links={"inter_node_gbps": 12.5})
    with pytest.raises(UsageError, match=r"with inter_node_gbps 12\.5"):  # looked up before any rank is needed
        api.apply_best("gpt2-xl", gpus=64, storage=url, links={"inter_node_gbps": 12.5})


def test_real_trials_default_to_this_machines_device_and_a_described_cluster_to_an_a100(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoslapo.cli.tune import _cuda_device_names, default_gpu_type

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b)'\n"
                   "echo 'GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2c3d)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    names = _cuda_device_names()
    assert names == ["NVIDIA H100 80GB HBM3"] * 2
    assert default_gpu_type("local", names) == "h100-80gb"
    assert default_gpu_type("ray", ["NVIDIA A100-SXM4-40GB"]) == "a100-40gb"
    assert default_gpu_type("local", []) == "cpu"
    assert default_gpu_type("local", ["NVIDIA GeForce RTX 4090"]) == "a100-80gb"
    assert default_gpu_type("sim", names) == "a100-80gb"


def test_the_table_keeps_a_cpus_small_tflops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CPU rank's TFLOP/s (hundredths) keep three significant digits in tune's table, not 0.0."""
    url = f"sqlite:///{tmp_path / 'cpu.db'}"
    assert main(["tune", "bert-tiny", "--gpus", "4", "--gpu-type", "cpu", "--trials", "3", "--no-baselines",
                 "--storage", url]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = out[out.index(next(line for line in out if "TFLOP/s/dev" in line)) + 1:][:3]
    tflops = [float(row.split()[2]) for row in rows]
    assert all(0 < x < 0.1 for x in tflops), rows
