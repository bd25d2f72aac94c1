"""Restrict what this process (and every process it starts later) may write, signal and connect to,
with Linux's Landlock (``landlock(7)``, Linux 5.13; unprivileged). Stdlib only (ctypes).

``restrict`` builds a ruleset that handles the filesystem's *writing* rights (write, truncate,
create, remove, rename across directories) and allows them beneath the directories it is given:
every other path stays readable and executable, none other writable. From ABI 4 (Linux 6.7) it can
also handle TCP bind and connect with no rule allowing any, and from ABI 6 (Linux 6.12) scope
signals and abstract UNIX sockets to the restricted processes themselves: they cannot signal, or
connect to an abstract socket of, a process outside (the server). A restriction cannot be lifted,
and children inherit it. Where the kernel has no Landlock (or it is off), ``restrict`` returns 0
and nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # one number on every architecture (asm-generic)
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# linux/landlock.h: LANDLOCK_ACCESS_FS_*
WRITE_FILE = 1 << 1
_WRITING_V1 = (WRITE_FILE | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 7 | 1 << 8 | 1 << 9 | 1 << 10 | 1 << 11
               | 1 << 12)  # write; remove dir / file; make char, dir, reg, sock, fifo, block, sym
REFER = 1 << 13  # ABI 2: link or rename a file into another directory
TRUNCATE = 1 << 14  # ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (or it is disabled)."""
    libc = _libc()
    if libc is None:
        return 0
    try:
        v = int(libc.syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION))
    except AttributeError:
        return 0
    return max(v, 0)


def restrict(writable: Sequence[str], writable_files: Sequence[str] = ("/dev/null",), *,
             network: bool = False) -> int:
    """Allow writing only beneath ``writable`` (directories) and to ``writable_files``; with
    ``network`` deny TCP bind and connect (ABI 4); scope signals and abstract UNIX sockets (ABI 6).

    Returns the ABI version the restriction used, or 0 where none was applied. A path that does not
    exist is left out (nothing beneath it is writable)."""
    v, libc = abi(), _libc()
    if v < 1 or libc is None:
        return 0
    fs = _WRITING_V1 | (REFER if v >= 2 else 0) | (TRUNCATE if v >= 3 else 0)
    fields = [fs]
    if v >= 4:
        fields.append(NET_BIND_TCP | NET_CONNECT_TCP if network else 0)
    if v >= 6:
        fields.append(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    attr = struct.pack(f"<{len(fields)}Q", *fields)
    ruleset = int(libc.syscall(_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), 0))
    if ruleset < 0:
        return 0
    try:
        rules = [(p, fs) for p in writable] + [(p, WRITE_FILE | (TRUNCATE if v >= 3 else 0)) for p in writable_files]
        for path, allowed in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = struct.pack("<Qi", allowed, fd)  # struct landlock_path_beneath_attr, packed
                libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0)
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return 0
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            return 0
    finally:
        os.close(ruleset)
    return v
