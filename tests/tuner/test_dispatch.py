"""Ray Tune dispatch: trials run as Ray trials, placed across the nodes of a multi-node cluster."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from store import Store
from tuner import TuneOptions, tune

BASE = ModelSpec.from_name("bert-base")
V100_16 = ClusterSpec(gpus=16, gpu_type="v100-32gb")


@pytest.mark.ray
@pytest.mark.slow
def test_sim_trials_through_local_ray(store: Store) -> None:
    out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=4, dispatch="ray", max_concurrent=2,
                           baselines=False, study="ray"), store)
    rows = [t for t in store.trials("ray") if t.status != "pruned"]
    assert out.launched == len(rows) == 4 and len({t.config_hash for t in rows}) == 4
    assert all(t.status == "complete" and t.result["extra"]["ray_node_id"] for t in rows)
    # the local Ray this study started is stopped again
    import ray

    assert not ray.is_initialized()


@pytest.mark.ray
@pytest.mark.slow
def test_ctrl_c_stops_a_ray_study_as_it_stops_an_inline_one(tmp_path: Path) -> None:
    """Ray Tune caught the SIGINT and ended fit() quietly: exit 0, the study "complete", its trial
    in flight left running. A terminal's Ctrl-C: SIGINT to the tuner's process group mid-trial."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    from autoslapo.runtime.launcher import TRIAL_DIR_PREFIX
    from store import open_store

    def trial_dirs() -> set[str]:
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(TRIAL_DIR_PREFIX)}

    before = trial_dirs()
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = subprocess.Popen([sys.executable, "-m", "autoslapo", "tune", "gpt2-tiny", "--gpus", "2", "--backend", "ray",
                             "--trials", "3", "--steps", "2", "--no-baselines", "--repeats", "0", "--study", "ri",
                             "--storage", url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "AUTOSLAPO_MODEL_CACHE": str(tmp_path)})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (tmp_path / "s.db").exists():
                with open_store(url) as db:
                    if db.has_study("ri") and any(t.status == "running" for t in db.trials("ri")):
                        break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    with open_store(url) as db:
        assert db.get_study("ri").status == "stopped"
        statuses = [t.status for t in db.trials("ri")]
    assert "running" not in statuses and "failed" in statuses, statuses
    # the trial's scratch folder, which its killed actor never removed, is swept at the study's end
    left = [n for n in trial_dirs() - before
            if not Path(f"/proc/{n[len(TRIAL_DIR_PREFIX):].split('-', 1)[0]}").exists()]
    assert left == [], left


@pytest.mark.ray
@pytest.mark.slow
def test_trials_are_placed_across_the_nodes_of_a_ray_cluster(store: Store) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        out = tune(TuneOptions(model=BASE, cluster=V100_16, trials=6, dispatch="ray", max_concurrent=2,
                               ray_address=cluster.address, baselines=False, study="multi"), store)
        rows = [t for t in store.trials("multi") if t.status != "pruned"]
        assert out.launched == len(rows) == 6
        nodes = {t.result["extra"]["ray_node_id"] for t in rows}
        assert len(nodes) == 2, nodes  # one CPU a node, two at once: both nodes ran trials
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()



def test_joining_an_address_where_nothing_listens_is_one_line_of_bad_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from autoslapo.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    db = tmp_path / "never.db"
    code = main(["tune", "bert-tiny", "--gpus", "4", "--dispatch", "ray", "--ray-address", f"127.0.0.1:{port}",
                 "--storage", f"sqlite:///{db}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "nothing answers there" in err[0], err
    assert not db.exists()  # refused before the store was opened


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_a_real_trial_needing_several_nodes_reserves_a_bundle_per_machine(store: Store) -> None:
    from tuner import StudyRunner
    from tuner.dispatch import ranks_per_node, trial_resources

    tiny = ModelSpec.from_name("bert-tiny")
    gpus = StudyRunner(TuneOptions(model=tiny, cluster=ClusterSpec(gpus=16, gpu_type="a100-80gb", gpus_per_node=8),
                                   backend="ray", trials=1, study="g"), store)
    assert ranks_per_node(gpus) == [8, 8]
    assert trial_resources(gpus).bundles == [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 8.0}, {"CPU": 1.0, "GPU": 8.0}]
    cpus = StudyRunner(TuneOptions(model=tiny, cluster=ClusterSpec(gpus=4, gpu_type="cpu", gpus_per_node=2),
                                   backend="ray", trials=1, study="c"), store)
    assert trial_resources(cpus).bundles == [{"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 2.0}]
    one = StudyRunner(TuneOptions(model=tiny, cluster=ClusterSpec(gpus=8, gpu_type="a100-80gb"), backend="ray",
                                  trials=1, study="o"), store)
    assert ranks_per_node(one) is None and trial_resources(one) == {"cpu": 1, "gpu": 8.0}
    sim = StudyRunner(TuneOptions(model=tiny, cluster=ClusterSpec(gpus=16, gpu_type="a100-80gb", gpus_per_node=8),
                                  backend="sim", trials=1, study="s"), store)
    assert ranks_per_node(sim) is None and trial_resources(sim) == {"cpu": 1}


def test_concurrent_cpu_trials_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPU trials at once each took every core's share (cores / ranks threads a rank): twice the
    cores there are, so they measured each other. The threads reach the launcher."""
    from autoslapo.config import ScheduleConfig
    from autoslapo.runtime import trial
    from tuner.dispatch import shared_threads

    assert shared_threads(2, 1, 16) == 8 and shared_threads(2, 2, 16) == 4 and shared_threads(2, 4, 2) == 1
    seen: dict[str, object] = {}

    def launch(*args: object, **kwargs: object) -> object:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(trial, "launch", launch)
    with pytest.raises(RuntimeError, match="stop here"):
        trial.run_trial(ModelSpec.from_name("bert-tiny"), ScheduleConfig(dp=2, micro_batch=2), device="cpu", threads=3)
    assert seen["threads"] == 3
