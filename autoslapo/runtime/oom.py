"""Evidence that the kernel killed a rank for memory, read where the kernel reports it.

A rank that ends by SIGKILL without a result may have been killed by the kernel's out-of-memory
killer, a cgroup's memory limit, a scheduler's preemption or an operator's ``kill -9``; the exit
status alone cannot tell them apart. ``OomWatch`` notes, before a launch, the two places that
can: the ``oom_kill`` counter of the cgroup the ranks run in (cgroup v2 ``memory.events``, v1
``memory.oom_control``; ranks inherit the launcher's cgroup) and the kernel's log
(``/dev/kmsg``, read from its end onwards, where it can be read without privileges). After the
launch, ``evidence`` says what changed, or ``""`` when nothing did.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from autoslapo.memcg import own_groups, read_oom_kills

__all__ = ["OomWatch", "cgroup_oom_file", "kernel_oom_pid", "read_oom_kills"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = "/dev/kmsg"
# "Out of memory: Killed process 1234 (python)", "Memory cgroup out of memory: Killed process 1234 ...",
# "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=python,pid=1234,uid=0"
_KILLED = re.compile(r"Killed process (\d+)|oom-kill:.*\bpid=(\d+)")


def cgroup_oom_file(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> Path | None:
    """The file holding the ``oom_kill`` counter of this process's memory cgroup, or None.

    ``proc_cgroup``: the text of ``/proc/self/cgroup`` (read when None). cgroup v1
    (``N:memory:/path``): ``<root>/memory/<path>/memory.oom_control``; cgroup v2 (``0::/path``):
    ``<root>/<path>/memory.events`` (or under ``<root>/unified``).
    """
    groups = own_groups(proc_cgroup)
    candidates: list[Path] = []
    if "memory" in groups:
        candidates.append(root / "memory" / groups["memory"].lstrip("/") / "memory.oom_control")
    if "2" in groups:
        rel = groups["2"].lstrip("/")
        candidates += [root / rel / "memory.events", root / "unified" / rel / "memory.events"]
    return next((c for c in candidates if c.is_file()), None)


def kernel_oom_pid(message: str) -> int | None:
    """The pid a kernel out-of-memory kill message names, or None for another message."""
    m = _KILLED.search(message)
    if m is None:
        return None
    return int(m.group(1) or m.group(2))


class OomWatch:
    """Watch the cgroup counter and the kernel log for out-of-memory kills during a launch.

    ``events``: the counter file (default: this process's cgroup's). Reads nothing that needs
    privileges; a source that cannot be read is skipped. Call ``close`` when done.
    """

    def __init__(self, events: Path | None = None, *, kmsg: str | None = KMSG) -> None:
        self.events = cgroup_oom_file() if events is None else events
        self.before = read_oom_kills(self.events)
        self._kmsg: int | None = None
        if kmsg is not None:
            with contextlib.suppress(OSError):
                fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    os.lseek(fd, 0, os.SEEK_END)  # only what the kernel logs from now on
                except OSError:
                    os.close(fd)
                    raise
                self._kmsg = fd

    def _kernel_lines(self) -> list[str]:
        lines: list[str] = []
        if self._kmsg is None:
            return lines
        while True:
            try:
                record = os.read(self._kmsg, 16384)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: records were overwritten while we read; go on with the next
                continue
            if not record:
                break
            lines.append(record.decode(errors="replace").split(";", 1)[-1].strip())
        return lines

    def evidence(self, pids: set[int]) -> str:
        """What says an out-of-memory kill happened since the watch began, or ``""``.

        A kernel message naming one of ``pids`` (``kernel log: ...``), else a rise of the cgroup's
        counter (``cgroup memory.events oom_kill 3 -> 4``).
        """
        for line in self._kernel_lines():
            pid = kernel_oom_pid(line)
            if pid is not None and pid in pids:
                return f"kernel log: {line[:200]}"
        after = read_oom_kills(self.events)
        if self.events is not None and self.before is not None and after is not None and after > self.before:
            return f"cgroup {self.events.name} oom_kill {self.before} -> {after}"
        return ""

    def close(self) -> None:
        if self._kmsg is not None:
            with contextlib.suppress(OSError):
                os.close(self._kmsg)
            self._kmsg = None
