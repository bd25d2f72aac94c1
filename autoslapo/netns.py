"""Leave the network: move this process into a new network namespace of its own. Stdlib only.

A new network namespace holds only a loopback interface, down: no route to anywhere, not even to the
host's own 127.0.0.1, and no name resolution. A model file's trace needs none (build() and one
forward on the meta device), and with none it can neither download nor send anything. Linux
``unshare(2)``: ``CLONE_NEWNET`` needs ``CAP_SYS_ADMIN`` (root); an unprivileged process may pair it
with ``CLONE_NEWUSER`` where the kernel allows unprivileged user namespaces, mapping its own user and
group into the new user namespace (``user_namespaces(7)``: one line of ``uid_map``/``gid_map``, after
``setgroups`` is denied) so that its files keep their owner and it can still create them. Both need a
single-threaded caller (a fresh ``python -c`` that imports no threads).
"""

from __future__ import annotations

import contextlib
import ctypes
import os

CLONE_NEWNET = 0x40000000  # linux/sched.h
CLONE_NEWUSER = 0x10000000


def _unshare(flags: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.unshare(flags) == 0)
    except (OSError, AttributeError):
        return False


def _map_self(uid: int, gid: int) -> bool:
    try:
        # kernels before 3.19 have no setgroups file
        with contextlib.suppress(FileNotFoundError), open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError:
        return False
    return True


def leave_network() -> str:
    """Move this process (and the children it starts later) into a new network namespace.

    Returns how: ``"netns"`` (privileged), ``"userns"`` (with an unprivileged user namespace, its
    user and group mapped to themselves; ``"userns-unmapped"`` where the mapping was refused, so
    creating files may fail), or ``""`` where neither is allowed (the process keeps the host's
    network)."""
    if _unshare(CLONE_NEWNET):
        return "netns"
    uid, gid = os.getuid(), os.getgid()
    if _unshare(CLONE_NEWUSER | CLONE_NEWNET):
        return "userns" if _map_self(uid, gid) else "userns-unmapped"
    return ""
