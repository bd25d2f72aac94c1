"""``/v1/estimate``: a preset by GET, a preset or a config by POST, a stored study's model by its signature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.cost import best_config
from autoslapo.models.resolve import resolve_model
from autoslapo.service.estimate import estimate_answer
from autoslapo.service.jobs import StudyRequest
from store import Store
from tests.service.conftest import bearer
from tuner import tune

CONFIG_PATH = Path(__file__).parents[1] / "autoslapo" / "data" / "hf" / "mistral-tiny.json"
CONFIG = json.loads(CONFIG_PATH.read_text())


def test_get_and_post_of_a_preset_answer_the_same(client: TestClient, tokens: dict[str, str]) -> None:
    params = {"model": "bert", "gpus": 16, "gpu_type": "v100-32gb", "global_batch": 256}
    got = client.get("/v1/estimate", params=params, headers=bearer(tokens["read"]))
    posted = client.post("/v1/estimate", json=params, headers=bearer(tokens["read"]))
    assert got.status_code == posted.status_code == 200, posted.text
    assert got.json() == posted.json()
    want = best_config(resolve_model("bert"), ClusterSpec(gpus=16, gpu_type="v100-32gb"), global_batch=256)
    assert posted.json()["samples_per_s"] == pytest.approx(want.samples_per_s)
    assert posted.json()["gpus"] == 16 and posted.json()["gpu_type"] == "v100-32gb"


def test_post_of_a_config_is_the_cost_model_of_its_spec(client: TestClient, tokens: dict[str, str]) -> None:
    r = client.post("/v1/estimate", json={"model": {"hf_config": CONFIG}, "gpus": 8}, headers=bearer(tokens["read"]))
    assert r.status_code == 200, r.text
    want = estimate_answer(resolve_model(str(CONFIG_PATH)), ClusterSpec(gpus=8), None)
    assert r.json() == json.loads(json.dumps(want)) and r.json()["model"] == "mistral"


@pytest.mark.parametrize(("body", "status", "words"), [
    (b'{"model": "bert",', 400, "the body must be JSON"),
    (b'{"model": "bert", "gpus": 8, "trials": 3}', 400, "unknown field 'trials'"),
    (b'{"model": "bert"}', 400, "field 'gpus' is required"),
    (b'{"model": "bert", "gpus": true}', 400, "field 'gpus' must be int"),
    (b'{"model": "nope", "gpus": 8}', 400, "unknown model 'nope'"),
    (b'{"model": {"hf_config": {"model_type": "mamba"}}, "gpus": 8}', 400, "model_type"),
    (b'{"model": "bert", "gpus": 8, "gpu_type": "abacus"}', 400, "abacus"),
    (b'[1]', 400, "must be a JSON object"),
])
def test_a_bad_estimate_is_one_line(client: TestClient, tokens: dict[str, str], body: bytes, status: int,
                                    words: str) -> None:
    r = client.post("/v1/estimate", content=body, headers={**bearer(tokens["read"]), "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert words in r.json()["error"] and "\n" not in r.json()["error"]


def test_estimate_needs_a_token_and_a_body_under_the_limit(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.post("/v1/estimate", json={"model": "bert", "gpus": 8}).status_code == 401
    big = client.post("/v1/estimate", content=b" " * (64 * 1024 + 1), headers=bearer(tokens["read"]))
    assert big.status_code == 413


@pytest.mark.slow
def test_get_by_signature_reads_the_studys_model(client: TestClient, tokens: dict[str, str],
                                                 service_store: Store) -> None:
    spec = resolve_model(str(CONFIG_PATH))
    read = bearer(tokens["read"])
    missing = client.get("/v1/estimate", params={"model": spec.signature(), "gpus": 8}, headers=read)
    assert missing.status_code == 400 and "no study in the store has the model signature" in missing.json()["error"]
    request = StudyRequest.from_json({"model": {"hf_config": CONFIG}, "gpus": 8, "trials": 1, "baselines": False})
    tune(request.to_options(name="cfg"), service_store)  # a study of the config: its spec is in the store
    found = client.get("/v1/estimate", params={"model": spec.signature(), "gpus": 8}, headers=read)
    posted = client.post("/v1/estimate", json={"model": {"hf_config": CONFIG}, "gpus": 8}, headers=read)
    assert found.status_code == 200, found.text
    assert found.json() == posted.json()


def _routed_to(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Send the CLI's HTTP requests to ``client``'s app (the real service, in this process)."""
    import httpx

    def request(method: str, url: str, *, headers: dict[str, str], timeout: float, **kwargs: object) -> httpx.Response:
        path = url.split("://", 1)[1].split("/", 1)[1]
        return client.request(method, "/" + path, headers=headers, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(httpx, "request", request)


def _here_and_remote(argv: list[str], client: TestClient, token: str, monkeypatch: pytest.MonkeyPatch,
                     capsys: pytest.CaptureFixture[str]) -> tuple[dict, dict]:
    """``argv`` (an ``estimate ... --json``) run here, then with ``--server`` against ``client``'s app."""
    from autoslapo.cli import main

    monkeypatch.delenv("AUTOSLAPO_PROFILE", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-autoslapo-home")  # no default profile here
    assert main(argv) == 0
    local = json.loads(capsys.readouterr().out)
    _routed_to(client, monkeypatch)
    monkeypatch.setenv("AUTOSLAPO_TOKEN", token)
    assert main([*argv, "--server", "http://autoslapo.test"]) == 0
    return local, json.loads(capsys.readouterr().out)


PINNED = ["--tp", "2", "--zero-stage", "1", "--ckpt-granularity", "selective", "--loss-kernel", "chunked",
          "--sequence-parallel", "on", "--global-batch", "64"]


@pytest.mark.parametrize("model", ["gpt2", str(CONFIG_PATH)])
def test_estimate_server_answers_what_a_local_estimate_prints(client: TestClient, tokens: dict[str, str],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str], model: str) -> None:
    from autoslapo.cli import main

    argv = ["estimate", model, "--gpus", "8", "--gpu-type", "h100-80gb", "--layers", "4", "--seq-len", "128",
            *PINNED, "--top", "3", "--json"]
    local, remote = _here_and_remote(argv, client, tokens["read"], monkeypatch, capsys)
    assert remote == local
    c = remote["config"]
    assert (c["tp"], c["zero_stage"], c["ckpt_granularity"], c["loss_kernel"], c["sequence_parallel"]) == (
        2, 1, "selective", "chunked", True)
    assert remote["model"]["layers"] == 4 and remote["model"]["seq_len"] == 128
    assert main([*argv[:-1], "--server", "http://autoslapo.test"]) == 0  # the summary, from the same answer
    out = capsys.readouterr().out
    assert "on 8 x h100-80gb (server http://autoslapo.test)" in out and "tp=2" in out and "gran=selective" in out


def test_estimate_server_uses_a_stored_studys_calibration(client: TestClient, tokens: dict[str, str],
                                                          service_store: Store) -> None:
    cluster, spec = ClusterSpec(gpus=16, gpu_type="v100-32gb"), resolve_model("bert")
    service_store.create_study("real", model=spec.to_dict(), cluster=cluster.to_dict(), space_name="bert",
                               space_version="1", objective="samples_per_s", backend="local",
                               model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
    read = bearer(tokens["read"])
    knobs = {"tp": 2, "pp": 1, "dp": 8, "micro_batch": 8}
    plain = client.post("/v1/estimate", json={"model": "bert", "gpus": 16, "gpu_type": "v100-32gb", "knobs": knobs},
                        headers=read).json()
    none_yet = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "real", "knobs": knobs},
                           headers=read).json()
    # the study ran real trials: the estimate is of autoslapo's runtime (fp16 with its loss scaling on a V100)
    assert none_yet["calibration"] is None and plain["runtime"] == "megatron"
    assert none_yet["runtime"] == "autoslapo-gpu" and none_yet["config"]["precision"] == "fp16"
    assert none_yet["samples_per_s"] < plain["samples_per_s"]
    service_store.save_calibration(cluster.fingerprint(), {"compute": 0.5, "activation": 2.0}, 4)
    cal = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "real", "knobs": knobs},
                      headers=read).json()
    assert cal["calibration"] == {"study": "real", "params": {"compute": 0.5, "activation": 2.0}, "n_trials": 4}
    # half the compute rate slows only compute, a small share of this layout's fp16 step on two
    # DGX-1 nodes (the rest: collectives of fp32 gradients and tp): 0.92x by the model
    assert cal["samples_per_s"] < 0.95 * none_yet["samples_per_s"]
    assert cal["memory"]["activations"] > 1.9 * none_yet["memory"]["activations"]
    clash = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "real", "gpus": 8}, headers=read)
    assert clash.status_code == 400 and "got gpus 8, the study has 16" in clash.json()["error"]
    wide = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "real", "allow_cross_node_tp": True},
                       headers=read)
    assert wide.status_code == 400 and "got allow_cross_node_tp true, the study has false" in wide.json()["error"]
    missing = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "nope"}, headers=read)
    assert missing.status_code == 400 and "no study named 'nope'" in missing.json()["error"]


def test_estimate_server_answers_at_the_global_batch_the_studys_trials_ran_at(client: TestClient,
                                                                              tokens: dict[str, str],
                                                                              service_store: Store) -> None:
    # as `estimate --cluster-from`: the study's batch for the model it tuned, unless global_batch is sent
    cluster, spec = ClusterSpec(gpus=16, gpu_type="v100-32gb"), resolve_model("bert")
    service_store.create_study("b", model=spec.to_dict(), cluster=cluster.to_dict(), space_name="bert",
                               space_version="1", objective="samples_per_s", backend="sim",
                               model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
    config = ScheduleConfig(tp=2, dp=8, micro_batch=4, grad_accum=2).to_dict()  # a global batch of 64
    service_store.add_trial("b", 0, config, {"status": "complete", "samples_per_s": 100.0, "measured": False})
    read = bearer(tokens["read"])
    doc = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "b"}, headers=read).json()
    c = doc["config"]
    assert (doc["global_batch"], doc["global_batch_from"]) == (64, "study")
    assert c["micro_batch"] * c["grad_accum"] * c["dp"] == 64
    given = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "b", "global_batch": 128},
                        headers=read).json()
    assert (given["global_batch"], given["global_batch_from"]) == (128, None)
    other = client.post("/v1/estimate", json={"model": "bert-tiny", "cluster_from": "b"}, headers=read).json()
    assert other["global_batch_from"] is None  # another model's study: its batch is not this model's
    split = client.post("/v1/estimate", json={"model": "bert", "cluster_from": "b", "knobs": {"micro_batch": 3}},
                        headers=read)
    assert split.status_code == 400
    assert "global batch 64 is b's, which its trials ran at; a 'global_batch' field overrides it" in split.json()["error"]


@pytest.mark.parametrize(("body", "words"), [
    ({"model": "bert", "gpus": 8, "knobs": {"tpp": 2}}, "unknown knob 'tpp'"),
    ({"model": "bert", "gpus": 8, "knobs": {"tp": 0}}, "tp must be a positive integer: got 0 in field 'knobs'"),
    ({"model": "bert", "gpus": 8, "knobs": {"loss_kernel": "fast"}}, "loss_kernel must be one of"),
    ({"model": "bert", "gpus": 8, "knobs": {"tp": 3}}, "tp must divide"),
    ({"model": "bert", "gpus": 8, "knobs": {"grad_accum": 2}, "global_batch": 64}, "both fix the batch"),
    ({"model": "bert", "gpus": 8, "knobs": [1]}, "field 'knobs' must be dict"),
    ({"model": "bert", "gpus": 8, "shape": {"hidden": "big"}}, "shape.hidden must be a positive integer"),
    ({"model": "bert", "gpus": 8, "shape": {"width": 64}}, "unknown model override"),
    ({"model": "bert", "gpus": 8, "allow_cross_node_tp": 1}, "field 'allow_cross_node_tp' must be true/false"),
    ({"model": "bert"}, "field 'gpus' is required (or 'cluster_from'"),
    ({"model": "bert", "gpus": 8, "top": 500}, "top must be a whole number of schedules from 1 to 100"),
])
def test_a_bad_pin_or_shape_is_one_line(client: TestClient, tokens: dict[str, str], body: dict, words: str) -> None:
    r = client.post("/v1/estimate", json=body, headers=bearer(tokens["read"]))
    assert r.status_code == 400, r.text
    assert words in r.json()["error"] and "\n" not in r.json()["error"]


def test_estimate_server_refuses_what_it_cannot_send(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from autoslapo.cli import main

    assert main(["estimate", "bert", "--gpus", "8", "--storage", "sqlite:///x.db", "--server", "http://h.test"]) == 2
    assert "--storage cannot be sent" in capsys.readouterr().err
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    assert main(["estimate", str(module), "--gpus", "8", "--hidden", "64", "--server", "http://h.test"]) == 2
    assert "shape flags do not apply to a model file" in capsys.readouterr().err


@pytest.mark.slow
def test_top_lists_the_fastest_schedules_by_get_and_post(client: TestClient, tokens: dict[str, str]) -> None:
    read = bearer(tokens["read"])
    got = client.get("/v1/estimate", params={"model": "bert", "gpus": 8, "top": 4}, headers=read)
    posted = client.post("/v1/estimate", json={"model": "bert", "gpus": 8, "top": 4}, headers=read)
    assert got.status_code == posted.status_code == 200, posted.text
    assert got.json() == posted.json()
    top = posted.json()["top"]
    assert [r["rank"] for r in top] == [1, 2, 3, 4] and top[0]["config"] == posted.json()["config"]
    assert top[0]["samples_per_s"] >= top[-1]["samples_per_s"] and top[0]["schedule"].startswith("tp=")


def test_a_described_network_is_estimated_as_the_cli_does(client: TestClient, tokens: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "gpt2-xl", "--gpus", "64", "--inter-node-gbps", "6.25", "--intra-node-gbps", "150", "--json"]
    local, remote = _here_and_remote(argv, client, tokens["read"], monkeypatch, capsys)
    assert remote == local and remote["cluster"]["inter_node_gbps"] == 6.25
    got = client.get("/v1/estimate", params={"model": "gpt2-xl", "gpus": 64, "inter_node_gbps": 6.25,
                                              "intra_node_gbps": 150}, headers=bearer(tokens["read"]))
    assert got.status_code == 200 and got.json()["samples_per_s"] == local["samples_per_s"]
    bad_get = client.get("/v1/estimate", params={"model": "bert", "gpus": 8, "inter_node_gbps": 0},
                         headers=bearer(tokens["read"]))
    assert bad_get.status_code == 400 and "inter_node_gbps is GB/s a device" in bad_get.json()["error"]
    bad = client.post("/v1/estimate", json={"model": "bert", "gpus": 8, "inter_node_gbps": -1},
                      headers=bearer(tokens["read"]))
    assert bad.status_code == 400 and "inter_node_gbps is GB/s a device" in bad.json()["error"]
    request = StudyRequest.from_json({"model": "bert", "gpus": 64, "inter_node_gbps": 6.25})
    assert request.cluster_spec().inter_node_gbps == 6.25
    assert request.cluster_spec().fingerprint() != StudyRequest.from_json({"model": "bert", "gpus": 64}).cluster_spec().fingerprint()
    with pytest.raises(Exception, match="inter_node_gbps is GB/s a device"):
        StudyRequest.from_json({"model": "bert", "gpus": 64, "inter_node_gbps": 0})


@pytest.mark.slow
def test_remote_tune_sends_the_described_network(client: TestClient, tokens: dict[str, str], worker: object,
                                                 service_store: Store, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from autoslapo.cli import main

    _routed_to(client, monkeypatch)
    monkeypatch.setenv("AUTOSLAPO_TOKEN", tokens["submit"])
    assert main(["tune", "bert", "--gpus", "64", "--trials", "3", "--sampler", "tpe", "--no-baselines",
                 "--inter-node-gbps", "6.25", "--study", "net", "--server", "http://autoslapo.test"]) == 0, \
        capsys.readouterr().err
    job = service_store.jobs.get("net")
    assert job is not None and job.request["inter_node_gbps"] == 6.25
    assert service_store.get_study("net").cluster["inter_node_gbps"] == 6.25


@pytest.mark.slow
def test_best_over_http_keeps_to_a_described_network(client: TestClient, tokens: dict[str, str],
                                                     service_store: Store, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from autoslapo.cli import main

    for name, links in (("dgx", {}), ("slow", {"inter_node_gbps": 6.25})):
        request = StudyRequest.from_json({"model": "gpt2-xl", "gpus": 64, "trials": 3, "baselines": False, **links})
        tune(request.to_options(name=name), service_store)
    read = bearer(tokens["read"])
    query = {"model": "gpt2-xl", "gpus": 64}
    assert client.get("/v1/best", params=query, headers=read).json()["study"] == "dgx"
    slow = client.get("/v1/best", params={**query, "inter_node_gbps": 6.25}, headers=read).json()
    assert slow["study"] == "slow" and slow["apply_best"] == (
        'job = autoslapo.apply_best("gpt2-xl", gpus=64, gpu_type="a100-80gb", links={"inter_node_gbps": 6.25}, '
        'server="http://testserver")')
    view = client.get("/v1/studies/slow", headers=read).json()
    assert view["links"] == {"inter_node_gbps": 6.25} and view["apply_best"] == slow["apply_best"]
    assert client.get("/v1/studies/dgx", headers=read).json()["links"] == {}
    assert "gpt2-xl on 64x a100-80gb (inter-node 6.25 GB/s), backend" in client.get("/studies/slow", headers=read).text
    none = client.get("/v1/best", params={**query, "inter_node_gbps": 12.5}, headers=read)
    assert none.status_code == 404 and "with inter_node_gbps 12.5" in none.json()["error"]
    bad = client.get("/v1/best", params={**query, "intra_node_gbps": -3}, headers=read)
    assert bad.status_code == 400 and "intra_node_gbps is GB/s a device" in bad.json()["error"]
    _routed_to(client, monkeypatch)
    monkeypatch.setenv("AUTOSLAPO_TOKEN", tokens["read"])
    assert main(["best", "gpt2-xl", "--gpus", "64", "--inter-node-gbps", "6.25", "--json",
                 "--server", "http://autoslapo.test"]) == 0
    assert json.loads(capsys.readouterr().out)["study"] == "slow"
