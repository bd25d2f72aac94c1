"""The server-sent events of one study: each launched trial once it ended, then ``done``.

Polls the store (the worker that runs the study may be another process); a quiet stream gets a
comment every ``EVENTS_PING_S`` so proxies keep it open. The caller's token is checked again at
least every ``EVENTS_AUTH_S``: once it is revoked the stream ends with an ``error`` event.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from autoslapo.service.views import LAUNCHED, study_family, study_view, trial_view
from store import Store

__all__ = ["EVENTS_AUTH_S", "EVENTS_PING_S", "sse", "study_events"]

EVENTS_PING_S = 15.0
EVENTS_AUTH_S = 1.0  # with the token cache's 5 s, a revoked token's stream ends within 5 s (README)


def sse(event: str, data: Any) -> str:
    """One server-sent event: its name and one line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def study_events(store: Store, name: str, poll_s: float, *, server: str | None = None,
                 refused: Callable[[], str | None] = lambda: None) -> Iterator[str]:
    """Poll the store every ``poll_s``: each launched trial once it ended, then ``done`` when the study
    ended (``server``: this service's URL, for its ``apply_best`` line). ``refused`` is asked at least
    every ``EVENTS_AUTH_S``: a message (the caller's token no longer valid) ends the stream with an
    ``error`` event saying it."""
    sent: set[int] = set()
    quiet_since = time.monotonic()
    while True:
        message = refused()  # each pass, at most EVENTS_AUTH_S apart (a token trusted from memory: cheap)
        if message is not None:
            yield sse("error", {"error": message})
            return
        job = store.jobs.get(name)
        study = store.get_study(name) if store.has_study(name) else None
        # Read the status before the trials: a study seen ended has all its trials stored.
        doc = study_view(store, study, job, trials=[])
        ended = doc["status"] not in ("queued", "running")
        trials = store.trials(name) if study is not None else []
        for t in sorted(trials, key=lambda t: t.number):
            if t.number not in sent and t.status in LAUNCHED:
                sent.add(t.number)
                quiet_since = time.monotonic()
                yield sse("trial", trial_view(t, study_family(study)))
        if ended:
            yield sse("done", study_view(store, study, job, trials=trials, server=server))
            return
        if time.monotonic() - quiet_since > EVENTS_PING_S:
            quiet_since = time.monotonic()
            yield ": ping\n\n"  # a comment: keeps proxies from closing a quiet stream
        time.sleep(min(poll_s, EVENTS_AUTH_S))  # a poll_s above EVENTS_AUTH_S still rechecks the token
