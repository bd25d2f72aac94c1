"""``autoslapo estimate`` and ``autoslapo profile``: output, flags, errors, profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.cost.profile import load_profile, save_profile
from autoslapo.errors import UsageError


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_bert_64_a100_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                    tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    d = _json(capsys, ["estimate", "bert", "--gpus", "64", "--gpu-type", "a100-80gb", "--json"])
    for key in ("samples_per_s", "tokens_per_s", "tflops_per_device", "hw_tflops_per_device",
                "memory_per_device_bytes", "fits", "config"):
        assert key in d
    assert d["fits"] and d["config"]["tp"] * d["config"]["pp"] * d["config"]["dp"] == 64
    pure = _json(capsys, ["estimate", "bert", "--gpus", "64", "--gpu-type", "a100-80gb", "--tp", "1",
                          "--pp", "1", "--dp", "64", "--seq-len", "128", "--json"])
    assert abs(pure["samples_per_s"] / 35774 - 1) <= 0.30
    assert pure["config"]["dp"] == 64 and pure["model"]["seq_len"] == 128


def test_estimate_fixed_knobs_are_kept(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    d = _json(capsys, ["estimate", "gpt2-large", "--gpus", "16", "--gpu-type", "a100-40gb", "--tp", "4",
                       "--micro-batch", "2", "--global-batch", "64", "--ckpt-ratio", "0.5", "--zero-stage", "1",
                       "--attn", "eager", "--json"])
    c = d["config"]
    assert (c["tp"], c["micro_batch"], c["ckpt_ratio"], c["zero_stage"], c["attn_kernel"]) == (4, 2, 0.5, 1, "eager")
    assert c["micro_batch"] * c["grad_accum"] * c["dp"] == 64
    fused = _json(capsys, ["estimate", "bert", "--gpus", "8", "--gpu-type", "a100-80gb", "--dp", "8",
                           "--micro-batch", "16", "--fuse-bias-gelu", "on", "--compile-layers", "off", "--json"])
    plain = _json(capsys, ["estimate", "bert", "--gpus", "8", "--gpu-type", "a100-80gb", "--dp", "8",
                           "--micro-batch", "16", "--fuse-bias-gelu", "off", "--compile-layers", "off", "--json"])
    assert fused["config"]["fuse_bias_gelu"] and not plain["config"]["fuse_bias_gelu"]
    assert fused["samples_per_s"] > plain["samples_per_s"]
    assert main(["estimate", "gpt2-large", "--gpus", "16", "--tp", "2"]) == 0
    assert "samples/s" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["estimate", "bert", "--gpus", "8", "--gpu-type", "tpu"], "--gpu-type"),
    (["estimate", "nosuchmodel", "--gpus", "8"], "unknown model"),
    (["estimate", "bert", "--gpus", "8", "--tp", "3"], "no valid schedule"),
    # a pin no configuration can have says which rule it breaks, the value and the fix
    (["estimate", "gpt2-xl", "--gpus", "8", "--tp", "2"], "tp must divide the attention heads: got tp=2 for 25 heads"),
    (["estimate", "gpt2-xl", "--gpus", "64", "--pp", "64"], "pipeline chunks must each hold a layer, but the first"),
        (["estimate", "gpt2-xl", "--gpus", "8", "--pp", "5"], "pp must divide --gpus: got pp=5 for --gpus 8"),
    (["estimate", "bert", "--gpus", "8", "--tp", "1", "--pp", "2", "--dp", "2"], "tp*pp*dp must equal --gpus"),
    # the pins as a person writes them, not a Python dict
    (["estimate", "bert", "--gpus", "8", "--tp", "1", "--pp", "1", "--dp", "4"],
     "with the pins tp=1 pp=1 dp=4: tp*pp*dp must equal --gpus"),
    (["estimate", "bert", "--gpus", "8", "--ckpt-ratio", "1.5"], "got 1.5 in the pinned knobs"),
    # each link's example is its own (a PCIe node's, a network's)
    (["estimate", "bert", "--gpus", "8", "--intra-node-gbps", "-1"], "got -1.0; e.g. 32 for PCIe 4.0 x16"),
    (["estimate", "bert", "--gpus", "8", "--inter-node-gbps", "0"], "got 0.0; e.g. 6.25 for a node's 4x 100 Gb/s"),
    (["estimate", "bert", "--gpus", "8", "--global-batch", "7", "--micro-batch", "2"],
     "got global batch 7 for micro-batch 2 x dp"),
    (["estimate", "wideresnet-50-2", "--gpus", "8", "--attn", "flash"], "attn_kernel does not apply to wideresnet"),
    (["estimate", "llama-70b", "--gpus", "1", "--gpu-type", "v100-16gb"], "fits in memory"),
])
def test_estimate_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str,
                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_estimate_uses_profile(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                               tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["estimate", "bert-tiny", "--gpus", "2", "--gpu-type", "cpu", "--dp", "2", "--micro-batch", "4", "--json"]
    base = _json(capsys, argv)
    prof = {"gpu_type": "cpu", "peak_tflops": 0.002, "peak_tflops_fp32": 0.002, "hbm_gbps": 1.0,
            "intra_node_gbps": 0.1, "inter_node_gbps": 0.1, "fixed_overhead_bytes": 500 * 2**20,
            "gemm_curve": [[1e6, 0.001], [1e9, 0.002]], "memory_bytes": 4 * 2**30}
    path = save_profile(prof, tmp_path / "p.json")
    slow = _json(capsys, [*argv, "--profile", str(path)])
    assert slow["samples_per_s"] < base["samples_per_s"]
    assert slow["memory"]["overhead"] == 500 * 2**20 and slow["cluster"]["memory_bytes"] == 4 * 2**30
    monkeypatch.setenv("AUTOSLAPO_PROFILE", str(path))
    assert _json(capsys, argv)["samples_per_s"] == slow["samples_per_s"]
    wrong = save_profile({**prof, "gpu_type": "a100-80gb"}, tmp_path / "w.json")
    assert main([*argv, "--profile", str(wrong)]) == 2
    assert "profile is for" in capsys.readouterr().err
    # $AUTOSLAPO_PROFILE (a CPU profile, as `autoslapo profile` saves) is not an A100's: every GPU
    # estimate failed with "the profile is for 'cpu'"; it calibrates only its own device
    gpu = ["estimate", "bert-tiny", "--gpus", "8", "--gpu-type", "a100-80gb", "--json"]
    assert _json(capsys, gpu)["cluster"]["gpu_type"] == "a100-80gb"
    monkeypatch.setenv("AUTOSLAPO_PROFILE", str(tmp_path / "gone.json"))  # the message says where the path came from
    assert main(gpu) == 2 and "$AUTOSLAPO_PROFILE: " in capsys.readouterr().err


def test_load_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not found"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(UsageError, match="JSON"):
        load_profile(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(UsageError, match="not an autoslapo profile"):
        load_profile(tmp_path / "other.json")


@pytest.mark.slow
def test_profile_measures_this_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu.json"
    assert main(["profile", "--ranks", "2", "--quick", "--profile", str(out)]) == 0
    prof = load_profile(out)
    assert prof["gpu_type"] == "cpu" and prof["peak_tflops_fp32"] > 0 and prof["intra_node_gbps"] > 0
    assert prof["fixed_overhead_bytes"] > 50 * 2**20 and len(prof["gemm_curve"]) >= 3
    assert "saved" in capsys.readouterr().out


def test_estimate_cluster_from_a_study_uses_its_calibration(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost import estimate
    from autoslapo.cost.device import device_perf, for_autoslapo_runtime
    from autoslapo.models.spec import ModelSpec
    from store import open_store

    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'cal.db'}"
    cluster, model = ClusterSpec(gpus=16, gpu_type="v100-32gb"), ModelSpec.from_name("bert")
    with open_store(url) as db:
        for name, backend in (("real", "local"), ("sim", "sim")):
            db.create_study(name, model=model.to_dict(), cluster=cluster.to_dict(), space_name="bert",
                            space_version="1", objective="samples_per_s", backend=backend,
                            model_signature=model.signature(), cluster_fingerprint=cluster.fingerprint())
    fixed = ["--tp", "2", "--pp", "1", "--dp", "8", "--micro-batch", "8", "--json"]
    plain = _json(capsys, ["estimate", "bert", "--gpus", "16", "--gpu-type", "v100-32gb", *fixed])
    assert plain["runtime"] == "megatron" and plain["config"]["precision"] == "fp16"
    # a simulated study's cluster: the published stack the preset describes, as without --cluster-from
    sim = _json(capsys, ["estimate", "bert", "--cluster-from", "sim", "--storage", url, *fixed])
    assert sim["calibration"] is None and sim["samples_per_s"] == plain["samples_per_s"]
    # a study of real trials: autoslapo's runtime, which they ran (fp16 with its loss scaling on a V100)
    none_yet = _json(capsys, ["estimate", "bert", "--cluster-from", "real", "--storage", url, *fixed])
    assert none_yet["calibration"] is None and none_yet["cluster"] == cluster.to_dict()
    assert none_yet["runtime"] == "autoslapo-gpu" and none_yet["config"]["precision"] == "fp16"
    want = estimate(model, ScheduleConfig.from_dict(none_yet["config"]), cluster,
                    perf=for_autoslapo_runtime(device_perf(cluster)))
    assert none_yet["samples_per_s"] == pytest.approx(want.samples_per_s)
    assert none_yet["memory_per_device_bytes"] == want.memory_per_device_bytes
    assert none_yet["samples_per_s"] < plain["samples_per_s"]
    with open_store(url) as db:
        db.save_calibration(cluster.fingerprint(), {"compute": 0.5, "activation": 2.0}, 4)
    cal = _json(capsys, ["estimate", "bert", "--cluster-from", "real", "--storage", url, *fixed])
    assert cal["calibration"] == {"study": "real", "params": {"compute": 0.5, "activation": 2.0}, "n_trials": 4}
    # half the compute rate slows only compute, a small share of this layout's fp16 step on two
    # DGX-1 nodes (the rest: collectives of fp32 gradients and tp): 0.92x by the model
    assert cal["samples_per_s"] < 0.95 * none_yet["samples_per_s"]
    assert cal["memory"]["activations"] > 1.9 * none_yet["memory"]["activations"]
    assert main(["estimate", "bert", "--cluster-from", "real", "--storage", url, "--tp", "2", "--pp", "1",
                 "--micro-batch", "8"]) == 0
    assert "autoslapo's runtime, which its trials ran" in capsys.readouterr().out
    # a pin the runtime cannot run: the rule, not a schedule it would refuse
    assert main(["estimate", "bert", "--cluster-from", "real", "--storage", url, "--pp", "2", "--grad-accum", "1"]) == 2
    assert "runs on autoslapo's runtime: a pipeline needs at least one micro-batch per stage" in capsys.readouterr().err
    assert main(["estimate", "bert", "--cluster-from", "real", "--storage", url, "--gpus", "8"]) == 2
    assert "--gpus 8, the study has 16" in capsys.readouterr().err



def test_estimate_cluster_from_a_study_uses_its_global_batch(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The study tuned at one global batch: an estimate on its cluster answers at that batch, not at
    its own defaults (the largest micro-batch, 4 x pp micro-batches a pipeline), unless told another."""
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    url = f"sqlite:///{tmp_path / 'gb.db'}"
    assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--global-batch", "32", "--trials", "4",
                 "--no-baselines", "--storage", url, "--study", "s"]) == 0
    capsys.readouterr()
    here = ["--cluster-from", "s", "--storage", url]

    def batch(d: dict) -> int:
        c = d["config"]
        return c["micro_batch"] * c["grad_accum"] * c["dp"]

    d = _json(capsys, ["estimate", "bert-tiny", *here, "--top", "3", "--json"])
    assert (d["global_batch"], d["global_batch_from"], batch(d)) == (32, "study", 32)
    assert all(r["config"]["micro_batch"] * r["config"]["grad_accum"] * r["config"]["dp"] == 32 for r in d["top"])
    piped = _json(capsys, ["estimate", "bert-tiny", *here, "--pp", "2", "--json"])  # not 4 x pp micro-batches
    assert batch(piped) == 32 and piped["global_batch_from"] == "study"
    assert main(["estimate", "bert-tiny", *here]) == 0
    out = capsys.readouterr().out
    assert "global batch 32, the study's" in out and "not fixed" not in out
    # an explicit --global-batch (or a --grad-accum pin) wins; the batch is then not the study's
    given = _json(capsys, ["estimate", "bert-tiny", *here, "--global-batch", "64", "--json"])
    assert (given["global_batch"], given["global_batch_from"], batch(given)) == (64, None, 64)
    pinned = _json(capsys, ["estimate", "bert-tiny", *here, "--grad-accum", "2", "--json"])
    assert pinned["global_batch_from"] is None and pinned["config"]["grad_accum"] == 2
    # another model (or shape) on the study's cluster: its batch is not that model's, so not applied
    other = _json(capsys, ["estimate", "bert-tiny", *here, "--layers", "4", "--json"])
    assert other["global_batch_from"] is None and other["calibration"] is None
    # a pin the study's batch cannot split over says where the batch came from
    assert main(["estimate", "bert-tiny", *here, "--micro-batch", "3"]) == 2
    assert "global batch 32 is s's, which its trials ran at; --global-batch N overrides it" in capsys.readouterr().err


def test_trials_global_batch_is_the_one_most_trials_ran_at() -> None:
    from autoslapo.storage import trials_global_batch

    assert trials_global_batch([]) is None
    assert trials_global_batch([{"micro_batch": 4, "grad_accum": 2, "dp": 4}, {"dp": 2, "micro_batch": 16}]) == 32
    assert trials_global_batch([{"micro_batch": 2, "dp": 4}, {"micro_batch": 8, "dp": 8},
                                {"micro_batch": 16, "dp": 4}]) == 64


@pytest.mark.slow
def test_estimate_top_lists_the_fastest_schedules_that_fit(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost import best_config, candidate_configs, estimate
    from autoslapo.models.spec import ModelSpec

    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    d = _json(capsys, ["estimate", "gpt2", "--gpus", "8", "--tp", "2", "--top", "6", "--json"])
    top = d["top"]
    assert [r["rank"] for r in top] == [1, 2, 3, 4, 5, 6]
    assert top[0]["config"] == d["config"] and top[0]["samples_per_s"] == d["samples_per_s"]
    rates = [r["samples_per_s"] for r in top]
    assert rates == sorted(rates, reverse=True) and all(r["config"]["tp"] == 2 for r in top)
    assert len({json.dumps(r["config"], sort_keys=True) for r in top}) == 6
    # the same six as estimating every candidate that fits and ranking them
    model, cluster = ModelSpec.from_name("gpt2"), ClusterSpec(gpus=8)
    every = [e for group in candidate_configs(model, cluster, tp=2) for c in group
             if (e := estimate(model, c, cluster, validate=False)).fits]
    want = sorted(e.samples_per_s for e in every)[-6:][::-1]
    assert rates == pytest.approx(want)
    assert ScheduleConfig.from_dict(top[0]["config"]) == best_config(model, cluster, tp=2).config
    assert main(["estimate", "gpt2", "--gpus", "8", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "the 3 fastest schedules that fit:" in out and "   3. " in out
    assert "top" not in _json(capsys, ["estimate", "gpt2", "--gpus", "8", "--json"])  # the best alone by default
    for bad in ("0", "101"):
        assert main(["estimate", "gpt2", "--gpus", "8", "--top", bad]) == 2
        assert "top must be a whole number of schedules from 1 to 100" in capsys.readouterr().err


def test_estimate_says_which_knobs_were_pinned_searched_or_left_at_defaults(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    d = _json(capsys, ["estimate", "gpt2", "--gpus", "8", "--tp", "2", "--zero-stage", "1", "--json"])
    assert d["pinned"] == ["tp", "zero_stage"]
    assert _json(capsys, ["estimate", "gpt2", "--gpus", "8", "--json"])["pinned"] == []
    assert main(["estimate", "gpt2", "--gpus", "8", "--tp", "2", "--compile-layers", "on"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("pinned:"))
    assert line.strip().startswith("pinned: tp=2 compile;")
    assert "searched (fastest that fits): pp mb ckpt zero attn sp gran loss;" in line
    assert line.endswith("defaults: place fuse sched vs prec")


def test_a_pinned_knob_is_searched_where_it_acts(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    base = ["estimate", "gpt2-xl", "--gpus", "8", "--attn", "eager", "--json"]
    lean = _json(capsys, [*base, "--ckpt-granularity", "selective", "--loss-kernel", "chunked"])
    # selective recomputation acts only on checkpointed layers: the ratio the search picks is above 0
    assert lean["config"]["ckpt_granularity"] == "selective" and lean["config"]["ckpt_ratio"] > 0
    # the same schedule without the lean kernels (no recomputation, the eager loss) needs more memory
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost import estimate
    from autoslapo.models.spec import ModelSpec

    plain = ScheduleConfig.from_dict(lean["config"]).with_(ckpt_ratio=0.0, ckpt_granularity="full",
                                                             loss_kernel="eager")
    without = estimate(ModelSpec.from_name("gpt2-xl"), plain, ClusterSpec(gpus=8))
    assert lean["memory_per_device_bytes"] < without.memory_per_device_bytes
    sp = _json(capsys, ["estimate", "llama-7b", "--gpus", "8", "--sequence-parallel", "on", "--json"])
    assert sp["config"]["tp"] > 1  # sequence parallelism splits over the TP group
    # where nothing lets the pin act, the search still answers (ZeRO-1 without data parallelism)
    inert = _json(capsys, ["estimate", "gpt2-xl", "--gpus", "8", "--tp", "1", "--pp", "8", "--zero-stage", "1",
                           "--micro-batch", "1", "--json"])
    assert inert["config"]["dp"] == 1 and inert["config"]["zero_stage"] == 1
    # and the text says the pin changes nothing there; a pin that acts gets no such note
    assert main(["estimate", "gpt2-xl", "--gpus", "8", "--tp", "1", "--pp", "8", "--zero-stage", "1",
                 "--micro-batch", "1"]) == 0
    assert "note: pinned, but changes nothing in this schedule: zero=1" in capsys.readouterr().out
    assert main(["estimate", "gpt2-xl", "--gpus", "8", "--zero-stage", "1"]) == 0
    assert "changes nothing" not in capsys.readouterr().out


def test_a_pinned_checkpoint_ratio_alone_means_whole_layers(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from search_spaces import space_for

    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    base = ["estimate", "llama-7b", "--gpus", "8", "--ckpt-ratio", "1", "--json"]
    # ckpt_granularity refines ckpt_ratio: a command that pins the ratio alone (as one written before
    # the granularity existed) gets whole layers recomputed, not the faster selective recomputation
    assert _json(capsys, base)["config"]["ckpt_granularity"] == "full"
    assert _json(capsys, [*base, "--ckpt-granularity", "selective"])["config"]["ckpt_granularity"] == "selective"
    pinned = space_for("llama").pin({"ckpt_ratio": 1.0})
    assert pinned.fixed["ckpt_granularity"] == "full" and "ckpt_granularity" not in pinned.knobs
    both = space_for("llama").pin({"ckpt_ratio": 1.0, "ckpt_granularity": "selective"})
    assert both.fixed["ckpt_granularity"] == "selective"
    assert "ckpt_granularity" not in space_for("llama").pin({"tp": 2}).fixed  # searched while the ratio is


def test_a_described_network_slows_what_crosses_nodes(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    across = ["estimate", "gpt2-xl", "--gpus", "64", "--tp", "1", "--pp", "1", "--zero-stage", "0", "--json"]
    within = ["estimate", "gpt2-xl", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero-stage", "0", "--json"]
    dgx, slow = _json(capsys, across), _json(capsys, [*across, "--inter-node-gbps", "6.25"])
    assert slow["cluster"]["inter_node_gbps"] == 6.25 and dgx["cluster"]["inter_node_gbps"] == 25.0
    assert slow["time"]["dp_comm"] > 3 * dgx["time"]["dp_comm"] and slow["samples_per_s"] < dgx["samples_per_s"]
    one_node = _json(capsys, within)
    assert _json(capsys, [*within, "--inter-node-gbps", "6.25"])["samples_per_s"] == one_node["samples_per_s"]
    pcie = _json(capsys, [*within, "--intra-node-gbps", "32"])  # PCIe 4.0 x16 between the devices
    assert pcie["samples_per_s"] < one_node["samples_per_s"]
    assert main([*across[:-1], "--inter-node-gbps", "6.25"]) == 0
    assert "on 64 x a100-80gb (inter-node 6.25 GB/s)" in capsys.readouterr().out
    assert main([*across, "--inter-node-gbps", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--inter-node-gbps is GB/s a device" in err[0] and "got 0.0" in err[0]


def test_estimate_shows_each_pipeline_ranks_layers(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a 70-layer GPT over 12 stages (BLOOM-176B's split): the first and last hold one layer fewer
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = ["estimate", "gpt2-xl", "--layers", "70", "--gpus", "96", "--tp", "1", "--pp", "12", "--dp", "8"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stage_layers"] == [5] + [6] * 10 + [5]
    assert main(argv) == 0
    assert "pipeline: 70 layers over 12 ranks: 5, 6 x 10, 5 (uneven)" in capsys.readouterr().out
    assert main(["estimate", "gpt2-xl", "--gpus", "8", "--tp", "1", "--pp", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stage_layers"] is None
    # T5's encoder and decoder blocks as one list; Llama 3 405B's 126 layers with end chunks of the
    # embedding alone and the head alone
    assert main(["estimate", "t5-small", "--gpus", "5", "--tp", "1", "--pp", "5"]) == 0
    assert "pipeline: 12 blocks over 5 ranks: 2 x 2, 3 x 2, 2 (uneven)" in capsys.readouterr().out
    assert main(["estimate", "llama-70b", "--layers", "126", "--gpus", "1024", "--tp", "8", "--pp", "16",
                 "--pipeline-schedule", "interleaved", "--virtual-stages", "8"]) == 0
    assert "pipeline: 126 layers over 16 ranks: 7, 8 x 14, 7 (uneven)" in capsys.readouterr().out


def test_the_summary_names_the_stack_priced_a_tight_fit_and_no_tokens_for_images(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A GPU estimate priced the Megatron-LM stack unsaid (autoslapo's own trials need more memory); a
    pick 0.3 GiB under capacity read just "fits"; a ResNet's estimate printed tokens/s."""
    assert main(["estimate", "gpt2-xl", "--gpus", "4"]) == 0
    out = capsys.readouterr().out
    assert "stack: the published runs' Megatron-LM / DeepSpeed" in out and "--cluster-from STUDY" in out
    assert "GiB free, under 5%: the caching allocator's fragmentation may not fit there" in out
    assert main(["estimate", "resnet-50", "--gpus", "8", "--global-batch", "2048"]) == 0
    out = capsys.readouterr().out
    assert "samples/s, step" in out and "tokens/s" not in out and "fragmentation" not in out
    assert "DeepLearningExamples" in out and "Megatron" not in out  # a ResNet's published stack
    assert main(["estimate", "bert-tiny", "--gpus", "2", "--gpu-type", "cpu"]) == 0
    assert "stack:" not in capsys.readouterr().out  # a CPU estimate prices autoslapo's own runtime


def test_an_unfixed_batch_says_a_pipeline_was_compared_at_another_batch(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # without --global-batch a pipeline accumulates 4 x pp micro-batches and a layout without one 1,
    # so the pick can be a pipeline only because its batch is larger (llama-7b on 64 V100: 20.1
    # samples/s at pp 2, while at that batch of 256 tp 2 without stages runs 21.9): the summary says so
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["estimate", "llama-7b", "--gpus", "64", "--gpu-type", "v100-32gb", "--pp", "2"]) == 0
    assert "compared at different batches: pass yours" in capsys.readouterr().out
    assert main(["estimate", "llama-7b", "--gpus", "64", "--gpu-type", "v100-32gb", "--pp", "1"]) == 0
    assert "compared at different batches" not in capsys.readouterr().out
    assert main(["estimate", "llama-7b", "--gpus", "64", "--gpu-type", "v100-32gb", "--pp", "2",
                 "--global-batch", "256"]) == 0
    assert "compared at different batches" not in capsys.readouterr().out


def test_a_pinned_micro_batch_is_not_called_the_largest_that_fits(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """Without --global-batch the summary explains a free micro-batch's pick; a pinned one was not picked."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["estimate", "bert", "--gpus", "8", "--micro-batch", "8"]) == 0
    pinned = [line for line in capsys.readouterr().out.splitlines() if "global batch" in line]
    assert pinned and "not fixed;" in pinned[0] and "largest micro-batch" not in pinned[0]
    assert main(["estimate", "bert", "--gpus", "8"]) == 0
    free = [line for line in capsys.readouterr().out.splitlines() if "global batch" in line]
    assert free and "so the largest micro-batch that fits is fastest" in free[0]


def test_small_rates_keep_their_significant_digits(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A CPU's fraction of a sample a second is printed as such, not as 0.0 samples/s and 0.0 TFLOP/s."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    assert main(["estimate", "llama-7b", "--gpus", "16", "--gpu-type", "cpu"]) == 0
    out = capsys.readouterr().out
    rate = next(line for line in out.splitlines() if "samples/s" in line).split()[0]
    tflops = next(line for line in out.splitlines() if "model TFLOP/s" in line).split()[0]
    assert 0 < float(rate) < 0.1 and 0 < float(tflops) < 0.1, out
