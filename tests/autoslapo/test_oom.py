"""Out-of-memory evidence: the cgroup's oom_kill counter and the kernel's kill messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslapo.runtime.oom import OomWatch, cgroup_oom_file, kernel_oom_pid, read_oom_kills

EVENTS_V2 = "low 0\nhigh 0\nmax 12\noom 4\noom_kill {n}\noom_group_kill 0\n"
CONTROL_V1 = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"


def test_the_counter_file_of_a_v2_and_a_v1_cgroup_is_found(tmp_path: Path) -> None:
    v2 = tmp_path / "user.slice" / "job"
    v2.mkdir(parents=True)
    (v2 / "memory.events").write_text(EVENTS_V2.format(n=3))
    assert cgroup_oom_file("0::/user.slice/job\n", tmp_path) == v2 / "memory.events"
    v1 = tmp_path / "memory" / "box" / "a1"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text(CONTROL_V1.format(n=0))
    proc = "9:name=systemd:/\n4:memory:/box/a1\n1:cpu:/\n0::/\n"
    assert cgroup_oom_file(proc, tmp_path) == v1 / "memory.oom_control"
    assert cgroup_oom_file("0::/nowhere\n", tmp_path) is None
    assert read_oom_kills(v2 / "memory.events") == 3 and read_oom_kills(v1 / "memory.oom_control") == 0
    assert read_oom_kills(tmp_path / "missing") is None and read_oom_kills(None) is None


@pytest.mark.parametrize(
    ("message", "pid"),
    [
        ("Out of memory: Killed process 4242 (python) total-vm:812345kB, anon-rss:700000kB", 4242),
        ("Memory cgroup out of memory: Killed process 77 (python3) total-vm:1kB", 77),
        ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python,pid=1234,uid=0", 1234),
        ("python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0", None),
        ("eth0: link up", None),
    ],
)
def test_kernel_kill_messages_name_their_pid(message: str, pid: int | None) -> None:
    assert kernel_oom_pid(message) == pid


def test_a_rise_of_the_cgroup_counter_is_the_evidence(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text(EVENTS_V2.format(n=3))
    watch = OomWatch(events, kmsg=None)
    assert watch.evidence({1}) == ""
    events.write_text(EVENTS_V2.format(n=4))
    assert watch.evidence({1}) == "cgroup memory.events oom_kill 3 -> 4"
    watch.close()


def test_a_watch_without_a_readable_source_finds_nothing(tmp_path: Path) -> None:
    watch = OomWatch(tmp_path / "missing", kmsg=str(tmp_path / "no-kmsg"))
    assert watch.before is None and watch.evidence({1, 2}) == ""
    watch.close()
