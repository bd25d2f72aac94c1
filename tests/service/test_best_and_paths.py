"""``GET /v1/best`` and ``autoslapo best`` refuse a cluster that is not whole nodes up front (as
``tune`` does); a config.json asked for by its signature is named as what the user gave; a study name
in a URL path that breaks the name rule is bad input (400), not a missing study; both name the global batch of
their answer and keep to one when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoslapo.cli import main
from autoslapo.remote import model_query
from store import Store
from tests.service.conftest import bearer

CONFIG = str(Path(__file__).parents[1] / "autoslapo" / "data" / "hf" / "mistral-tiny.json")
NODES = "gpus must fill whole nodes: got gpus=4 with gpus_per_node=3 (1.33 nodes); use a multiple of 3 or change "


@pytest.fixture
def served(client: TestClient, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``--server http://testserver`` answered by ``client`` (the app in this process)."""
    import httpx

    def request(method: str, url: str, *, headers: dict[str, str], timeout: float, **kwargs: Any) -> httpx.Response:
        return client.request(method, url, headers={"Authorization": f"Bearer {tokens['read']}"}, **kwargs)

    monkeypatch.setattr(httpx, "request", request)
    return "http://testserver"


def test_best_refuses_a_cluster_of_partial_nodes_up_front(client: TestClient, tokens: dict[str, str], served: str,
                                                         capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    r = client.get("/v1/best", params={"model": "bert-tiny", "gpus": 4, "gpus_per_node": 3},
                   headers=bearer(tokens["read"]))
    assert r.status_code == 400 and r.json()["error"] == NODES + "gpus_per_node", r.text
    for where in (["--storage", f"sqlite:///{tmp_path}/none.db"], ["--server", served]):
        assert main(["best", "bert-tiny", "--gpus", "4", "--gpus-per-node", "3", *where]) == 2
        err = capsys.readouterr().err
        assert "--gpus must fill whole nodes: got --gpus 4 with --gpus-per-node 3 (1.33 nodes)" in err, err
        assert "autoslapo tune" not in err and not (tmp_path / "none.db").exists(), err
    whole = client.get("/v1/best", params={"model": "bert-tiny", "gpus": 6, "gpus_per_node": 3},
                       headers=bearer(tokens["read"]))
    assert whole.status_code == 404, whole.text  # whole nodes: only nothing recorded


@pytest.mark.parametrize("path", ["/v1/studies/a%20b", "/v1/studies/-x", "/v1/studies/-x/trials",
                                  "/v1/studies/-x/report", "/v1/studies/-x/events"])
def test_a_bad_name_in_a_path_is_a_400_naming_the_rule(client: TestClient, tokens: dict[str, str], path: str) -> None:
    r = client.get(path, headers=bearer(tokens["read"]))
    assert r.status_code == 400 and r.json()["error"].startswith("study names are 1-100 of A-Z a-z 0-9 . _ -"), r.text
    cancel = client.post("/v1/studies/-x/cancel", headers=bearer(tokens["submit"]))
    assert cancel.status_code == 400, cancel.text
    assert client.get("/v1/studies/nosuch", headers=bearer(tokens["read"])).status_code == 404  # a good name: 404


def test_best_of_a_config_names_the_config_not_its_signature(client: TestClient, tokens: dict[str, str], served: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    signature = model_query(CONFIG)
    r = client.get("/v1/best", params={"model": signature, "gpus": 4}, headers=bearer(tokens["read"]))
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert f"the model of signature '{signature}' (a config.json or model file" in error, error
    assert "POST /v1/studies" in error and "`autoslapo tune CONFIG.json --gpus N --server http://testserver`" in error
    assert main(["best", CONFIG, "--gpus", "4", "--server", served]) == 2
    err = capsys.readouterr().err
    assert signature not in err, err
    assert f"no recorded schedule for mistral ({CONFIG}) on 4 devices" in err, err
    assert f"`autoslapo tune {CONFIG} --gpus 4 --server http://testserver`" in err and "POST /v1/studies" in err, err


def test_best_names_its_global_batch_and_keeps_to_one(client: TestClient, tokens: dict[str, str], served: str,
                                                      service_store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    """``GET /v1/best`` did not say the global batch its trial ran at, nor take one (nor did ``best --server``)."""
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.resolve import resolve_model

    cluster = ClusterSpec(gpus=4, gpu_type="a100-80gb")
    for name, model, micro_batch, speed in (("at16", "bert-tiny", 4, 100.0), ("at64", "bert-tiny", 16, 300.0),
                                            ("config", CONFIG, 4, 50.0)):  # one study a global batch
        spec = resolve_model(model)
        service_store.create_study(name, model=spec.to_dict(), cluster=cluster.to_dict(), space_name=spec.family,
                                   space_version="1", objective="samples_per_s", backend="sim",
                                   model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
        for i in range(2):
            config = ScheduleConfig(dp=4, micro_batch=micro_batch, ckpt_ratio=0.5 * i).to_dict()
            service_store.add_trial(name, i, config, {"status": "complete", "samples_per_s": speed - i})
    read = bearer(tokens["read"])
    query = {"model": "bert-tiny", "gpus": 4}
    top = client.get("/v1/best", params=query, headers=read).json()
    assert (top["study"], top["global_batch"]) == ("at64", 64) and "global_batch=" not in top["apply_best"], top
    r = client.get("/v1/best", params={**query, "global_batch": 16}, headers=read)
    assert r.status_code == 200 and (r.json()["study"], r.json()["trial"], r.json()["global_batch"]) == ("at16", 0, 16)
    assert 'global_batch=16, server="http://testserver")' in r.json()["apply_best"], r.json()
    for bad in (0, -1, 2**63):
        r = client.get("/v1/best", params={**query, "global_batch": bad}, headers=read)
        assert r.status_code == 400 and r.json()["error"].startswith("global_batch must be "), r.text
    r = client.get("/v1/best", params={**query, "global_batch": 48}, headers=read)
    assert r.status_code == 404, r.text
    assert r.json()["error"] == (
        "no study on this server has a recorded schedule for bert-tiny on 4 x any device at global batch 48 (its "
        "trials ran at global batch 16 and 64: pass one of those as global_batch); submit one: POST /v1/studies "
        "with this model and cluster, or `autoslapo tune bert-tiny --gpus 4 --global-batch 48 --server "
        "http://testserver`"), r.text
    # best --server sends it and prints the batch as the local answer does
    assert main(["best", "bert-tiny", "--gpus", "4", "--server", served, "--global-batch", "16"]) == 0
    assert "samples/s (estimated at global batch 16, study at16 trial 0)" in capsys.readouterr().out
    assert main(["best", "bert-tiny", "--gpus", "4", "--server", served, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch"] == 64
    assert main(["best", "bert-tiny", "--gpus", "4", "--server", served, "--global-batch", "48"]) == 2
    assert "(its trials ran at global batch 16 and 64: pass one of those" in capsys.readouterr().err
    assert main(["best", CONFIG, "--gpus", "4", "--server", served, "--global-batch", "48"]) == 2  # named as given
    err = capsys.readouterr().err
    assert (f"schedule for mistral ({CONFIG}) on 4 x any device at global batch 48 (its trials ran at global batch "
            "16: pass that one as global_batch)") in err, err
    assert f"`autoslapo tune {CONFIG} --gpus 4 --global-batch 48 --server http://testserver`" in err, err
    assert main(["best", "bert-tiny", "--gpus", "4", "--server", served, "--global-batch", "0"]) == 2
    assert "--global-batch must be a positive integer: got 0" in capsys.readouterr().err
