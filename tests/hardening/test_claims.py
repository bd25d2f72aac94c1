"""``claim_trial``/``add_new_trials``: store-assigned numbers, the budget, and duplicates refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import DuplicateTrial, open_store


def _study(store: object) -> None:
    store.create_study("c", model={"preset": "m"}, cluster={"gpus": 4, "gpu_type": "cpu"},  # type: ignore[attr-defined]
                       space_name="s", space_version="1", objective="samples_per_s", backend="sim",
                       model_signature="sig", cluster_fingerprint="fp")


def test_numbers_budget_and_duplicates(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'c.db'}") as store:
        _study(store)
        ok = {"status": "complete", "samples_per_s": 1.0}
        assert store.add_new_trials("c", [({"tp": 9}, {"status": "pruned", "reason": "big"})]) == 1
        a = store.claim_trial("c", {"tp": 1}, budget=2)
        assert a is not None and a.number == 1 and a.status == "running"
        b = store.claim_trial("c", {"tp": 2}, budget=2, result=ok)
        assert b is not None and b.number == 2 and b.status == "complete"
        assert store.claim_trial("c", {"tp": 4}, budget=2) is None  # pruned rows do not count, the others do
        with pytest.raises(DuplicateTrial) as dup:
            store.claim_trial("c", {"tp": 1}, budget=5)
        assert dup.value.existing.number == 1
        # Skips configs already stored; numbers continue after the highest.
        assert store.add_new_trials("c", [({"tp": 2}, ok), ({"tp": 8}, {"status": "pruned", "reason": "x"})]) == 1
        assert [t.number for t in store.trials("c")] == [0, 1, 2, 3]
        store.finish_trial("c", 1, ok)
        assert store.get_trial("c", 1).status == "complete"  # type: ignore[union-attr]
