"""A running study's heartbeat: while a tuner runs a study, it marks the study alive every
``HEARTBEAT_S`` seconds (the study row's ``updated_at``), so that ``studies`` and ``show`` tell a
study whose tuner was killed (``kill -9``, a lost machine: its status still reads ``running``)
from one being tuned (``autoslapo.storage.silent_for``).

The beat touches only a study still ``running`` (``Store.set_study_status(..., only_from=...)``):
a study stopped or cancelled meanwhile is never set running again. A store that does not answer
is the tuner's to report (its next write fails); the heartbeat skips that beat. An in-memory
store has no heartbeat: no other process can read it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoslapo.errors import StorageError
from autoslapo.storage import HEARTBEAT_S

if TYPE_CHECKING:
    from store import Store


@contextlib.contextmanager
def heartbeat(store: Store, study: str, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Mark ``study`` alive every ``every_s`` seconds while the block runs; stops (and waits for a
    beat in progress) before the block's exit goes on, so no beat follows the study's last status."""
    if store.in_memory:  # no other process sees it (and its one connection is not for two threads)
        yield
        return
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            with contextlib.suppress(StorageError):
                store.set_study_status(study, "running", only_from="running")

    thread = threading.Thread(target=beat, name=f"autoslapo-heartbeat-{study}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
