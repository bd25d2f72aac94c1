"""Memory cgroups for a group of processes (``autoslapo.memcg``): the kernel holds the sum at every
allocation, counts what it kills, and the group ends with every member. Needs a machine that lets
this process make one (root, or a delegated cgroup v2 memory controller); elsewhere these skip, and
the service relies on its polls (tests/service/test_modfile.py covers both)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from autoslapo import memcg
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


def test_switched_off_it_makes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memcg.ENV, "off")
    assert memcg.create(PREFIX, 64 << 20) is None
