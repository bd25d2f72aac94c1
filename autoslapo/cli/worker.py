"""``autoslapo worker``: claim study jobs the service queued and run them as ``autoslapo tune`` does."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import time
from types import FrameType

DAY_S = 86400.0


def _log(name: str, line: str) -> None:
    """A worker's event on stderr: ``12:03:07 autoslapo worker HOST:PID:ID: claimed study 'x' ...``."""
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} autoslapo worker {name}: {line}\n")
    sys.stderr.flush()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo worker``."""
    parser.add_argument("--storage", default=None, help="store URL (default $AUTOSLAPO_STORAGE or sqlite:///autoslapo.db)")
    parser.add_argument("--lease", type=float, default=30.0,
                        help="seconds a claim holds without a heartbeat; a dead worker's job is resumed after it "
                             "(default 30)")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between looks for work when idle (default 1)")
    parser.add_argument("--max-running", type=int, default=None, metavar="N",
                        help="claim nothing while N jobs of the store run (a server-wide limit; default none)")
    parser.add_argument("--allow-module-files", action="store_true",
                        help="run studies of a model file (.py: code) sent to the service; traced in a child process")
    parser.add_argument("--once", action="store_true", help="run at most one job, then exit")


def run(args: argparse.Namespace) -> int:
    """Run jobs until SIGTERM/SIGINT (the current job finishes its trial and is resumed later)."""
    from autoslapo.errors import UsageError
    from autoslapo.service.worker import Worker, check_lease
    from store import open_store

    if not (0 < args.lease <= DAY_S and 0 < args.poll <= DAY_S):  # nan, inf and 1e300 crashed it at its first job
        raise UsageError(f"--lease and --poll must be positive seconds, at most a day ({DAY_S:g}): got {args.lease}, "
                         f"{args.poll}; the defaults are 30 and 1")
    check_lease(args.lease)
    if args.max_running is not None and args.max_running < 1:
        raise UsageError(f"--max-running must be at least 1: got {args.max_running}; leave it out for no limit")
    store = open_store(args.storage)
    worker = Worker(store, lease_s=args.lease, poll_s=args.poll, max_running=args.max_running,
                    allow_module_files=args.allow_module_files)
    worker.log = functools.partial(_log, worker.name)

    def stop(_sig: int, _frame: FrameType | None) -> None:
        worker.stop()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    sys.stderr.write(f"autoslapo worker {worker.name}: waiting for jobs in {store.url}\n")
    try:
        worker.run(once=args.once)
    except KeyboardInterrupt:
        return 0
    finally:
        store.close()
    return 0
