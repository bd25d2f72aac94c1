"""Bodies of the writer processes in test_concurrency (spawned, so importable by module path)."""

from __future__ import annotations

import random

from store import DuplicateTrial, open_store
from tests.store.conftest import config, result


def write_trials(url: str, worker: int, shared: int, own: int, claims: int) -> dict[str, object]:
    """Run ``_write`` and return its outcome, or the error as text (a failure must not hang the pool)."""
    try:
        return {"won": _write(url, worker, shared, own, claims), "error": None}
    except BaseException as err:
        import traceback

        return {"won": [], "error": f"worker {worker}: {err!r}\n{traceback.format_exc()}"}


def _write(url: str, worker: int, shared: int, own: int, claims: int) -> list[int]:
    """Write the shared trials (all workers, shuffled), this worker's own ones, and race for claims."""
    rng = random.Random(worker)
    won: list[int] = []
    with open_store(url) as db:
        db.create_study("race", exist_ok=True, **_study())
        numbers = list(range(shared))
        rng.shuffle(numbers)
        for n in numbers:
            db.add_trial("race", n, config(n), result(n))
        for j in range(own):
            n = 10_000 + worker * 1000 + j
            db.add_trial("race", n, config(n), result(n))
        for j in range(claims):
            n = 50_000 + j
            try:
                db.start_trial("race", n, config(n), host=f"worker-{worker}")
            except DuplicateTrial:
                continue
            won.append(n)
            db.finish_trial("race", n, result(n) | {"host": f"worker-{worker}"})
    return won


def _study() -> dict[str, object]:
    from tests.store.conftest import study_kwargs

    return study_kwargs()
