"""A family of processes on Linux, read from ``/proc``: a root process, its descendants, its process
group, and any process that carries a marker in its environment. Stdlib only, so a small supervisor
process can import it without torch.

What a started program can do to leave its parent's reach, and what still finds it here:
``setsid`` (a new session and process group) keeps its parent, so it stays a descendant; a double
fork whose middle process exits is re-parented to the nearest "child subreaper" ancestor
(``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4, see ``become_subreaper``), so under a subreaper root it
stays one too; a process that the root's death left to init still carries the environment it was
started with (``/proc/<pid>/environ`` is the environment at its ``exec``), unless it cleared it
on purpose.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    """One process's ``/proc/<pid>/stat``: parent, group, state, CPU seconds (with the reaped
    children's), resident bytes."""

    pid: int
    ppid: int
    pgid: int
    state: str
    cpu_s: float
    rss_bytes: int


def processes() -> list[Proc] | None:
    """Every process this user can see, or None without ``/proc`` (not Linux)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
    out = []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:  # it ended meanwhile
            continue
        # after "pid (comm) ": state ppid pgrp ... utime stime cutime cstime (fields 14-17) ... rss (24)
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) < 22:
            continue
        out.append(Proc(int(name), int(fields[1]), int(fields[2]), fields[0].decode(),
                        sum(int(x) for x in fields[11:15]) / tick, int(fields[21]) * page))
    return out


def carries(pid: int, marker: bytes) -> bool:
    """Whether ``pid`` was started with ``marker`` (``NAME=value``) in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def family(root: int | None, marker: bytes | None = None, procs: list[Proc] | None = None) -> list[Proc]:
    """``root`` (when alive), its descendants, the members of the process group it leads, and every
    process started with ``marker`` in its environment (this process excepted)."""
    procs = processes() if procs is None else procs
    if not procs:
        return []
    children: dict[int, list[Proc]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p)
    found: dict[int, Proc] = {}
    if root is not None:
        stack = [p for p in procs if p.pid == root or p.pgid == root]
        while stack:
            p = stack.pop()
            if p.pid not in found:
                found[p.pid] = p
                stack.extend(children.get(p.pid, ()))
    if marker is not None:
        me = os.getpid()
        for p in procs:
            if p.pid not in found and p.pid != me and carries(p.pid, marker):
                found[p.pid] = p
    return list(found.values())


def proportional_bytes(pid: int) -> int | None:
    """``pid``'s proportional set size (``Pss`` of ``/proc/<pid>/smaps_rollup``, Linux 4.14): its
    resident pages, a page that ``n`` processes share counting ``1/n`` in each. Summed over processes
    it counts each page once, where resident sizes count a forked child's inherited pages again in
    every child. 0 for a process that ended since it was listed (it holds no pages now: counting its
    listed resident size instead would count a forked child's shared pages in full). None where it
    cannot be read (another user's process, an older kernel)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except ProcessLookupError:  # a zombie now: its address space is gone
        return 0
    except FileNotFoundError:
        return 0 if not os.path.exists(f"/proc/{pid}") else None  # reaped; else a kernel without the file
    except (OSError, ValueError, IndexError):
        return None
    return 0  # no Pss line: a process without an address space (one that is exiting)


def usage(root: int | None, marker: bytes | None = None) -> tuple[int, float] | None:
    """(memory bytes, CPU seconds) summed over ``family(root, marker)``; None without ``/proc``.

    Memory is each member's proportional set size (``proportional_bytes``; its resident size where
    that cannot be read), so pages a forked child shares with its parent count once. A process's
    CPU time includes its reaped children's, so an ended helper still counts (in its parent's); an
    unreaped one (a zombie) counts its own and holds no memory."""
    procs = processes()
    if procs is None:
        return None
    members = family(root, marker, procs)
    memory = 0
    for p in members:
        pss = proportional_bytes(p.pid) if p.rss_bytes else 0
        memory += p.rss_bytes if pss is None else pss
    return memory, sum(p.cpu_s for p in members)


def kill(root: int | None, marker: bytes | None = None, *, spare_root: bool = False, rounds: int = 50) -> set[int]:
    """SIGKILL ``family(root, marker)`` until none is left alive (a member may fork while it is
    looked at; those rounds catch its children). With ``spare_root`` the root lives on, so the
    orphans of a killed member stay under it (a subreaper) rather than passing to init. Returns
    the pids killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        alive = [p for p in family(root, marker) if p.state not in ("Z", "X") and not (spare_root and p.pid == root)]
        if not alive:
            break
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, signal.SIGKILL)
                killed.add(p.pid)
        time.sleep(0.01)
    return killed


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``):
    a double-forked daemon then stays in its family. False where the call is not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER = 36 (linux/prctl.h)
    except (OSError, AttributeError):
        return False
