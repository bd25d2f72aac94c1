"""A memory cgroup for a group of processes, where this machine lets the server make one. Stdlib only.

Polling a group's resident memory (``autoslapo.proctree``) misses a burst shorter than the poll. A
memory cgroup does not: the kernel charges every page a member allocates to the group, reclaims its
cache at the limit and, when nothing is left to reclaim, kills a member (its out-of-memory killer,
scoped to the group), counting each kill in the group's events. A process started in the group stays
in it whatever it does to its session, parent or environment; it can leave only by writing itself
into another group, which needs write access to that group's ``cgroup.procs``.

Where: cgroup v2 when the server's own cgroup delegates the memory controller to its children
(``memory`` in its ``cgroup.subtree_control``: ``memory.max``, ``memory.swap.max``, the
``oom_kill`` line of ``memory.events``); else cgroup v1's memory hierarchy when the server may write
below its own group there (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes`` where swap
accounting is on, the ``oom_kill`` line of ``memory.oom_control``, Linux 4.13). ``create`` gives
None where neither is writable (an unprivileged user without delegation, a container without its
own cgroup namespace, not Linux); the caller then has its polls alone. References: the kernel's
Documentation/admin-guide/cgroup-v2.rst ("memory.max", "memory.events") and cgroup-v1/memory.rst.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

V2_MOUNTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
V1_MOUNT = Path("/sys/fs/cgroup/memory")


@dataclass(frozen=True)
class MemoryCgroup:
    """One group this process made: its directory and the cgroup version it lives in."""

    path: Path
    version: int

    @property
    def procs(self) -> Path:
        """The file a process writes its own pid into to join the group (its later children are born there)."""
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        """The group's members now ([] once it is gone)."""
        try:
            return [int(x) for x in self.procs.read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """How many members the kernel killed for the group's limit."""
        return read_oom_kills(self.path / ("memory.events" if self.version == 2 else "memory.oom_control")) or 0

    def remove(self, timeout_s: float = 5.0) -> bool:
        """Kill every member, then remove the group; False when it still held members at ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()  # refused while a member (or a zombie not yet reaped) is in it
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)


def read_oom_kills(path: Path | None) -> int | None:
    """The ``oom_kill N`` counter in a ``memory.events`` / ``memory.oom_control`` file (None if unreadable)."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            with contextlib.suppress(ValueError):
                return int(value.strip())
    return None


def own_groups(proc_cgroup: str | None = None) -> dict[str, str]:
    """This process's group in each hierarchy of ``/proc/self/cgroup`` (or of the text
    ``proc_cgroup``): ``"2"`` for v2 (``0::/path``), else the v1 controller's name (``memory``)."""
    out: dict[str, str] = {}
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return out
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out["2"] = path
        for c in controllers.split(","):
            out.setdefault(c, path)
    return out


def _bases() -> list[tuple[Path, int]]:
    """Where a child group of this process's own may go: v2 first, where memory is delegated."""
    own, found = own_groups(), []
    if "2" in own:
        for mount in V2_MOUNTS:
            base = mount / own["2"].lstrip("/")
            with contextlib.suppress(OSError):
                if "memory" in (base / "cgroup.subtree_control").read_text().split():
                    found.append((base, 2))
                    break
    if "memory" in own and (V1_MOUNT / "memory.limit_in_bytes").exists():
        found.append((V1_MOUNT / own["memory"].lstrip("/"), 1))
    return found


def _limit(group: Path, version: int, limit_bytes: int) -> None:
    if version == 2:
        (group / "memory.max").write_text(str(limit_bytes))
        with contextlib.suppress(OSError):  # no swap accounting: nothing to hold
            (group / "memory.swap.max").write_text("0")
        return
    (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    with contextlib.suppress(OSError):  # memory + swap no more than memory: no swapping out of the limit
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))


def _sweep(base: Path, prefix: str) -> None:
    """Remove empty groups an ended server process left (its pid is the name's first field)."""
    with contextlib.suppress(OSError):
        for d in base.iterdir():
            owner = d.name[len(prefix):].split("-", 1)[0] if d.name.startswith(prefix) else ""
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                with contextlib.suppress(OSError):
                    d.rmdir()


def create(prefix: str, limit_bytes: int) -> MemoryCgroup | None:
    """A new group ``<prefix><pid>-<n>`` below this process's own, holding its members to
    ``limit_bytes`` together; None where no hierarchy lets this process make one."""
    for base, version in _bases():
        _sweep(base, prefix)
        group = base / f"{prefix}{os.getpid()}-{time.monotonic_ns()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            _limit(group, version, limit_bytes)
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
            continue
        return MemoryCgroup(group, version)
    return None
