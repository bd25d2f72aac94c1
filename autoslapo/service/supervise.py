"""``autoslapo serve --workers N``: keep N worker processes running while the server runs.

A worker that dies (a crash, the OOM killer, ``kill -9``) is started again, so queued jobs do not
wait for another worker: after 1 s, then a back-off that doubles with each death in a row (a
death within ``healthy_s`` of its start) up to ``max_backoff_s``. After ``max_quick_deaths``
quick deaths in a row its slot is given up (a worker that cannot start, say a broken store, would
otherwise be restarted forever), saying so. A worker that stopped when asked (exit code 0, or
SIGTERM/SIGINT: ``kill PID``, a Ctrl-C that reached it as well as the server) is not started again.
Each death, stop and restart is one line on the log: which worker, its pid, and its exit code.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CHECK_S = 0.5
ASKED_TO_STOP = (0, -signal.SIGTERM, -signal.SIGINT)  # exit codes of a worker that stopped when asked
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
HEALTHY_S = 60.0  # a worker that ran this long before it died starts its back-off over
MAX_QUICK_DEATHS = 10


@dataclass
class _Slot:
    proc: subprocess.Popen[bytes] | None
    started_at: float
    quick_deaths: int = 0
    restart_at: float | None = None
    given_up: bool = False


def exit_text(code: int) -> str:
    """``exit code 3``, or ``exit code -9 (SIGKILL)`` for a process a signal ended."""
    if code < 0:
        try:
            return f"exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exit code {code}"


class Supervisor:
    """``count`` processes made by ``start()``, each restarted (with back-off, a bounded number of
    times in a row) when it dies, until ``stop()``; ``log`` gets one line an event."""

    def __init__(self, count: int, start: Callable[[], subprocess.Popen[bytes]], *, log: Callable[[str], None],
                 check_s: float = CHECK_S, first_backoff_s: float = FIRST_BACKOFF_S,
                 max_backoff_s: float = MAX_BACKOFF_S, healthy_s: float = HEALTHY_S,
                 max_quick_deaths: int = MAX_QUICK_DEATHS, clock: Callable[[], float] = time.monotonic) -> None:
        self.count, self._start, self.log, self.check_s = count, start, log, check_s
        self.first_backoff_s, self.max_backoff_s, self.healthy_s = first_backoff_s, max_backoff_s, healthy_s
        self.max_quick_deaths, self.clock = max_quick_deaths, clock
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._timeout_s = 10.0

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The processes running now (one a slot that is not waiting to restart or given up)."""
        with self._lock:
            return [s.proc for s in self._slots if s.proc is not None]

    def start(self) -> None:
        """Start the processes and the thread that watches them."""
        with self._lock:
            self._slots = [_Slot(self._start(), self.clock()) for _ in range(self.count)]
        if self.count:
            self._thread = threading.Thread(target=self._watch, name="autoslapo-supervisor", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        try:
            while not self._stopped.wait(self.check_s):
                self.check()
        finally:
            # From this thread, which forked the restarted processes: Linux sends a child's parent-death
            # signal (``serve``'s PR_SET_PDEATHSIG, SIGKILL) when the thread that forked it ends, so
            # they are stopped (SIGTERM, their graceful stop) before it does.
            self._terminate_all()

    def check(self) -> None:
        """One look: note the processes that died (and when to restart each), restart those due."""
        with self._lock:
            if self._stopped.is_set():
                return
            now = self.clock()
            for number, slot in enumerate(self._slots, start=1):
                if slot.proc is not None and slot.proc.poll() is not None:
                    self._died(number, slot, slot.proc, now)
                if slot.proc is None and slot.restart_at is not None and now >= slot.restart_at:
                    try:
                        proc = self._start()
                    except Exception as exc:  # fork or exec failed (EAGAIN, EMFILE): try again later
                        slot.started_at = now
                        self._back_off(number, slot, now, f"worker {number} could not be started again "
                                                          f"({type(exc).__name__}: {exc})")
                        continue
                    slot.proc, slot.started_at, slot.restart_at = proc, now, None
                    self.log(f"worker {number} restarted as pid {slot.proc.pid}")

    def _died(self, number: int, slot: _Slot, proc: subprocess.Popen[bytes], now: float) -> None:
        slot.proc = None
        if proc.returncode in ASKED_TO_STOP:
            slot.given_up = True
            self.log(f"worker {number} (pid {proc.pid}) stopped when asked ({exit_text(int(proc.returncode))}): "
                     "not restarted; restart the server for it")
            return
        self._back_off(number, slot, now, f"worker {number} (pid {proc.pid}) died with {exit_text(int(proc.returncode))}")

    def _back_off(self, number: int, slot: _Slot, now: float, what: str) -> None:
        """Schedule ``slot``'s restart after a back-off (or give it up after too many quick deaths)."""
        slot.quick_deaths = slot.quick_deaths + 1 if now - slot.started_at < self.healthy_s else 1
        if slot.quick_deaths > self.max_quick_deaths:
            slot.given_up = True
            self.log(f"{what}, its {slot.quick_deaths}th death within {self.healthy_s:g} s of its start in a row: "
                     f"not restarted again; see its error above, fix it and restart the server")
            return
        delay = min(self.max_backoff_s, self.first_backoff_s * 2 ** (slot.quick_deaths - 1))
        slot.restart_at = now + delay
        self.log(f"{what}; restarting it in {delay:g} s (restart {slot.quick_deaths} in a row of at most "
                 f"{self.max_quick_deaths})")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop watching (nothing is restarted after this), then terminate the processes (killed after
        ``timeout_s``) and wait for them: the watching thread does, for those it started."""
        self._timeout_s = timeout_s
        self._stopped.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=3 * timeout_s)
        self._terminate_all()  # no thread, or one that did not finish in time

    def _terminate_all(self) -> None:
        with self._lock:
            procs = [s.proc for s in self._slots if s.proc is not None and s.proc.poll() is None]
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=self._timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=self._timeout_s)
