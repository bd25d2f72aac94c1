"""``autoslapo serve``: the HTTP API and web page over the store, optionally with worker processes.

Binds 127.0.0.1 unless ``--host`` says otherwise. ``--workers N`` starts N ``autoslapo worker``
processes on the same store and stops them when the server stops; on Linux they are killed when the
server dies, ``kill -9`` included (no orphan keeps running a job it then holds a lease on: after
the lease a restarted server's workers resume it). A worker that dies while the server runs is
started again, with a back-off, a bounded number of times in a row (``autoslapo.service.supervise``),
each death logged with its exit code. Without ``--workers``, run workers apart.
Those workers run at a lower CPU priority (nice +10) than the server: a study's CPU-heavy trials
then wait for the API's answers on a busy machine rather than the other way round.
``--max-running N`` is handed to those workers (run separate workers with the same flag);
``--max-queued-per-token N`` answers 429 to a token's submission beyond N queued/running studies.
``--allow-module-files`` accepts a user's model file (.py, code) as a request's model: traced in a
child process, never imported by the server; handed to its workers (give separate workers the flag).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo serve``."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8321, help="port (default 8321; 0 picks a free one)")
    parser.add_argument("--storage", default=None, help="store URL (default $AUTOSLAPO_STORAGE or sqlite:///autoslapo.db)")
    parser.add_argument("--workers", type=int, default=0, help="worker processes to start with the server (default 0)")
    parser.add_argument("--allow-anonymous-read", action="store_true", help="GET endpoints and pages without a token")
    parser.add_argument("--allow-local", action="store_true",
                        help="accept studies with backend local (trials run on the server's machine)")
    parser.add_argument("--allow-module-files", action="store_true",
                        help="accept a model file (.py: code) as a request's model; it is traced in a child process, "
                             "never imported by the server (its --workers get the flag too)")
    parser.add_argument("--max-running", type=int, default=None, metavar="N",
                        help="at most N studies run at once (its --workers claim nothing more; others stay queued)")
    parser.add_argument("--max-queued-per-token", type=int, default=None, metavar="N",
                        help="a token with N queued or running studies gets 429 on POST /v1/studies (default none)")
    parser.add_argument("--max-body", type=int, default=64 * 1024, help="largest request body in bytes (default 64 KiB)")


def _prctl() -> Any:
    """Linux's prctl, looked up in the server (None elsewhere): a worker started again while the
    server's threads run calls it between fork and exec, where no import or dlopen is safe."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def _die_with(parent: int, prctl: Any) -> None:
    """In a worker child, before exec: ask Linux for SIGKILL when the server dies (by any signal)."""
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the server died before the request took effect
        os._exit(1)


def _check_bind(host: str, port: int) -> int:
    """UsageError when ``host:port`` cannot be listened on (an unknown host, a port in use): uvicorn
    said so only after `serve` had announced the address and started its workers."""
    import errno
    import socket

    from autoslapo.errors import UsageError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as err:
        raise UsageError(f"--host must name an address of this machine: got {host!r} ({err}); "
                         "use 127.0.0.1, 0.0.0.0 or one of its addresses") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as err:
            if err.errno == errno.EADDRNOTAVAIL:  # an address, but not one of this machine's
                raise UsageError(f"--host must name an address of this machine: got {host!r} ({err.strerror}); "
                                 "use 127.0.0.1, 0.0.0.0 or one of its addresses") from None
            raise UsageError(f"serve must listen on a free port: {host}:{port} cannot be bound ({err.strerror}); "
                             "pick another --port, or stop what listens there") from None
        return int(probe.getsockname()[1])  # --port 0: the free one picked, announced and served


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns 0."""
    import uvicorn

    from autoslapo.errors import UsageError
    from autoslapo.service import ServiceSettings, create_app
    from autoslapo.service.supervise import Supervisor
    from store import open_store

    wrong = [f"{flag} must be {rule}: got {value}" for flag, value, ok, rule in (
        ("--workers", args.workers, args.workers >= 0, "0 or more"),
        ("--port", args.port, 0 <= args.port < 65536, "0-65535 (0 picks a free one)"),
        ("--max-body", args.max_body, args.max_body >= 1, "at least 1 byte")) if not ok]
    if wrong:  # only the flags that are wrong, each with its rule and value
        raise UsageError("; ".join(wrong))
    for flag, value in (("--max-running", args.max_running), ("--max-queued-per-token", args.max_queued_per_token)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1: got {value}; leave it out for no limit")
    args.port = _check_bind(args.host, args.port)  # before the workers start and the address is announced
    store = open_store(args.storage)
    settings = ServiceSettings(allow_anonymous_read=args.allow_anonymous_read, allow_local=args.allow_local,
                               max_body_bytes=args.max_body, max_queued_per_token=args.max_queued_per_token,
                               allow_module_files=args.allow_module_files)
    command = [sys.executable, "-m", "autoslapo", "worker"]
    if args.storage:
        command += ["--storage", args.storage]
    if args.max_running is not None:
        command += ["--max-running", str(args.max_running)]
    if args.allow_module_files:
        command.append("--allow-module-files")
    # uvicorn re-raises the SIGTERM it shut down on, with the handler it found: the default one
    # would end the process here and skip the `finally` below, leaving the workers orphaned.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    server, prctl = os.getpid(), _prctl()

    def start_worker() -> subprocess.Popen[bytes]:
        worker = subprocess.Popen(command, preexec_fn=lambda: _die_with(server, prctl))
        _lower_priority(worker.pid)
        return worker

    workers = Supervisor(args.workers, start_worker, log=_log)  # a worker that dies is started again
    try:
        workers.start()
        sys.stderr.write(f"autoslapo serve: http://{args.host}:{args.port}/ over {store.url}, "
                         f"{args.workers} worker(s)\n")
        uvicorn.run(create_app(store, settings), host=args.host, port=args.port, log_level="warning")
    finally:
        workers.stop()
        store.close()
    return 0


def _log(line: str) -> None:
    """A supervisor's event on stderr: ``12:03:07 autoslapo serve: worker 1 (pid 4242) died with ...``."""
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} autoslapo serve: {line}\n")
    sys.stderr.flush()


WORKER_NICE = 10


def _lower_priority(pid: int) -> None:
    """Give a worker process ``WORKER_NICE`` more niceness than the server (best effort: a system
    that refuses leaves it at the server's priority)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICE))


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
