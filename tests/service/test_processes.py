"""The service as processes on a free loopback port: remote clients, and kill -9 of a worker and the server.

The kill test is the issue's: a 300-trial study survives ``kill -9`` of the server (restarted)
and of its worker, twice, and ends with exactly 300 distinct launched trials, on SQLite and on
PostgreSQL (slow: a few minutes on 2 cores).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autoslapo.api import best_trial
from autoslapo.service import create_token
from store import open_store
from tests.pgfixtures import BACKENDS, database_url

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Processes:
    """The server and workers of one test, on one store (an SQLite file unless ``url`` says otherwise);
    everything started is killed at the end."""

    def __init__(self, tmp: Path, url: str | None = None) -> None:
        self.url = url or f"sqlite:///{tmp / 'svc.db'}"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOSLAPO_STORAGE": self.url}
        self.started: list[subprocess.Popen[bytes]] = []
        with open_store(self.url) as store:
            self.submit = create_token(store, "submitter", "submit")
            self.read = create_token(store, "reader", "read")

    def cli(self, *args: str, token: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **({"AUTOSLAPO_TOKEN": token} if token else {})}
        return subprocess.run([sys.executable, "-m", "autoslapo", *args], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-m", "autoslapo", *args], env=self.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.started.append(p)
        return p

    def serve(self, *flags: str) -> subprocess.Popen[bytes]:
        p = self.spawn("serve", "--port", str(self.port), *flags)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return p
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("the server did not answer /healthz within 60 s")

    def worker(self) -> subprocess.Popen[bytes]:
        return self.spawn("worker", "--lease", "2", "--poll", "0.2")

    def study(self, name: str) -> dict:
        r = httpx.get(f"{self.base}/v1/studies/{name}", headers={"Authorization": f"Bearer {self.read}"}, timeout=10)
        return r.json()

    def close(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    yield p
    p.close()


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_remote_tune_and_best_against_a_running_server(procs: Processes, tmp_path: Path) -> None:
    procs.serve()
    procs.worker()
    space = tmp_path / "mine.toml"  # sent as data with the knob flag pinned into it
    space.write_text('name = "mine"\n[knobs]\ntp = [1, 2, 4]\npp = [1, 2]\nmicro_batch = "auto"\n'
                     '[fixed]\nattn_kernel = "flash"\n')
    done = procs.cli("tune", "bert", "--gpus", "8", "--trials", "10", "--no-baselines", "--study", "remote", "--sampler", "tpe",
                     "--space", str(space), "--zero-stage", "1", "--server", procs.base, token=procs.submit)
    assert done.returncode == 0, done.stderr
    assert "study remote: 10 trials launched, status complete" in done.stdout
    with open_store(procs.url) as store:
        assert store.get_study("remote").space_name == "mine+pinned"
        configs = [t.config for t in store.trials("remote")]
    assert configs and all(c["attn_kernel"] == "flash" for c in configs)
    assert all(c["zero_stage"] == (1 if c["dp"] > 1 else 0) for c in configs)  # ZeRO is inert without dp
    assert all(c["tp"] in (1, 2, 4) and c["pp"] in (1, 2) for c in configs)
    more = procs.cli("tune", "bert", "--gpus", "8", "--trials", "13", "--no-baselines", "--study", "remote",
                     "--sampler", "tpe", "--resume", "--server", procs.base, token=procs.submit)
    assert more.returncode == 0, more.stderr
    assert "study remote: 13 trials launched, status complete" in more.stdout
    with open_store(procs.url) as store:
        assert all(t.config["attn_kernel"] == "flash" for t in store.trials("remote"))  # the space it began with
    joined = procs.cli("tune", "bert", "--gpus", "8", "--trials", "13", "--no-baselines", "--study", "remote",
                       "--sampler", "tpe", "--join", "--server", procs.base, token=procs.read)
    assert joined.returncode == 2 and "refused" in joined.stderr  # joining submits: a read token may not
    joined = procs.cli("tune", "bert", "--gpus", "8", "--trials", "13", "--no-baselines", "--study", "remote",
                       "--sampler", "tpe", "--join", "--server", procs.base, token=procs.submit)
    assert joined.returncode == 0, joined.stderr  # at its budget already: followed, nothing run
    assert "study remote: 13 trials launched, status complete" in joined.stdout
    best = procs.cli("best", "bert", "--gpus", "8", "--server", procs.base, token=procs.read)
    assert best.returncode == 0, best.stderr
    assert "study remote" in best.stdout
    code = f"import autoslapo; c = autoslapo.best('bert', gpus=8, server={procs.base!r}); print(c.tp * c.pp * c.dp)"
    lib = subprocess.run([sys.executable, "-c", code], env={**procs.env, "AUTOSLAPO_TOKEN": procs.read},
                         capture_output=True, text=True, timeout=120, check=False)
    assert lib.returncode == 0 and lib.stdout.strip() == "8", lib.stderr
    # apply_best(server=) asks the server (the script has no store: a missing one would say "no store at"),
    # then applies as from a store: outside a launched job that is the launched-job error.
    code = ("import autoslapo\nimport autoslapo.errors\nfrom autoslapo.api import _remote_best_trial\n"
            f"t = _remote_best_trial('bert', gpus=8, gpu_type=None, metric='samples_per_s', measured_only=False, "
            f"server={procs.base!r})\nprint(t.study, t.number, t.config_hash)\n"
            f"try:\n    autoslapo.apply_best('bert', gpus=8, server={procs.base!r})\n"
            "except autoslapo.errors.UsageError as err:\n    print(err)\n")
    nowhere = f"sqlite:///{procs.url.removeprefix('sqlite:///')}.missing"
    lib = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env={**procs.env, "AUTOSLAPO_TOKEN": procs.read, "AUTOSLAPO_STORAGE": nowhere})
    assert lib.returncode == 0, lib.stderr
    first, second = lib.stdout.strip().splitlines()
    with open_store(procs.url) as store:
        stored = best_trial("bert", gpus=8, storage=store)
    assert first == f"remote {stored.number} {stored.config_hash}"
    assert "inside a launched job of 8 ranks" in second
    refused = procs.cli("best", "bert", "--gpus", "8", "--server", procs.base, token="aslp_x_y")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "refused" in refused.stderr and "aslp_x_y" not in refused.stderr


def test_a_server_that_is_down_is_one_line_and_exit_2(procs: Processes) -> None:
    down = procs.cli("best", "bert", "--gpus", "8", "--server", procs.base, token=procs.read)
    assert down.returncode == 2
    assert len(down.stderr.strip().splitlines()) == 1 and "cannot reach" in down.stderr


def children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads children from Linux's /proc")
@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_kill_9_of_the_server_takes_its_workers_down(procs: Processes) -> None:
    server = procs.serve("--workers", "1")
    r = httpx.post(f"{procs.base}/v1/studies", headers={"Authorization": f"Bearer {procs.submit}"}, timeout=10,
                   json={"model": "bert", "gpus": 8, "trials": 5000, "backend": "sim", "name": "long",
                         "baselines": False, "sampler": "tpe"})
    assert r.status_code == 202, r.text
    wait_launched(procs, "long", 3)  # its worker runs the study
    (worker,) = children(server.pid)
    kill_9(server)
    end = time.monotonic() + 30
    while alive(worker) and time.monotonic() < end:
        time.sleep(0.1)
    if alive(worker):
        os.kill(worker, signal.SIGKILL)  # leave no orphan behind a failed test
        raise AssertionError("the server's worker outlived it: an orphan would keep the job's lease")
    with open_store(procs.url) as store:
        job = store.jobs.get("long")
    assert job is not None and job.status == "running"  # until the lease lapses and a worker resumes it


def wait_launched(procs: Processes, name: str, at_least: int, timeout_s: float = 300) -> int:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        doc = procs.study(name)
        if doc["launched"] >= at_least or doc["status"] not in ("queued", "running"):
            return int(doc["launched"])
        time.sleep(0.1)
    raise AssertionError(f"{name} did not reach {at_least} launched trials in {timeout_s} s")


def kill_9(p: subprocess.Popen[bytes]) -> None:
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_url(request.param, tmp_path, request)


@pytest.mark.slow
@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_kill_9_of_worker_and_server_loses_nothing(store_url: str, tmp_path: Path) -> None:
    budget = 300
    procs = Processes(tmp_path, store_url)
    try:
        server = procs.serve()
        first = procs.worker()
        r = httpx.post(f"{procs.base}/v1/studies", headers={"Authorization": f"Bearer {procs.submit}"}, timeout=10,
                       json={"model": "bert", "gpus": 8, "trials": budget, "backend": "sim", "name": "survivor",
                             "baselines": False, "sampler": "tpe"})
        assert r.status_code == 202, r.text
        # 1. kill -9 of the server and of its worker mid-study; the server restarts.
        assert wait_launched(procs, "survivor", 60) < budget
        kill_9(first)
        kill_9(server)
        procs.serve()
        assert procs.study("survivor")["status"] == "running"  # nobody finished it
        # 2. a new worker takes the job over once the lease lapses, and is itself killed mid-study.
        second = procs.worker()
        assert wait_launched(procs, "survivor", 180) < budget
        kill_9(second)
        # 3. a third worker finishes the budget.
        procs.worker()
        end = time.monotonic() + 600
        while procs.study("survivor")["status"] == "running" and time.monotonic() < end:
            time.sleep(0.5)
        doc = procs.study("survivor")
        assert doc["status"] == "complete", doc
        assert doc["launched"] == budget
        with open_store(procs.url) as store:
            trials = store.trials("survivor")
            job = store.jobs.get("survivor")
        launched = [t for t in trials if t.status != "pruned"]
        assert len(launched) == budget
        assert len({t.config_hash for t in launched}) == budget  # no configuration run twice
        assert len({t.number for t in trials}) == len(trials)  # no trial number written twice
        assert not [t for t in trials if t.status == "running"]
        assert job is not None and (job.status, job.attempts) == ("complete", 3)
    finally:
        procs.close()


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_remote_tune_and_best_of_a_config_json(procs: Processes) -> None:
    """`tune CONFIG.json --server` sends the config as data; `best CONFIG.json --server` and
    `autoslapo.best(CONFIG.json, server=)` find its study by the spec's signature."""
    config = str(Path(__file__).parents[1] / "autoslapo" / "data" / "hf" / "mistral-tiny.json")
    procs.serve()
    procs.worker()
    done = procs.cli("tune", config, "--gpus", "8", "--trials", "4", "--no-baselines", "--study", "cfg",
                     "--sampler", "tpe", "--server", procs.base, token=procs.submit)
    assert done.returncode == 0, done.stderr
    assert "study cfg: 4 trials launched, status complete (mistral on 8x" in done.stdout
    best = procs.cli("best", config, "--gpus", "8", "--server", procs.base, token=procs.read)
    assert best.returncode == 0, best.stderr
    assert "study cfg" in best.stdout
    code = f"import autoslapo; c = autoslapo.best({config!r}, gpus=8, server={procs.base!r}); print(c.tp * c.pp * c.dp)"
    lib = subprocess.run([sys.executable, "-c", code], env={**procs.env, "AUTOSLAPO_TOKEN": procs.read},
                         capture_output=True, text=True, timeout=120, check=False)
    assert lib.returncode == 0 and lib.stdout.strip() == "8", lib.stderr
