"""Workers: claim a queued study job under a lease, keep the lease alive, run the study as `autoslapo tune` does.

A worker that dies (``kill -9``) stops heartbeating; once its lease lapses another worker claims
the job and resumes the study from the store (``TuneOptions(resume=True)``), so the study still
ends at exactly its budget. A cancel request is seen by the heartbeat and stops the study
between two trials; the store is asked once more when a run ends, so a cancel that came after the
heartbeat last looked ends the job cancelled (its study stopped), not complete. A join that raises a queued or running job's budget (``JobQueue.raise_budget``)
is seen when the study reaches the budget it ran to: the worker resumes it to the new one instead
of ending the job. A study of a model file (code) runs only on a worker started with
``--allow-module-files``: it writes the file into the model cache by digest and traces it in a
child process (``autoslapo.service.modfile``), then tunes as ``autoslapo tune my_model.py`` does;
a worker without the flag gives such a job back to the queue, noting the flag it waits for.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from autoslapo.errors import AutoslapoError, UsageError
from autoslapo.models.modcache import max_age_days
from autoslapo.models.modcache import prune as prune_model_cache
from autoslapo.redact import redact
from autoslapo.service.jobs import StudyRequest
from autoslapo.service.modfile import ALLOW_FLAG, TRACE_TIMEOUT_S, trace_memory_bytes
from autoslapo.service.payload import is_module_file, model_spec_of
from store import JobRecord, Store
from tuner import tune

LEASE_S = 30.0
POLL_S = 1.0
#: The shortest lease: the heartbeat renews the claim every third of it, and each renewal is a write to
#: the store that must land well inside the lease (a busy database takes tens to hundreds of ms).
MIN_LEASE_S = 1.0


def check_lease(lease_s: float) -> None:
    """Refuse a lease the heartbeat cannot keep (one-line UsageError with the rule, the value, the fix)."""
    if not lease_s >= MIN_LEASE_S:  # nan too
        raise UsageError(f"--lease must be at least {MIN_LEASE_S:g} s (the heartbeat renews the claim every third "
                         f"of it, a write to the store each time): got {lease_s:g}; leave it out for "
                         f"{LEASE_S:g}, or give {MIN_LEASE_S:g} or more")


class Cancelled(Exception):
    """Raised from the progress callback to stop a study between trials (never leaves the worker)."""


class Worker:
    """Runs jobs from one store until ``stop()`` (or, with ``once``, after one job).

    ``max_running``: claim nothing while that many jobs of the store run (a server-wide limit,
    given to every worker of the server). ``allow_module_files``: run studies of a model file (code;
    traced in a child process for at most ``module_timeout_s``).
    """

    def __init__(self, store: Store, *, lease_s: float = LEASE_S, poll_s: float = POLL_S,
                 name: str | None = None, max_running: int | None = None, allow_module_files: bool = False,
                 module_timeout_s: float = TRACE_TIMEOUT_S, log: Callable[[str], None] | None = None) -> None:
        if not (lease_s > 0 and poll_s > 0):  # nan too
            raise UsageError(f"--lease and --poll must be positive seconds: got {lease_s}, {poll_s}")
        check_lease(lease_s)
        if max_running is not None and max_running < 1:
            raise UsageError(f"--max-running must be at least 1: got {max_running}; leave it out for no limit")
        if allow_module_files:
            trace_memory_bytes()  # a bad $AUTOSLAPO_TRACE_MEMORY_MIB is refused at start, not on each job
            max_age_days()  # likewise $AUTOSLAPO_MODEL_CACHE_DAYS
        self.max_running = max_running
        self.allow_module_files = allow_module_files
        self.module_timeout_s = module_timeout_s
        self.log = log or (lambda _line: None)  # what the worker does, one line an event (`autoslapo worker`: stderr)
        self.store = store
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{id(self) & 0xFFFF:x}"
        self._stop = threading.Event()
        self._skip: set[int] = set()  # jobs given back (a model file without the flag): not claimed again

    def stop(self) -> None:
        """Ask the loop to end after the current job (or at once when idle)."""
        self._stop.set()

    def run(self, *, once: bool = False) -> int:
        """Claim and run jobs; returns how many ran."""
        ran = 0
        while not self._stop.is_set():
            job = self.store.jobs.claim(self.name, self.lease_s, max_running=self.max_running, skip=self._skip)
            if job is None:
                if once:
                    return ran
                self._stop.wait(self.poll_s)
                continue
            self.log(self.claimed_line(job))
            status = self.run_job(job)
            now = self.store.jobs.get(job.study)
            self.log(f"study {job.study!r}: {status}" + (f": {now.error}" if now is not None and now.error else ""))
            if status == "released":
                continue  # left to a worker that can run it; take the next job
            ran += 1
            if once:
                return ran
        return ran

    def claimed_line(self, job: JobRecord) -> str:
        """The log line of a claim: the study, its budget and, from its second attempt, why it runs
        again: queued again by a resume or a join (its request says so, and its study ended), or
        taken over from a worker whose lease lapsed (its study still reads running, or never began)."""
        trials = job.request.get("trials")
        line = f"claimed study {job.study!r}: {trials} trial{'' if trials == 1 else 's'} of {job.request.get('backend')}"
        if job.attempts <= 1:
            return line
        study = self.store.get_study(job.study) if self.store.has_study(job.study) else None
        asked = (job.request.get("resume") or job.request.get("join")) and (study is None or study.status != "running")
        why = "resumed at its owner's request" if asked else "taken over from a worker that stopped"
        return f"{line}, attempt {job.attempts} ({why})"

    def run_job(self, job: JobRecord) -> str:
        """Run (or resume) one claimed job to its end; returns the job's final status, or "released"
        when this worker cannot run it (a model file, without ``--allow-module-files``): the job goes
        back to the queue, noting why, for a worker that has the flag."""
        if not self.allow_module_files and is_module_file(job.request.get("model")):
            self._skip.add(job.id)
            self.store.jobs.release(job.id, self.name, f"waiting for a worker started with {ALLOW_FLAG}: study "
                                    f"{job.study!r} tunes a model file (code), which worker {self.name} runs none of")
            return "released"
        cancel = threading.Event()
        lost = threading.Event()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.lease_s / 3):
                try:
                    held, asked = self.store.jobs.heartbeat(job.id, self.name, self.lease_s)
                except AutoslapoError:
                    continue  # the database hiccuped: try again before the lease lapses
                if asked:
                    cancel.set()
                if not held:
                    lost.set()

        def progress(_: Any) -> None:
            if cancel.is_set() or lost.is_set():
                raise Cancelled

        if job.cancel_requested:
            return self._finish(job, "cancelled", "")
        heart = threading.Thread(target=beat, name=f"heartbeat-{job.study}", daemon=True)
        heart.start()
        try:
            request = StudyRequest(**job.request)
            if is_module_file(request.model):
                model_spec_of(request.model, timeout_s=self.module_timeout_s)  # written to the cache, traced apart
            while True:
                options = request.to_options(name=job.study, resume=self.store.has_study(job.study))
                outcome = tune(options, self.store, progress=progress)
                if self._cancel_asked(job, cancel):  # asked after the last trial or tick: honoured, not lost
                    raise Cancelled
                if outcome.stop_reason not in ("budget", "swept"):  # a sweep's budget: the best it stores
                    return self._finish(job, "complete" if outcome.stop_reason == "exhausted" else "stopped", "")
                if self.store.jobs.finish(job.id, self.name, "complete", budget=request.trials):
                    return self._finished(job, "complete")
                # a join raised the budget meanwhile: go on to it, as the job's owner asked
                now = self.store.jobs.get(job.study)
                if (now is None or now.worker != self.name or now.status != "running"
                        or int(now.request.get("trials") or 0) <= request.trials):
                    return "lost"
                request = StudyRequest(**now.request)
        except Cancelled:
            if lost.is_set() and not cancel.is_set():
                return "lost"  # another worker holds the job now; leave it to them
            self.store.set_study_status(job.study, "stopped")
            return self._finish(job, "cancelled", "")
        except AutoslapoError as err:
            return self._finish(job, "failed", redact(str(err)).splitlines()[0])
        except Exception as err:  # a bug must not kill the worker: the job fails with one line
            first = (str(err).splitlines() or [""])[0]
            return self._finish(job, "failed", redact(f"{type(err).__name__}: {first}"))
        finally:
            done.set()
            heart.join(timeout=5)

    def _cancel_asked(self, job: JobRecord, cancel: threading.Event) -> bool:
        """Whether a cancel of ``job`` was asked: seen by the heartbeat (every third of the lease), or
        in the store now, since the heartbeat last looked (a run can end in between)."""
        if cancel.is_set():
            return True
        now = self.store.jobs.get(job.study)
        if now is not None and now.id == job.id and now.cancel_requested:
            cancel.set()
        return cancel.is_set()

    def _finish(self, job: JobRecord, status: str, error: str) -> str:
        if self.store.has_study(job.study) and status in ("failed", "cancelled"):
            study = self.store.get_study(job.study)
            if study.status == "running":
                self.store.set_study_status(job.study, "failed" if status == "failed" else "stopped")
        self.store.jobs.finish(job.id, self.name, status, error)
        return self._finished(job, status)

    def _finished(self, job: JobRecord, status: str) -> str:
        if self.allow_module_files:
            prune_model_cache()  # files no study has used for $AUTOSLAPO_MODEL_CACHE_DAYS
        return status

