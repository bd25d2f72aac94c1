"""Four processes writing one study at once lose nothing and duplicate nothing (both backends)."""

from __future__ import annotations

import multiprocessing

from store import open_store
from tests.store._workers import write_trials
from tests.store.conftest import result

WORKERS, SHARED, OWN, CLAIMS = 4, 60, 30, 30


def test_four_writers_lose_and_duplicate_nothing(store_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    # The database does not exist yet: the four processes also race to create and migrate it.
    with ctx.Pool(WORKERS) as pool:
        pending = pool.starmap_async(
            write_trials, [(store_url, w, SHARED, OWN, CLAIMS) for w in range(WORKERS)]
        )
        outcomes = pending.get(timeout=240)
    errors = [o["error"] for o in outcomes if o["error"]]
    assert not errors, "\n".join(errors)

    won = sorted(n for outcome in outcomes for n in outcome["won"])
    assert won == [50_000 + j for j in range(CLAIMS)], "every claim won exactly once"
    with open_store(store_url) as db:
        assert [s.name for s in db.list_studies()] == ["race"]
        trials = db.trials("race")
        numbers = [t.number for t in trials]
        expected = list(range(SHARED)) + [10_000 + w * 1000 + j for w in range(WORKERS) for j in range(OWN)]
        expected += [50_000 + j for j in range(CLAIMS)]
        assert numbers == sorted(expected)
        assert len({t.config_hash for t in trials}) == len(trials)
        assert all(t.status == "complete" for t in trials)
        assert all(t.samples_per_s == result(t.number)["samples_per_s"] for t in trials)
        winners = {t.number: t.host for t in trials if t.number >= 50_000}
        by_worker = {n: f"worker-{w}" for w, outcome in enumerate(outcomes) for n in outcome["won"]}
        assert winners == by_worker
