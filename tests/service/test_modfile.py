"""A user's model file sent as data: refused without the flag, traced in a child process, run by workers."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from autoslapo.errors import UsageError
from autoslapo.models.resolve import resolve_model
from autoslapo.remote import model_field, model_query
from autoslapo.service import ServiceSettings, Worker, create_app, modfile
from autoslapo.service.jobs import StudyRequest
from autoslapo.service.modfile import ModuleFile, ModuleFilesOff, forget, module_spec
from store import Store
from tests.modelfiles import net_source, write_model_file
from tests.service.conftest import bearer
from tests.service.test_app import wait_status
from tests.service.test_processes import Processes, alive
from tuner import tune

#: An isolation switched off: the control that shows its test can fail (slow: the CI run has it).
OFF = pytest.param("off", marks=pytest.mark.slow)
TINY = net_source(width=16, blocks=4, layers="blocks")
BASE = {"gpus": 8, "backend": "sim", "sampler": "tpe", "baselines": False}
BROKEN = [
    ("def build(:\n", "SyntaxError"),
    (TINY.replace("def batch(", "def not_batch("), "must define batch(micro_batch, seed)"),
    (TINY.replace("return Net()", "raise RuntimeError('no weights here')"), "RuntimeError: no weights here"),
]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    forget()
    yield tmp_path / "cache"
    forget()


def in_build(code: str) -> str:
    """TINY with ``code`` (lines after the first indented by 4) run in build() before it returns its module."""
    text = TINY.replace("return Net()", f"{code}\n    return Net()")
    assert text != TINY
    return text


def payload(text: str = TINY, name: str = "tiny.py") -> dict:
    return {"module_file": {"name": name, "source": text}}


@pytest.fixture
def open_client(service_store: Store) -> Iterator[TestClient]:
    settings = ServiceSettings(allow_module_files=True, module_timeout_s=120)
    with TestClient(create_app(service_store, settings)) as c:
        yield c


@pytest.fixture
def module_worker(service_store: Store) -> Iterator[Worker]:
    w = Worker(service_store, lease_s=5.0, poll_s=0.1, allow_module_files=True)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    yield w
    w.stop()
    thread.join(timeout=60)


def test_the_spec_is_the_one_tune_builds_and_the_file_is_never_imported_here(tmp_path: Path, cache: Path) -> None:
    # the file notes who imported it beside itself, in its cache entry: where a trace may write
    text = f"import os\nopen(os.path.join(os.path.dirname(__file__), 'imported-by'), 'a').write(str(os.getpid()) + '\\n')\n{TINY}"
    mf = ModuleFile("tiny.py", text)
    spec = module_spec(mf)
    (pid,) = (cache / mf.digest / "imported-by").read_text().split()
    assert pid != str(os.getpid())  # it ran in a child process, not in this one
    assert (cache / mf.digest / "tiny.py").read_bytes() == text.encode()  # materialized by digest
    assert spec == resolve_model(str(write_model_file(tmp_path, text, "tiny.py")))  # what `autoslapo tune tiny.py` builds
    assert module_spec(mf) is spec  # kept by digest: traced once per process


@pytest.mark.parametrize(("text", "words"), BROKEN)
def test_a_broken_file_is_one_line(text: str, words: str) -> None:
    with pytest.raises(UsageError, match=r"the model file tiny\.py cannot be used") as err:
        module_spec(ModuleFile("tiny.py", text))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_file_that_runs_too_long_is_stopped_and_one_line() -> None:
    started = time.monotonic()
    with pytest.raises(UsageError, match="did not finish its trace within 3 s"):
        module_spec(ModuleFile("slow.py", "import time\ntime.sleep(600)\n"), timeout_s=3)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("grab", "words"), [
    ("bytearray(1 << 30)", "needed more than 512 MiB to trace"),  # Python's own allocation
    pytest.param("__import__('torch').ones(1 << 28, device='cpu')", "needed more than 512 MiB to trace",
                 marks=pytest.mark.slow),  # torch's allocator, 1 GiB
    ("open('big.bin', 'wb').write(bytes(80 << 20))", "wrote a file over 64 MiB in its trace"),
])
def test_a_file_over_the_trace_limits_is_stopped_and_one_line(monkeypatch: pytest.MonkeyPatch, grab: str,
                                                              words: str) -> None:
    monkeypatch.setenv("AUTOSLAPO_TRACE_MEMORY_MIB", "512")
    text = in_build(grab)
    with pytest.raises(UsageError, match=r"the model file big\.py") as err:
        module_spec(ModuleFile("big.py", text))
    assert words in str(err.value) and "\n" not in str(err.value)
    module_spec(ModuleFile("tiny.py", TINY))  # the same limit leaves a real trace room (~220 MiB)


def test_a_file_that_starts_processes_is_held_to_the_limit_they_sum_to(monkeypatch: pytest.MonkeyPatch) -> None:
    # two started processes of 300 MiB and the trace's own ~220 MiB: each under the 512 MiB it may have, together over
    monkeypatch.setenv("AUTOSLAPO_TRACE_MEMORY_MIB", "512")
    grab = ("import subprocess, sys, time\n"
            "    kids = [subprocess.Popen([sys.executable, '-c', 'import time; b = b\\'x\\' * (300 << 20); time.sleep(60)'])"
            " for _ in range(2)]\n"
            "    time.sleep(60)")
    text = in_build(grab)
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"the model file many\.py needed more than 512 MiB to trace") as err:
        module_spec(ModuleFile("many.py", text))
    assert "its processes together" in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - started < 45  # stopped by the group's sum, not by the 120 s timeout


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("cgroup", ["on", OFF])
def test_forked_helpers_count_the_pages_they_share_once(monkeypatch: pytest.MonkeyPatch, cgroup: str) -> None:
    # three forks of the tracer (~220 MiB resident, torch imported) that allocate nothing: their resident
    # sizes sum to ~880 MiB, their proportional ones (and a cgroup's charge) to the tracer's alone
    monkeypatch.setenv("AUTOSLAPO_TRACE_MEMORY_MIB", "512")
    monkeypatch.setenv(modfile.CGROUP_ENV, cgroup)
    grab = ("import os, time\n"
            "    kids = []\n"
            "    for _ in range(3):\n"
            "        pid = os.fork()\n"
            "        if pid == 0:\n"
            "            time.sleep(1)\n"
            "            os._exit(0)\n"
            "        kids.append(pid)\n"
            "    for pid in kids:\n"
            "        os.waitpid(pid, 0)")
    text = in_build(grab)
    assert module_spec(ModuleFile(f"forks_{cgroup}.py", text)).family == "user"


def test_a_burst_between_two_polls_is_held_by_the_trace_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    # four processes of 150 MiB for 20 ms each, with the trace's own ~220 MiB: each under the 512 MiB it
    # may have, together over; the polls (every 50 ms) may miss them, the kernel does not
    from autoslapo import memcg
    from autoslapo.service.modfile import CGROUP_PREFIX

    probe = memcg.create(CGROUP_PREFIX, 1 << 30)
    if probe is None:
        pytest.skip("this machine lets no process here make a memory cgroup (needs root or a delegated cgroup v2 "
                    "memory controller): a burst shorter than the poll can pass the sum there")
    monkeypatch.setenv("AUTOSLAPO_TRACE_MEMORY_MIB", "512")
    grab = ("import os, time\n"
            "    kids = []\n"
            "    for _ in range(4):\n"
            "        pid = os.fork()\n"
            "        if pid == 0:\n"
            "            held = b'x' * (150 << 20)\n"
            "            time.sleep(0.02)\n"
            "            os._exit(0)\n"
            "        kids.append(pid)\n"
            "    for pid in kids:\n"
            "        os.waitpid(pid, 0)")
    text = in_build(grab)
    with pytest.raises(UsageError, match=r"the model file burst\.py needed more than 512 MiB to trace") as err:
        module_spec(ModuleFile("burst.py", text))
    assert "its processes together" in str(err.value) and "\n" not in str(err.value)
    module_spec(ModuleFile("tiny.py", TINY))  # the same limit leaves a real trace room
    assert probe.remove()
    left = [d.name for d in probe.path.parent.iterdir() if d.name.startswith(f"{CGROUP_PREFIX}{os.getpid()}-")]
    assert left == []  # each trace's group ends with it


@pytest.mark.parametrize("isolation", ["on", OFF])
def test_the_trace_has_no_network_where_it_may_leave_it(monkeypatch: pytest.MonkeyPatch, isolation: str) -> None:
    # build() connects to a listener on the host's loopback: from its own network namespace it cannot
    import socket

    monkeypatch.setenv(modfile.NETWORK_ENV, isolation)
    probe = subprocess.run([sys.executable, "-c", "from autoslapo.netns import leave_network; print(leave_network())"],
                           capture_output=True, text=True, timeout=60)
    if isolation == "on" and not probe.stdout.strip():
        pytest.skip("this machine lets no process here make a network namespace (needs root or unprivileged user "
                    "namespaces): the trace keeps the server's network there")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0)
        grab = (f"import socket\n"
                f"    try:\n"
                f"        socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=5).close()\n"
                f"    except OSError:\n"
                f"        pass")
        text = in_build(grab)
        assert module_spec(ModuleFile(f"net_{isolation}.py", text)).family == "user"
        try:
            listener.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
    assert reached == (isolation == "off")


@pytest.mark.parametrize("restricted", ["on", OFF])
def test_the_trace_writes_only_its_own_files_and_signals_no_one_outside(tmp_path: Path, restricted: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # build() writes a file beside the test's (the store's, say) and sends SIGTERM to a process of the
    # server's user: under Landlock neither happens, and the trace itself still works
    from autoslapo import landlock

    if restricted == "on" and landlock.abi() < 6:
        pytest.skip(f"needs Linux's Landlock, ABI 6 (Linux 6.12) for signals: this kernel has ABI {landlock.abi()}; "
                    "a trace there may write and signal what the server's user may")
    monkeypatch.setenv(modfile.LANDLOCK_ENV, restricted)
    target = tmp_path / "store.db"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        grab = (f"import os, signal\n"
                f"    for attempt in (lambda: open({str(target)!r}, 'w').write('gone'),\n"
                f"                    lambda: os.kill({sleeper.pid}, signal.SIGTERM)):\n"
                f"        try:\n"
                f"            attempt()\n"
                f"        except OSError:\n"
                f"            pass")
        text = in_build(grab)
        assert module_spec(ModuleFile(f"writes_{restricted}.py", text)).family == "user"
        time.sleep(0.2)
        assert target.exists() == (restricted == "off")
        assert (sleeper.poll() is None) == (restricted == "on")
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("restricted", ["on", OFF])
def test_the_trace_cannot_kill_its_supervisor(restricted: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # build() sends SIGKILL to its parent, the supervisor that ends what the file leaves running: under
    # Landlock it is out of the tracer's reach and the trace ends as usual; without, the trace is lost
    from autoslapo import landlock

    if restricted == "on" and landlock.abi() < 6:
        pytest.skip(f"needs Linux's Landlock, ABI 6 (Linux 6.12) for signals: this kernel has ABI {landlock.abi()}")
    monkeypatch.setenv(modfile.LANDLOCK_ENV, restricted)
    text = in_build("import os, signal\n    try:\n        os.kill(os.getppid(), signal.SIGKILL)\n"
                    "    except OSError:\n        pass\n    import time\n    time.sleep(1)")
    if restricted == "on":
        assert module_spec(ModuleFile("parricide.py", text)).family == "user"
    else:
        with pytest.raises(UsageError, match=r"the trace of the model file parricide\.py was killed"):
            module_spec(ModuleFile("parricide.py", text))


def daemon_source(mib: int, sleep_s: int = 120) -> str:
    """A model file whose build() leaves a daemon behind, as a double fork with setsid does: a process
    in a session of its own whose parent has exited, holding ``mib`` MiB; build() returns once it runs.
    The daemon writes its pid to ``daemon.pid`` beside the file, in its cache entry (where a trace may write)."""
    daemon = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
              f"os.rename(sys.argv[1] + '.tmp', sys.argv[1]); held = b'x' * ({mib} << 20); time.sleep({sleep_s})")
    grab = (f"import os, sys, time\n"
            f"    pidfile = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'daemon.pid')\n"
            f"    if os.fork() == 0:\n"
            f"        os.setsid()\n"
            f"        if os.fork() == 0:\n"
            f"            os.execv(sys.executable, [sys.executable, '-c', {daemon!r}, pidfile])\n"
            f"        os._exit(0)\n"
            f"    while not os.path.exists(pidfile):\n"
            f"        time.sleep(0.05)")
    text = in_build(grab)
    return text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_daemon_the_file_leaves_behind_ends_with_its_trace(cache: Path) -> None:
    mf = ModuleFile("leaves.py", daemon_source(mib=1))
    assert module_spec(mf).family == "user"
    pid = int((cache / mf.digest / "daemon.pid").read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"the daemon {pid} outlived the trace"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_daemon_the_file_starts_counts_toward_the_trace_limit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the daemon holds 400 MiB in a session of its own, re-parented when its parent exits; with the
    # trace's own ~220 MiB the two are over 512 MiB, each under it
    monkeypatch.setenv("AUTOSLAPO_TRACE_MEMORY_MIB", "512")
    text = daemon_source(mib=400).replace("    return Net()", "    time.sleep(60)\n    return Net()")
    mf = ModuleFile("hog.py", text)
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"the model file hog\.py needed more than 512 MiB to trace") as err:
        module_spec(mf)
    assert "its processes together" in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - started < 45  # stopped by the sum, not by the 120 s timeout
    assert not alive(int((cache / mf.digest / "daemon.pid").read_text()))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_proctree_finds_descendants_group_and_marked_processes() -> None:
    from autoslapo import proctree

    code = "import time; b = b'x' * (64 << 20); time.sleep(30)"
    kid = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    # not a descendant of kid, not in its group: found by the mark in its environment alone
    marked = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                              env={**os.environ, "AUTOSLAPO_TEST_MARK": "m1"})
    try:
        time.sleep(1.5)
        used = proctree.usage(kid.pid)
        assert used is not None and used[0] > 64 << 20 and used[1] >= 0
        both = proctree.usage(kid.pid, b"AUTOSLAPO_TEST_MARK=m1")
        assert both is not None and both[0] > used[0] + (64 << 20) - (8 << 20)
        assert proctree.usage(2**22 + 7) == (0, 0.0)  # no such process
        assert {p.pid for p in proctree.family(None, b"AUTOSLAPO_TEST_MARK=m1")} == {marked.pid}
        assert proctree.kill(kid.pid, b"AUTOSLAPO_TEST_MARK=m1") == {kid.pid, marked.pid}
        assert kid.wait(timeout=10) == -9 and marked.wait(timeout=10) == -9
    finally:
        for p in (kid, marked):
            p.kill()
            p.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_process_that_ended_after_it_was_listed_holds_no_memory() -> None:
    # the race that once failed the forked-helpers test: a child listed alive (its resident size
    # counting the pages it shares) that ends before its proportional size is read
    from autoslapo import proctree

    kid = subprocess.Popen([sys.executable, "-c", "pass"])
    kid.wait()  # reaped: /proc/<pid> is gone
    assert proctree.proportional_bytes(kid.pid) == 0
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proctree.proportional_bytes(pid) == 0  # a zombie: its address space is gone
    finally:
        os.waitpid(pid, 0)
    assert proctree.proportional_bytes(os.getpid()) > 0


def test_a_bad_trace_memory_limit_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, service_store: Store) -> None:
    monkeypatch.setenv("AUTOSLAPO_TRACE_MEMORY_MIB", "lots")
    with pytest.raises(UsageError, match="AUTOSLAPO_TRACE_MEMORY_MIB must be a whole number of MiB"):
        ServiceSettings(allow_module_files=True)
    with pytest.raises(UsageError, match="AUTOSLAPO_TRACE_MEMORY_MIB must be a whole number of MiB"):
        Worker(service_store, allow_module_files=True)
    ServiceSettings()  # without module files the limit is never used


@pytest.mark.parametrize(("value", "words"), [
    ({"name": "../evil.py", "source": TINY}, "must be a Python file name"),
    ({"name": "tiny.txt", "source": TINY}, "must be a Python file name"),
    ({"name": "tiny.py", "source": ""}, "non-empty JSON string"),
    ({"name": "tiny.py", "source": "x = 1\x00"}, "NUL character"),
    ({"name": "tiny.py", "source": "x = '\ud800'"}, "must be text"),
    ({"name": "tiny.py"}, "must be {\"name\""),
])
def test_a_bad_module_payload_is_one_line(value: dict, words: str) -> None:
    with pytest.raises(UsageError, match="module_file") as err:
        StudyRequest.from_json({**BASE, "model": {"module_file": value}}, allow_module_files=True)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_without_the_flag_a_module_file_is_refused_before_anything_runs(client: TestClient, tokens: dict[str, str],
                                                                        service_store: Store) -> None:
    with pytest.raises(ModuleFilesOff, match="--allow-module-files"):
        StudyRequest.from_json({**BASE, "model": payload("raise SystemExit('never run')\n")})
    r = client.post("/v1/studies", json={**BASE, "model": payload()}, headers=bearer(tokens["submit"]))
    assert r.status_code == 403 and "--allow-module-files" in r.json()["error"] and "\n" not in r.json()["error"]
    assert service_store.jobs.list() == [] and service_store.list_studies() == []
    r = client.post("/v1/estimate", json={"model": payload(), "gpus": 8}, headers=bearer(tokens["read"]))
    assert r.status_code == 403 and "--allow-module-files" in r.json()["error"]


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_submit_run_and_ask_for_the_best_of_a_module_file(open_client: TestClient, tokens: dict[str, str],
                                                          module_worker: Worker, service_store: Store,
                                                          tmp_path: Path) -> None:
    submit = bearer(tokens["submit"])
    assert open_client.post("/v1/studies", json={**BASE, "model": payload(), "trials": 4},
                            headers=bearer(tokens["read"])).status_code == 403  # the submit role is needed
    for text, words in BROKEN:
        bad = open_client.post("/v1/studies", json={**BASE, "model": payload(text), "trials": 4}, headers=submit)
        assert bad.status_code == 400 and words in bad.json()["error"] and "\n" not in bad.json()["error"], bad.text
    assert service_store.jobs.list() == [] and service_store.list_studies() == []  # the store is unchanged
    posted = open_client.post("/v1/studies", json={**BASE, "model": payload(), "trials": 4}, headers=submit)
    assert posted.status_code == 202, posted.text
    name = posted.json()["name"]
    assert name == "tiny-8xa100-80gb-sim"
    doc = wait_status(open_client, name, tokens["read"])
    assert doc["status"] == "complete" and doc["launched"] == 4, doc
    path = write_model_file(tmp_path, TINY, "tiny.py")
    spec = resolve_model(str(path))
    study = service_store.get_study(name)
    assert study.model_signature == spec.signature() and study.model["extra"]["digest"] == spec.extra["digest"]
    best = open_client.get("/v1/best", params={"model": model_query(str(path)), "gpus": 8},
                           headers=bearer(tokens["read"]))
    assert best.status_code == 200, best.text
    assert best.json()["study"] == name and best.json()["config"] == doc["best"]["config"]
    # the cost model, of the same file sent as data and of its signature (read from the study)
    refused = open_client.post("/v1/estimate", json={"model": payload(), "gpus": 8}, headers=bearer(tokens["read"]))
    assert refused.status_code == 403, refused.text  # tracing a file runs its code: the submit role is needed
    posted_estimate = open_client.post("/v1/estimate", json={"model": payload(), "gpus": 8}, headers=submit)
    assert posted_estimate.status_code == 200, posted_estimate.text
    by_signature = open_client.get("/v1/estimate", params={"model": spec.signature(), "gpus": 8},
                                   headers=bearer(tokens["read"]))
    assert by_signature.json() == posted_estimate.json() and by_signature.json()["model"] == "tiny"


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_a_worker_that_takes_a_module_job_over_builds_the_same_spec(service_store: Store, cache: Path) -> None:
    request = StudyRequest.from_json({**BASE, "model": payload(), "trials": 5, "name": "mod"}, allow_module_files=True)
    first = request.model_spec()
    service_store.jobs.submit("mod", request.to_dict())
    ghost = service_store.jobs.claim("ghost", 0.3)  # a worker that ran two trials, then died
    assert ghost is not None
    tune(dataclasses.replace(StudyRequest(**ghost.request).to_options(name="mod"), trials=2), service_store)
    time.sleep(0.5)  # its lease lapses
    forget()
    shutil.rmtree(cache)  # the next worker runs on another machine: nothing of the file but the job
    assert Worker(service_store, lease_s=5, poll_s=0.1, allow_module_files=True).run(once=True) == 1
    job = service_store.jobs.get("mod")
    assert job is not None and job.status == "complete" and job.attempts == 2, job
    assert service_store.get_study("mod").model_signature == first.signature()
    assert (cache / first.extra["digest"] / "tiny.py").read_text() == TINY  # written again from the job
    assert len([t for t in service_store.trials("mod") if t.status != "pruned"]) == 5


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_a_worker_without_the_flag_leaves_a_module_job_to_one_that_has_it(service_store: Store) -> None:
    request = StudyRequest.from_json({**BASE, "model": payload(), "trials": 2, "name": "mod"}, allow_module_files=True)
    service_store.jobs.submit("mod", request.to_dict())
    service_store.jobs.submit("plain", StudyRequest.from_json({**BASE, "model": "bert-tiny", "trials": 2}).to_dict())
    plain_worker = Worker(service_store, lease_s=5, poll_s=0.1)
    assert plain_worker.run(once=True) == 1  # gave the module job back, then ran the next one
    job = service_store.jobs.get("mod")
    assert job is not None and job.status == "queued" and job.attempts == 0 and job.worker == ""
    assert "waiting for a worker started with --allow-module-files" in job.error
    assert not service_store.has_study("mod")
    assert service_store.jobs.get("plain").status == "complete"  # type: ignore[union-attr]
    assert plain_worker.run(once=True) == 0  # it does not take the module job again
    assert Worker(service_store, lease_s=5, poll_s=0.1, allow_module_files=True).run(once=True) == 1
    job = service_store.jobs.get("mod")
    assert job is not None and job.status == "complete" and job.error == "" and job.attempts == 1
    assert service_store.has_study("mod")


def test_the_client_sends_the_file_as_text_and_asks_by_signature(tmp_path: Path) -> None:
    path = write_model_file(tmp_path, TINY, "tiny.py")
    assert model_field(str(path)) == payload()
    assert model_query(str(path)) == resolve_model(str(path)).signature()
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# caf\xe9\n")
    with pytest.raises(UsageError, match="not UTF-8 text"):
        model_field(str(latin))
    with pytest.raises(UsageError, match="cannot read the model file"):
        model_field(str(tmp_path / "missing.py"))


@pytest.mark.slow
def test_remote_tune_and_best_of_a_model_file_against_a_running_server(tmp_path: Path, cache: Path) -> None:
    procs = Processes(tmp_path)
    procs.env["AUTOSLAPO_MODEL_CACHE"] = str(cache)
    try:
        path = write_model_file(tmp_path, TINY, "tiny.py")
        procs.serve("--workers", "1", "--allow-module-files")
        done = procs.cli("tune", str(path), "--gpus", "8", "--trials", "5", "--no-baselines", "--sampler", "tpe",
                         "--server", procs.base, token=procs.submit)
        assert done.returncode == 0, done.stderr
        assert "study tiny-8xa100-80gb-sim: 5 trials launched, status complete" in done.stdout
        moved = tmp_path / "elsewhere" / "renamed.py"  # asked by content, whatever the file is called
        moved.parent.mkdir()
        shutil.copy(path, moved)
        best = procs.cli("best", str(moved), "--gpus", "8", "--server", procs.base, token=procs.read)
        assert best.returncode == 0 and "study tiny-8xa100-80gb-sim" in best.stdout, best.stderr
        code = f"import autoslapo; c = autoslapo.best({str(moved)!r}, gpus=8, server={procs.base!r}); print(c.dp)"
        lib = subprocess.run([sys.executable, "-c", code], env={**procs.env, "AUTOSLAPO_TOKEN": procs.read},
                             capture_output=True, text=True, timeout=300, check=False)
        assert lib.returncode == 0 and lib.stdout.strip().isdigit(), lib.stderr
    finally:
        procs.close()


def test_workers_and_servers_that_take_model_files_prune_the_cache(service_store: Store, cache: Path) -> None:
    stale = [cache / f"{n:064x}" for n in (1, 2)]
    for entry in stale:
        entry.mkdir(parents=True)
        then = time.time() - 31 * 86400
        os.utime(entry, (then, then))
    with TestClient(create_app(service_store, ServiceSettings(allow_module_files=True))):
        assert not stale[0].exists() and not stale[1].exists()  # at start
    stale[0].mkdir()
    then = time.time() - 31 * 86400
    os.utime(stale[0], (then, then))
    service_store.jobs.submit("plain", StudyRequest.from_json({**BASE, "model": "bert-tiny", "trials": 1}).to_dict())
    assert Worker(service_store, lease_s=5, poll_s=0.1, allow_module_files=True).run(once=True) == 1
    assert not stale[0].exists()  # after its job


@pytest.mark.parametrize(("value", "on"), [(None, True), ("", True), ("on", True), ("1", True),
                                           ("off", False), (" OFF ", False), ("0", False), ("no", False),
                                           ("false", False)])
def test_each_isolation_is_on_unless_its_variable_says_off(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                                           on: bool) -> None:
    for variable in (modfile.CGROUP_ENV, modfile.NETWORK_ENV, modfile.LANDLOCK_ENV):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
        assert modfile._switched_on(variable) is on
