"""``serve --workers N`` keeps its workers running: a worker that dies is started again, with a
back-off, a bounded number of times in a row, each death logged with its exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from autoslapo.service.supervise import Supervisor, exit_text
from tests.service.test_processes import Processes, children, procs  # noqa: F401  (a fixture)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def wait_for(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.05)


def test_a_killed_process_is_started_again_and_logged() -> None:
    said: list[str] = []
    sup = Supervisor(2, lambda: subprocess.Popen(SLEEPER), log=said.append, check_s=0.05, first_backoff_s=0.1)
    sup.start()
    try:
        first, second = sup.processes
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: len(sup.processes) == 2 and first not in sup.processes)
        assert said[0] == (f"worker 1 (pid {first.pid}) died with exit code -9 (SIGKILL); restarting it in 0.1 s "
                           "(restart 1 in a row of at most 10)")
        (again,) = [p for p in sup.processes if p is not second]
        assert said[1] == f"worker 1 restarted as pid {again.pid}" and again.poll() is None and second.poll() is None
        os.kill(second.pid, signal.SIGTERM)  # `kill PID`: stopped when asked, not a death
        wait_for(lambda: sup.processes == [again])
        time.sleep(0.3)
        assert said[2:] == [f"worker 2 (pid {second.pid}) stopped when asked (exit code -15 (SIGTERM)): not "
                            "restarted; restart the server for it"] and sup.processes == [again]
    finally:
        sup.stop()
    assert all(p.poll() is not None for p in (first, second, again))
    assert len(said) == 3  # stopping ends the processes without a restart


def test_a_process_that_keeps_dying_backs_off_then_is_given_up() -> None:
    said: list[str] = []
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    sup = Supervisor(1, lambda: subprocess.Popen(failing), log=said.append, check_s=0.02, first_backoff_s=0.02,
                     max_quick_deaths=3)
    sup.start()
    try:
        wait_for(lambda: any("not restarted again" in line for line in said))
        time.sleep(0.3)
    finally:
        sup.stop()
    deaths = [line for line in said if "died with exit code 3" in line]
    assert len(deaths) == 4 and len([line for line in said if "restarted as pid" in line]) == 3
    assert [line.split("; restarting it in ")[1].split(" s")[0] for line in deaths[:3]] == ["0.02", "0.04", "0.08"]
    assert deaths[3].endswith("its 4th death within 60 s of its start in a row: not restarted again; see its error "
                              "above, fix it and restart the server")
    assert sup.processes == []


def test_a_restarted_worker_gets_its_graceful_stop_and_a_failed_start_is_retried(tmp_path: Path) -> None:
    """serve's workers die with their parent's forking thread (PR_SET_PDEATHSIG is per thread): those the
    watching thread restarted got SIGKILL, not SIGTERM, when it ended before stop() terminated them;
    and a start that raised (fork's EAGAIN) ended the thread, so nothing was restarted again."""
    from autoslapo.cli.serve import _die_with, _prctl

    parent, prctl = os.getpid(), _prctl()
    trap = ("import signal, sys, time\n"
            "def bye(*_): open(sys.argv[1], 'w').write('term'); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, bye)\ntime.sleep(120)\n")
    calls = {"n": 0}

    def start() -> subprocess.Popen[bytes]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(11, "Resource temporarily unavailable")
        return subprocess.Popen([sys.executable, "-c", trap, str(tmp_path / f"w{calls['n']}")],
                                preexec_fn=lambda: _die_with(parent, prctl))

    said: list[str] = []
    sup = Supervisor(1, start, log=said.append, check_s=0.05, first_backoff_s=0.1)
    sup.start()
    try:
        (first,) = sup.processes
        time.sleep(0.5)  # its trap is set
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: calls["n"] >= 3 and len(sup.processes) == 1)
        assert any("could not be started again (BlockingIOError: [Errno 11] Resource temporarily unavailable); "
                   "restarting it in" in line for line in said), said
        (again,) = sup.processes
        time.sleep(0.5)
    finally:
        sup.stop()
    assert again.returncode == 0 and (tmp_path / "w3").read_text() == "term"  # SIGTERM, trapped: not -9


def test_exit_text() -> None:
    assert (exit_text(3), exit_text(-15), exit_text(-200)) == ("exit code 3", "exit code -15 (SIGTERM)",
                                                               "exit code -200")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads children from Linux's /proc")
@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_serve_restarts_a_worker_that_died(procs: Processes, tmp_path: Path) -> None:  # noqa: F811
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "autoslapo", "serve", "--port", str(procs.port), "--workers",
                               "1"], env=procs.env, stdout=subprocess.DEVNULL, stderr=log)
    procs.started.append(server)
    wait_for(lambda: _answers(procs.base), 60)
    wait_for(lambda: len(children(server.pid)) == 1, 60)
    (worker,) = children(server.pid)
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: len(children(server.pid)) == 1 and children(server.pid) != {worker}, 30)
    text = (tmp_path / "serve.log").read_text()
    assert f"autoslapo serve: worker 1 (pid {worker}) died with exit code -9 (SIGKILL); restarting it in 1 s" in text
    r = httpx.post(f"{procs.base}/v1/studies", headers={"Authorization": f"Bearer {procs.submit}"}, timeout=10,
                   json={"model": "bert", "gpus": 8, "trials": 3, "backend": "sim", "name": "after",
                         "baselines": False, "sampler": "tpe"})
    assert r.status_code == 202, r.text
    wait_for(lambda: procs.study("after")["status"] == "complete", 120)  # the new worker ran it


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
