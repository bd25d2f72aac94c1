"""The best stored trials at one global batch, and the global batches a model and cluster were tuned at.

A study fixes its global batch (``tune --global-batch``, else its space's default), but studies of
one model and cluster may have been tuned at different ones: ``best --global-batch`` and
``GET /v1/best?global_batch=`` keep to one. The store ranks trials by their metric alone, so its
ranking is read in growing pages and filtered here by each config's batch; the first trials that
match are the best that do, since every better trial came before them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autoslapo.storage import config_global_batch

if TYPE_CHECKING:
    from store import Store, TrialRecord

#: Trials read in the first page of the ranking, and how many times more each next page reads.
FIRST_PAGE = 64
GROWTH = 16
#: A limit past any study's trials: read every complete trial (only to list the stored batches).
EVERY_TRIAL = 2**31 - 1


def best_at_batch(store: Store, model: str, gpus: int, gpu_type: str | None, global_batch: int | None, *,
                  limit: int = 1, **filters: Any) -> list[TrialRecord]:
    """``store.best_trials(model, gpus, gpu_type, limit=limit, **filters)`` keeping only the trials
    whose config's global batch is ``global_batch`` (None: any), best first."""
    if global_batch is None:
        return store.best_trials(model, gpus, gpu_type, limit=limit, **filters)
    page = max(FIRST_PAGE, limit)
    while True:
        found = store.best_trials(model, gpus, gpu_type, limit=page, **filters)
        matches = [t for t in found if config_global_batch(t.config) == global_batch]
        if len(matches) >= limit or len(found) < page or page >= EVERY_TRIAL:  # enough, or all read
            return matches[:limit]
        page = min(page * GROWTH, EVERY_TRIAL)


def stored_global_batches(store: Store, model: str, gpus: int, gpu_type: str | None, **filters: Any) -> list[int]:
    """The global batches of the complete trials ``store.best_trials`` finds for ``model`` on this
    cluster (``filters``: its links, node size, metric ...), ascending; empty when it finds none."""
    found = store.best_trials(model, gpus, gpu_type, limit=EVERY_TRIAL, **filters)
    return sorted({config_global_batch(t.config) for t in found})


def batch_list(batches: list[int]) -> str:
    """``[16, 64, 1024]`` as "16, 64 and 1024" (as the flag takes them)."""
    shown = [str(b) for b in batches]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def that_one(batches: list[int]) -> str:
    """How a message points at the stored ``batches``: "that one" or "one of those"."""
    return "that one" if len(batches) == 1 else "one of those"
