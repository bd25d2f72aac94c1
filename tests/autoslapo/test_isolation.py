"""What a model file's trace runs inside. Memory cgroups (``autoslapo.memcg``): the kernel holds the
sum at every allocation, counts what it kills, and the group ends with every member; they need a
machine that lets this process make one (root, or a delegated cgroup v2 memory controller), and
elsewhere these skip and the service relies on its polls (tests/service/test_modfile.py covers
both). A network namespace (``autoslapo.netns``): no route to the host's loopback, files made as
before, privileged and as an unprivileged user. Landlock (``autoslapo.landlock``): writes beneath the
allowed directories only, TCP connects denied, no signal to a process outside."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoslapo import landlock, memcg, netns
from tests.service.test_processes import alive

PREFIX = "autoslapo-test-"
NO_CGROUP = ("this machine lets no process here make a memory cgroup (needs root or a delegated cgroup v2 "
             "memory controller): the service then holds the trace's sum by its polls alone")


@pytest.fixture
def group() -> Iterator[memcg.MemoryCgroup]:
    made = memcg.create(PREFIX, 64 << 20)
    if made is None:
        pytest.skip(NO_CGROUP)
    yield made
    made.remove()


def joined(group: memcg.MemoryCgroup, body: str) -> str:
    """Python that joins ``group`` first, then runs ``body``."""
    return f"import os, time; open({str(group.procs)!r}, 'w').write(str(os.getpid()))\n{body}"


def test_the_kernel_stops_a_member_at_the_limit_and_counts_it(group: memcg.MemoryCgroup) -> None:
    assert group.oom_kills() == 0
    run = subprocess.run([sys.executable, "-c", joined(group, "b = b'x' * (200 << 20); print('held')")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == -9 and "held" not in run.stdout
    assert group.oom_kills() == 1


def test_members_together_are_held_to_the_limit(group: memcg.MemoryCgroup) -> None:
    # three children of 40 MiB, each well under 64 MiB, born in the group: together over it
    body = ("import subprocess, sys\n"
            "kids = [subprocess.Popen([sys.executable, '-c', 'import time; b = b\"x\" * (40 << 20); time.sleep(2)'])"
            " for _ in range(3)]\n"
            "print([k.wait() for k in kids])")
    run = subprocess.run([sys.executable, "-c", joined(group, body)], capture_output=True, text=True, timeout=60)
    assert group.oom_kills() >= 1, run.stdout + run.stderr


def test_remove_ends_every_member_and_the_group(group: memcg.MemoryCgroup) -> None:
    kid = subprocess.Popen([sys.executable, "-c", joined(group, "time.sleep(60)")], start_new_session=True)
    deadline = time.monotonic() + 20
    while kid.pid not in group.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group.pids() == [kid.pid]
    assert group.remove() and not group.path.exists()
    assert kid.wait(timeout=10) == -9 and not alive(kid.pid)


NETWORK_PROBE = """
import os, socket, sys, tempfile
sys.path.insert(0, sys.argv[2])
from netns import leave_network
how = leave_network()
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
    reached = True
except OSError:
    reached = False
work = tempfile.mkdtemp()
path = os.path.join(work, "made")
open(path, "w").write("x")
print(how or "-", reached, os.stat(path).st_uid == os.getuid())
"""


def leave_network_as(argv: list[str]) -> list[str]:
    """``leave_network`` in a fresh process started as ``argv`` + the probe: how, whether it reached
    a listener on the host's loopback, whether a file it made is its own."""
    where = tempfile.mkdtemp()
    try:
        os.chmod(where, 0o755)
        shutil.copy(netns.__file__, os.path.join(where, "netns.py"))
        os.chmod(os.path.join(where, "netns.py"), 0o644)
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            run = subprocess.run([*argv, str(port), where], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        return run.stdout.split()
    finally:
        shutil.rmtree(where)


def test_leaving_the_network_cuts_the_loopback_and_keeps_files() -> None:
    how, reached, own = leave_network_as([sys.executable, "-c", NETWORK_PROBE])
    if how == "-":
        pytest.skip("this machine lets no process here make a network namespace")
    assert how in ("netns", "userns") and reached == "False" and own == "True"


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root and setpriv to start a process as another user, and a system python3")
def test_an_unprivileged_user_leaves_the_network_through_a_user_namespace() -> None:
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to run as")
    how, reached, own = leave_network_as(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                                          "--clear-groups", "/usr/bin/python3", "-c", NETWORK_PROBE])
    if how != "userns":
        pytest.skip(f"unprivileged user namespaces are off on this machine (leave_network gave {how!r})")
    assert reached == "False" and own == "True"


LANDLOCK_PROBE = """
import os, signal, socket, sys
from autoslapo.landlock import restrict
ok, other, sleeper = sys.argv[1:4]
v = restrict([ok], network=True)
def tried(f):
    try:
        f()
        return "yes"
    except OSError:
        return "no"
print(v, tried(lambda: open(os.path.join(ok, "a"), "w").write("x")),
      tried(lambda: open(os.path.join(other, "a"), "w").write("x")),
      tried(lambda: open("/dev/null", "w").write("x")),
      tried(lambda: os.kill(int(sleeper), signal.SIGTERM)),
      tried(lambda: socket.create_connection(("127.0.0.1", 9), timeout=2)))
"""


def test_landlock_allows_writes_beneath_the_given_directories_only(tmp_path: Path) -> None:
    if landlock.abi() < 1:
        pytest.skip("this kernel has no Landlock (Linux 5.13+, with landlock among its security modules)")
    ok, other = tmp_path / "ok", tmp_path / "other"
    ok.mkdir()
    other.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = subprocess.run([sys.executable, "-c", LANDLOCK_PROBE, str(ok), str(other), str(sleeper.pid)],
                             capture_output=True, text=True, timeout=60)
        v, mine, theirs, null, signalled, connected = run.stdout.split()
        assert int(v) == landlock.abi() and (mine, theirs, null) == ("yes", "no", "yes")
        assert (ok / "a").exists() and not (other / "a").exists()
        if int(v) >= 4:
            assert connected == "no"
        if int(v) >= 6:
            assert signalled == "no" and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
