"""Start ``world_size`` rank processes for one trial, watch them, and leave nothing behind.

Each rank is ``python -m autoslapo.runtime.worker DIR RANK`` in its own session (so a kill of its
process group also takes whatever it forked: compiler jobs, data workers). Ranks meet through a
``TCPStore`` that rank 0 opens on a port the OS picks and announces in ``DIR/port`` (no port race);
each writes its outcome to ``DIR/rank<R>.json``. This module imports no torch: the tuner calls it
in-process and only the ranks pay for torch.

Watching: the launcher polls every rank; it kills all of them (SIGKILL to each process group) when
the deadline passes, when a rank's peak resident memory (``VmHWM``, the kernel's high-water mark,
so a spike between polls is still seen) goes over the memory cap, or a few seconds after a rank
failed while its peers still wait in a collective. A rank killed by SIGKILL is ``oom`` only with
evidence (``autoslapo.runtime.oom``: the cgroup's ``oom_kill`` counter, the kernel's log), else
``failed``; the reason names the evidence. Afterwards it unlinks the ``/dev/shm`` files the
ranks created (torch's ``torch_<pid>_*`` segments, DeepSpeed's ``deepspeed_*_<port>_*`` buffers)
and removes ``DIR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autoslapo import proctree
from autoslapo.errors import ConfigError
from autoslapo.runtime.oom import OomWatch

__all__ = ["LaunchOutcome", "launch"]

Status = Literal["complete", "oom", "failed", "timeout"]
SHM = Path("/dev/shm")
POLL_S = 0.05
#: Every rank of a launch carries its id in this environment variable (``_kill_strays`` finds them by it).
LAUNCH_ID_ENV = "AUTOSLAPO_LAUNCH_ID"
# Messages of collectives whose peer went away (gloo, nccl, the TCP store).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
             "recvBytes", "Socket Timeout")


@dataclass(frozen=True)
class NodeSlice:
    """One machine's part of a job spanning several: global ranks ``rank_offset`` ..
    ``rank_offset + local_ranks - 1`` of ``world_size``, meeting at the store that global rank 0
    serves on ``master_addr:master_port``."""

    rank_offset: int
    local_ranks: int
    world_size: int
    master_addr: str
    master_port: int

    def check(self, world_size: int) -> None:
        """Raise ConfigError unless the slice lies inside a world of ``world_size`` ranks."""
        if not (self.rank_offset >= 0 and self.local_ranks >= 1
                and self.rank_offset + self.local_ranks <= self.world_size == world_size):
            raise ConfigError(
                f"a node's ranks must lie inside the job's world: got ranks {self.rank_offset}.."
                f"{self.rank_offset + self.local_ranks - 1} of {self.world_size} for a world of {world_size}"
            )
        if not 0 < self.master_port < 65536 or not self.master_addr:
            raise ConfigError(f"the rank-0 store needs a host and a port in 1..65535: got "
                              f"{self.master_addr!r}:{self.master_port}")


@dataclass
class LaunchOutcome:
    """What the ranks of one launch gave.

    ``status``: complete (every rank returned), oom, failed or timeout; ``reason``: one line for
    the non-complete ones. ``oom_evidence``: for ``oom``, what showed it (``memory-cap monitor``,
    ``allocator error``, ``cgroup memory.events oom_kill 3 -> 4``, ``kernel log: ...``). ``values``: each rank's return value (``None`` where it gave none).
    ``peak_rss_bytes``: each rank's peak resident memory (0 if unknown). ``elapsed_s``: wall time
    from start to the last rank's exit. ``logs``: the tail of each rank's output. ``launch_id``:
    the value of ``AUTOSLAPO_LAUNCH_ID`` in every rank's environment (to look for strays).
    """

    status: Status
    reason: str
    values: list[Any]
    peak_rss_bytes: list[int]
    elapsed_s: float
    logs: list[str] = field(default_factory=list)
    launch_id: str = ""
    oom_evidence: str = ""


CAP_EVIDENCE = "memory-cap monitor"
ALLOCATOR_EVIDENCE = "allocator error"


def _cap_reason(rank: int, peak: int, cap: int) -> str:
    return (f"out of memory: rank {rank} peak resident memory {peak / 2**20:.0f} MiB went over the cap of "
            f"{cap / 2**20:.0f} MiB (evidence: {CAP_EVIDENCE})")


def signal_name(number: int) -> str:
    """``signal 9 (SIGKILL)``: a signal's number and name."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _hwm_bytes(pid: int) -> int:
    """Peak resident memory of ``pid`` from /proc (0 when it is gone or not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (via /proc/<pid>/task/*/children), best effort."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError, ValueError), open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
    return out


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _last_error_line(log: str) -> str:
    """The last line of a log that looks like an exception, else the last line.

    Python's ``Name: message``, or a C++ exception that aborted the process
    (``terminate called after throwing an instance of 'T'`` + ``what():  message`` -> ``T: message``).
    """
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if ln.startswith("what():"):
            kind = "C++ exception"
            prev = lines[i - 1] if i > 0 else ""
            if "instance of '" in prev:
                kind = prev.split("instance of '", 1)[1].rstrip("'")
            return f"{kind}: {ln[len('what():'):].strip()}"
        head = ln.split(":", 1)[0]
        if head.endswith(("Error", "Exception", "Interrupt")) and " " not in head:
            return ln
    return lines[-1] if lines else ""


def _child_env(device: str, threads: int, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    # The ranks must import exactly what this process imports (tests put their own modules on it), and
    # no more: the working directory only where this process has it on its path ('' for ``python -c``),
    # and ``PYTHONSAFEPATH`` keeps ``python -m`` from putting the ranks' own first, so a file there named
    # like a standard-library module (``copy.py``) does not replace it.
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if os.path.isdir(p)))
    env["PYTHONSAFEPATH"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/autoslapo-torch-ext")
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        # Each rank leads its own session and process group: SIGKILL the group, then the pid in
        # case it already left it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            p.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


def _kill_strays(launch_id: str) -> set[int]:
    """SIGKILL every process that carries this launch's id in its environment (daemons a rank
    started in a session of their own, e.g. torch_shm_manager). Returns their pids."""
    return proctree.kill(None, f"{LAUNCH_ID_ENV}={launch_id}".encode())


#: A launch's scratch folder: ``autoslapo-trial-<launcher pid>-<random>`` under the temporary directory.
TRIAL_DIR_PREFIX = "autoslapo-trial-"


def trial_dirs(root: str | Path | None = None) -> set[str]:
    """The names of the launches' scratch folders under ``root`` (the temporary directory)."""
    try:
        return {n for n in os.listdir(Path(root if root is not None else tempfile.gettempdir()))
                if n.startswith(TRIAL_DIR_PREFIX)}
    except OSError:
        return set()


def sweep_stale_trial_dirs(root: str | Path | None = None, wait_s: float = 0.0,
                           wait_for: set[str] | None = None) -> list[str]:
    """Remove the scratch folders of launches whose launcher died without its clean-up (a Ray
    trial's actor killed by a Ctrl-C of its study, a ``kill -9``), with any process still
    carrying their launch id; returns the folders removed. A folder whose launcher is alive is
    kept (waiting up to ``wait_s`` seconds for the launchers of ``wait_for``'s folders, all when None,
    to end: a study's own, not other studies' live launches). Folders not named by a pid are left."""
    base = Path(root if root is not None else tempfile.gettempdir())
    names = trial_dirs(base)
    owners = {n: int(head) for n in names if (head := n[len(TRIAL_DIR_PREFIX):].split("-", 1)[0]).isdigit()}
    awaited = [p for n, p in owners.items() if wait_for is None or n in wait_for]
    deadline = time.monotonic() + wait_s
    while any(_alive(p) for p in awaited) and time.monotonic() < deadline:
        time.sleep(0.1)
    removed = []
    for name, pid in owners.items():
        if _alive(pid):
            continue
        _kill_strays(name)
        shutil.rmtree(base / name, ignore_errors=True)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive, not ours to judge
        return True
    # a zombie (exited, not yet reaped) is gone for this purpose
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _shm_names() -> set[str]:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return set()


def _clean_shm(before: set[str], pids: set[int], port: str | None) -> list[str]:
    """Unlink /dev/shm entries that appeared during the launch and belong to its ranks."""
    removed = []
    for name in _shm_names() - before:
        ours = any(name.startswith(f"torch_{pid}_") or f"_{pid}_" in name for pid in pids)
        if port and name.startswith("deepspeed") and f"_{port}" in name:
            ours = True
        if ours:
            with contextlib.suppress(OSError):
                (SHM / name).unlink()
                removed.append(name)
    return removed


def launch(
    entry: str,
    world_size: int,
    payload: dict[str, Any] | None = None,
    *,
    timeout_s: float,
    mem_cap_bytes: int | None = None,
    device: str = "cpu",
    threads: int | None = None,
    grace_s: float = 5.0,
    env: dict[str, str] | None = None,
    node: NodeSlice | None = None,
) -> LaunchOutcome:
    """Run ``entry`` (``"package.module:function"``) on ``world_size`` fresh processes.

    Takes: the entry, called on each rank as ``fn(ctx, payload)`` with an initialized default
    process group (see ``autoslapo.runtime.worker``); a JSON-safe payload; the wall-clock limit;
    an optional per-rank cap on peak resident memory; ``device`` "cpu" (gloo) or "cuda" (nccl, one
    GPU per rank); threads per rank (default: this machine's cores shared out, at least 1); how
    long peers of a failed rank may linger; extra environment; ``node``: this machine's part of a
    job that spans several (its ranks, the whole world and the rank-0 store's address), else the
    whole job runs here (``world_size`` ranks, a store on localhost).
    Returns: a LaunchOutcome for the ranks started here; never raises for what happens in them.
    Raises: ConfigError for a bad world size, device, entry or node slice.
    """
    if node is not None:
        node.check(world_size)
        world_size = node.local_ranks
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a positive integer: got {world_size!r}")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda: got {device!r}")
    if ":" not in entry:
        raise ConfigError(f"entry must be 'module:function': got {entry!r}")
    if mem_cap_bytes is not None and mem_cap_bytes <= 0:
        raise ConfigError(f"mem_cap_bytes must be positive: got {mem_cap_bytes}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    offset = node.rank_offset if node is not None else 0
    sweep_stale_trial_dirs()  # what a killed launcher left (cheap: one listing of the temporary directory)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TRIAL_DIR_PREFIX}{os.getpid()}-"))
    shm_before = _shm_names()
    watch = OomWatch()
    procs: list[subprocess.Popen[bytes]] = []
    seen_pids: set[int] = set()
    start = time.monotonic()
    deadline = start + timeout_s
    status: Status | None = None
    reason = ""
    peaks = [0] * world_size
    exit_at: list[float | None] = [None] * world_size  # epoch time each rank was first seen gone
    port: str | None = None
    codes: list[int | None] = [None] * world_size
    kernel = ""
    try:
        request = {
            "entry": entry,
            "payload": payload or {},
            "world_size": node.world_size if node is not None else world_size,
            "rank_offset": offset,
            "local_world_size": world_size,
            "master": [node.master_addr, node.master_port] if node is not None else None,
            "device": device,
            "threads": threads,
            "timeout_s": timeout_s,
        }
        (tmp / "request.json").write_text(json.dumps(request))
        child_env = _child_env(device, threads, env)
        child_env[LAUNCH_ID_ENV] = tmp.name
        for rank in range(offset, offset + world_size):
            log = open(tmp / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed right after Popen
            try:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "autoslapo.runtime.worker", str(tmp), str(rank)],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=child_env,
                        start_new_session=True,
                    )
                )
            finally:
                log.close()
        failed_at: float | None = None
        while True:
            now = time.monotonic()
            for p in procs:
                seen_pids.update(_tree_pids(p.pid))
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c is not None and exit_at[r] is None:
                    exit_at[r] = time.time()
            for r, p in enumerate(procs):
                if codes[r] is None:
                    peaks[r] = max(peaks[r], _hwm_bytes(p.pid))
            if mem_cap_bytes is not None:
                over = [r for r in range(world_size) if peaks[r] > mem_cap_bytes]
                if over:
                    r = over[0]
                    status, reason = "oom", _cap_reason(r, peaks[r], mem_cap_bytes)
                    break
            if all(c is not None for c in codes):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            if failed_at is not None and now - failed_at > grace_s:
                break  # a rank died; its peers are stuck in a collective
            if now > deadline:
                status = "timeout"
                reason = f"trial did not finish within its timeout of {timeout_s:g} s"
                break
            time.sleep(POLL_S)
        elapsed = time.monotonic() - start
        with contextlib.suppress(OSError):
            port = (tmp / "port").read_text().strip() or None
    finally:
        _kill_all(procs)
        seen_pids |= _kill_strays(tmp.name)
        _clean_shm(shm_before, seen_pids, port)
        results: list[dict[str, Any] | None] = []
        logs: list[str] = []
        for rank in range(offset, offset + world_size):
            try:
                results.append(json.loads((tmp / f"rank{rank}.json").read_text()))
            except (OSError, ValueError):
                results.append(None)
            logs.append(_tail(tmp / f"rank{rank}.log"))
        shutil.rmtree(tmp, ignore_errors=True)
        # The kernel's word is read only when a rank died of SIGKILL (the one case it decides).
        if status is None and any(c == -signal.SIGKILL for c in codes):
            kernel = watch.evidence({p.pid for p in procs})
        watch.close()
    for r, res in enumerate(results):
        if res is not None:
            peaks[r] = max(peaks[r], int(res.get("peak_rss_bytes") or 0))
    values = [res.get("value") if res is not None and res.get("status") == "ok" else None for res in results]
    evidence = CAP_EVIDENCE if status == "oom" else ""
    if status is None:
        # Exit codes as seen before the final kill: a rank without a code was killed by us.
        status, reason, evidence = _classify(results, logs, codes, peaks, mem_cap_bytes, exit_at, kernel)
    return LaunchOutcome(status, reason, values, peaks, elapsed, logs, tmp.name, evidence)


def is_peer_lost(text: str) -> bool:
    """True when an error text says a rank lost its peers (the effect of another rank's failure)."""
    return any(m in text for m in PEER_LOST)


def _classify(
    results: list[dict[str, Any] | None],
    logs: list[str],
    codes: list[int | None],
    peaks: list[int],
    mem_cap_bytes: int | None,
    exit_at: list[float | None] | None = None,
    kernel_evidence: str = "",
) -> tuple[Status, str, str]:
    """Status, reason and out-of-memory evidence once every rank has stopped (or the survivors
    were killed).

    ``oom`` needs evidence: a rank's own out-of-memory error (the allocator's), a peak over the
    memory cap, or, for a rank killed by SIGKILL, ``kernel_evidence`` (what ``OomWatch`` saw:
    the cgroup's oom_kill counter, the kernel's log). A SIGKILL without it is ``failed``: the
    signal may as well come from a scheduler or an operator.

    The reason is the root cause's: when one rank fails, its peers fail next on a broken
    connection ("Connection reset by peer"), so a rank's own error comes before a lost peer, and
    a rank that died without writing a result (a C++ abort such as gloo's "collective mismatch",
    a segfault) is a cause too: its peers' socket errors are only what its death did to them.
    Within a kind the earliest (time of the error, or of the exit) wins.
    """
    exit_at = exit_at or [None] * len(results)
    errors = [(r, res) for r, res in enumerate(results) if res is not None and res.get("status") != "ok"]
    ooms = [(r, res) for r, res in errors if res.get("status") == "oom"]
    if ooms:
        r, res = ooms[0]
        return ("oom", f"out of memory: rank {r}: {res.get('error', 'out of memory')} "
                f"(evidence: {ALLOCATOR_EVIDENCE})", ALLOCATOR_EVIDENCE)
    if mem_cap_bytes is not None:
        for r, peak in enumerate(peaks):
            if peak > mem_cap_bytes:
                return "oom", _cap_reason(r, peak, mem_cap_bytes), CAP_EVIDENCE
    # Candidates: (kind, time, status, reason); kind 0 = an error of the rank's own, 1 = a lost peer.
    causes: list[tuple[int, float, Status, str]] = []
    for r, res in errors:
        text = str(res.get("error", "unknown error"))
        causes.append((int(is_peer_lost(text)), float(res.get("time", 0.0)), "failed", f"rank {r}: {text}"))
    for r, maybe in enumerate(results):
        code = codes[r]
        if maybe is not None or code is None:
            continue  # a result, or killed by us (below)
        seen = exit_at[r]
        when = float("inf") if seen is None else seen
        if code == -signal.SIGKILL:
            if kernel_evidence:
                causes.append((0, when, "oom", f"out of memory: rank {r} was killed by {signal_name(9)} "
                                                f"(evidence: {kernel_evidence})"))
            else:
                causes.append((0, when, "failed",
                               f"rank {r} was killed by {signal_name(9)}, no out-of-memory evidence"))
            continue
        why = _last_error_line(logs[r])
        how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
        text = f"rank {r} {how} without a result" + (f": {why}" if why else "")
        causes.append((int(is_peer_lost(why)), when, "failed", text))
    if causes:
        _, _, status, reason = min(causes, key=lambda c: (c[0], c[1]))
        return status, reason, kernel_evidence if status == "oom" else ""
    # The rest were killed by us before they gave a result.
    missing = [r for r, res in enumerate(results) if res is None]
    if missing:
        return "failed", f"rank {missing[0]} gave no result before the launch ended", ""
    return "complete", "", ""
