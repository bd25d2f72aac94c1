"""The store contract: the same tests on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from autoslapo.errors import StorageError
from store import DuplicateTrial, Store, StudyRecord, TrialRecord, config_hash, open_store
from store._migrate import head_revision
from tests.store.conftest import config, result, study_kwargs


def test_open_creates_the_head_schema_and_reopens(store_url: str) -> None:
    with open_store(store_url) as db:
        assert db.revision() == head_revision()
        db.create_study("s", **study_kwargs())
    with open_store(store_url) as again:
        assert again.revision() == head_revision()
        assert [s.name for s in again.list_studies()] == ["s"]


def test_study_round_trip(db: Store) -> None:
    created = db.create_study("bert-8", **study_kwargs())
    assert isinstance(created, StudyRecord)
    got = db.get_study("bert-8")
    assert got == created
    assert (got.model_name, got.model_family, got.gpus, got.gpu_type) == (
        "bert-large",
        "bert",
        8,
        "a100-80gb",
    )
    assert got.gpu_memory_bytes == 80 * 2**30
    assert got.model["hidden"] == 1024 and got.cluster["gpus_per_node"] == 8
    assert got.status == "created" and got.created_at.tzinfo is not None
    assert "python" in got.software and "sqlalchemy" in got.software
    assert db.has_study("bert-8") and not db.has_study("nope")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.name = "x"  # type: ignore[misc]


def test_study_names_are_unique(db: Store) -> None:
    db.create_study("s", **study_kwargs())
    with pytest.raises(StorageError, match="unique"):
        db.create_study("s", **study_kwargs())
    assert db.create_study("s", exist_ok=True, **study_kwargs()).name == "s"
    with pytest.raises(StorageError, match="different model or cluster"):
        db.create_study("s", exist_ok=True, **study_kwargs(gpus=16))


def test_unknown_study_lists_known_ones(db: Store, study: str) -> None:
    with pytest.raises(StorageError, match=r"no study named 'nope'.*known studies are s"):
        db.get_study("nope")
    with pytest.raises(StorageError, match="no study named"):
        db.add_trial("nope", 0, config(0), result(0))
    for i in range(12):  # more than ten: the newest are listed, and how many there are
        db.create_study(f"run-{i:02d}", **study_kwargs())
    with pytest.raises(StorageError, match=r"known studies are run-02, .*, run-11 \(13 in all; the 10 newest"):
        db.get_study("nope")
    with pytest.raises(StorageError, match=r"no study named 'rn-11'.*: did you mean run-11"):
        db.get_study("rn-11")


def test_study_status_and_delete(db: Store, study: str) -> None:
    assert db.set_study_status(study, "running").status == "running"
    with pytest.raises(StorageError, match="study status must be one of"):
        db.set_study_status(study, "sleeping")
    db.add_trial(study, 0, config(0), result(0))
    db.delete_study(study)
    assert db.list_studies() == []


def test_trial_round_trip(db: Store, study: str) -> None:
    res = result(3, measured=True) | {"extra": {"nccl": "2.21"}}
    stored = db.add_trial(study, 3, config(3), res)
    assert isinstance(stored, TrialRecord)
    got = db.get_trial(study, 3)
    assert got == stored
    assert got.config == config(3) and got.config_hash == config_hash(config(3))
    assert got.status == "complete" and got.measured is True and got.host == "node-1"
    assert got.samples_per_s == 103.0 and got.tokens_per_s == 103.0 * 512
    assert got.hw_tflops_per_device == pytest.approx(60.3) and got.final_loss == 7.5
    assert got.peak_memory_bytes == 13 * 2**30 and got.step_time_spread_s == 0.01
    assert got.result["extra"] == {"nccl": "2.21"}
    assert got.started_at is not None and got.started_at.tzinfo is not None
    assert db.find_trial(study, config(3)) == got
    assert db.get_trial(study, 4) is None and db.find_trial(study, config(4)) is None


def test_non_finite_metrics_are_stored_as_none(db: Store, study: str) -> None:
    got = db.add_trial(study, 0, config(0), result(0) | {"final_loss": math.nan, "samples_per_s": math.inf})
    assert got.final_loss is None and got.samples_per_s is None and got.result["final_loss"] is None


def test_bad_results_are_refused(db: Store, study: str) -> None:
    with pytest.raises(StorageError, match="trial status must be one of"):
        db.add_trial(study, 0, config(0), result(0) | {"status": "exploded"})
    with pytest.raises(StorageError, match="must be a number"):
        db.add_trial(study, 0, config(0), result(0) | {"samples_per_s": "fast"})
    with pytest.raises(StorageError, match="JSON"):
        db.add_trial(study, 0, {"fn": object()}, result(0))
    assert db.count_trials(study) == 0


def test_add_trial_is_idempotent_and_refuses_duplicates(db: Store, study: str) -> None:
    first = db.add_trial(study, 0, config(0), result(0))
    assert db.add_trial(study, 0, config(0), result(0)) == first
    with pytest.raises(DuplicateTrial, match="number 0 is taken") as same_number:
        db.add_trial(study, 0, config(1), result(1))
    assert same_number.value.existing == first
    with pytest.raises(DuplicateTrial, match="already trial 0"):
        db.add_trial(study, 1, config(0), result(0))
    with pytest.raises(DuplicateTrial, match="already stored as complete"):
        db.add_trial(study, 0, config(0), result(0, "oom"))
    assert db.count_trials(study) == 1


def test_start_then_finish(db: Store, study: str) -> None:
    running = db.start_trial(study, 0, config(0), host="node-2")
    assert running.status == "running" and not running.finished and running.ended_at is None
    assert running.result.get("claim")
    with pytest.raises(DuplicateTrial, match="already stored as running") as second:
        db.start_trial(study, 0, config(0), host="node-3")  # another process starting it too
    assert second.value.existing == running
    done = db.finish_trial(study, 0, result(0, "oom"))
    assert done.status == "oom" and done.reason == "oom at step 1" and done.ended_at is not None
    assert "claim" not in done.result
    assert db.finish_trial(study, 0, result(0, "oom")) == done  # a retried finish
    with pytest.raises(DuplicateTrial, match="already stored as oom"):
        db.finish_trial(study, 0, result(0))
    with pytest.raises(StorageError, match="must be started before"):
        db.finish_trial(study, 9, result(9))
    with pytest.raises(DuplicateTrial):
        db.start_trial(study, 0, config(0))


def test_amend_replaces_a_finished_trials_result_keeping_its_status(db: Store, study: str) -> None:
    first = db.add_trial(study, 0, config(0), result(0))
    remeasured = {**result(0), "samples_per_s": 111.5, "extra": {"repeats_samples_per_s": [100.0, 111.5, 120.0]}}
    amended = db.amend_trial(study, 0, remeasured)
    assert amended.samples_per_s == 111.5 and amended.result["extra"]["repeats_samples_per_s"][1] == 111.5
    assert amended.ended_at == first.ended_at and db.get_trial(study, 0) == amended
    with pytest.raises(StorageError, match="keeping its status: 's' trial 0 is complete, the new result oom"):
        db.amend_trial(study, 0, result(0, "oom"))
    with pytest.raises(StorageError, match="trial 7 does not exist"):
        db.amend_trial(study, 7, result(7))
    db.start_trial(study, 1, config(1))
    with pytest.raises(StorageError, match="is running"):
        db.amend_trial(study, 1, result(1))


def test_add_trial_finishes_a_running_row(db: Store, study: str) -> None:
    db.start_trial(study, 0, config(0))
    assert db.add_trial(study, 0, config(0), result(0)).status == "complete"


def test_stale_running_trials_are_found_and_restarted(db: Store, study: str) -> None:
    db.start_trial(study, 0, config(0), host="a")
    db.start_trial(study, 1, config(1), host="b")
    db.add_trial(study, 2, config(2), result(2))
    assert db.mark_stale_running(study, older_than_s=3600) == []
    stale = db.mark_stale_running(study, host="a")
    assert [(t.number, t.status) for t in stale] == [(0, "failed")]
    assert stale[0].reason.startswith("interrupted")
    assert [t.number for t in db.mark_stale_running(study)] == [1]
    assert db.mark_stale_running(study) == []
    again = db.start_trial(study, 5, config(0), restart=True)
    assert (again.number, again.status, again.reason) == (5, "running", "")
    assert db.get_trial(study, 0) is None
    with pytest.raises(DuplicateTrial):
        db.start_trial(study, 6, config(2), restart=True)  # complete trials are not re-run
    with pytest.raises(DuplicateTrial):
        db.start_trial(study, 7, config(0), restart=True)  # nor running ones (mark them stale first)
    db.finish_trial(study, 5, result(5, "timeout"))
    with pytest.raises(DuplicateTrial, match="number 2 is taken"):
        db.start_trial(study, 2, config(0), restart=True)


def test_duplicate_trial_survives_pickling(db: Store, study: str) -> None:
    import pickle

    db.add_trial(study, 0, config(0), result(0))
    with pytest.raises(DuplicateTrial) as caught:
        db.add_trial(study, 0, config(1), result(1))
    copy = pickle.loads(pickle.dumps(caught.value))
    assert str(copy) == str(caught.value) and copy.existing == caught.value.existing


def test_trials_listing(db: Store, study: str) -> None:
    for i in (3, 1, 2):
        db.add_trial(study, i, config(i), result(i, "complete" if i != 2 else "failed"))
    assert [t.number for t in db.trials(study)] == [1, 2, 3]
    assert [t.number for t in db.trials(study, status="failed")] == [2]
    assert db.count_trials(study) == 3


def test_bulk_insert_is_all_or_nothing(db: Store, study: str) -> None:
    assert db.add_trials(study, [(i, config(i), result(i)) for i in range(50)]) == 50
    with pytest.raises(StorageError, match="none were stored"):
        db.add_trials(study, [(100, config(100), result(100)), (101, config(0), result(0))])
    assert db.count_trials(study) == 50
    assert db.add_trials(study, []) == 0


def test_best_across_studies_with_filters(db: Store) -> None:
    db.create_study("a", **study_kwargs())
    db.create_study("b", **study_kwargs())
    db.create_study("other-gpus", **study_kwargs(gpus=16))
    db.create_study("other-type", **study_kwargs(gpu_type="h100-80gb"))
    db.create_study("other-model", **study_kwargs(preset="gpt2-xl"))
    db.add_trial("a", 0, config(0), result(10, measured=True, peak=70 * 2**30))
    db.add_trial("b", 0, config(0), result(30, peak=79 * 2**30))
    db.add_trial("b", 1, config(1), result(20, measured=True, peak=40 * 2**30))
    db.add_trial("b", 2, config(2), result(99, "oom"))
    for name in ("other-gpus", "other-type", "other-model"):
        db.add_trial(name, 0, config(0), result(500))

    best = db.best_trials("bert-large", 8, "a100-80gb")
    assert [(t.study, t.number, t.samples_per_s) for t in best] == [("b", 0, 130.0)]
    assert db.best_trials("sig-bert-large", 8, "a100-80gb")[0].study == "b"
    assert [t.samples_per_s for t in db.best_trials("bert-large", 8, "a100-80gb", limit=10)] == [130.0, 120.0, 110.0]
    assert [t.samples_per_s for t in db.best_trials("bert-large", 8, None, limit=10)] == [600.0, 130.0, 120.0, 110.0]
    assert db.best_trials("bert-large", 8, "a100-80gb", measured_only=True)[0].number == 1
    assert db.best_trials("bert-large", 8, "a100-80gb", min_headroom_bytes=5 * 2**30)[0].samples_per_s == 120.0
    assert db.best_trials("bert-large", 8, "a100-80gb", min_headroom_fraction=0.2)[0].samples_per_s == 120.0
    assert db.best_trials("bert-large", 8, "a100-80gb", min_headroom_fraction=0.6) == []
    assert db.best_trials("bert-large", 8, "a100-80gb", metric="tokens_per_s")[0].tokens_per_s == 130.0 * 512
    assert db.best_trials("bert-large", 4, "a100-80gb") == []
    assert db.best_trials("no-such-model", 8) == []
    with pytest.raises(StorageError, match="metric must be one of"):
        db.best_trials("bert-large", 8, metric="loss")


def test_history_tracks_the_best_so_far(db: Store, study: str) -> None:
    for i, (value, status) in enumerate([(5, "complete"), (9, "oom"), (3, "complete"), (7, "complete")]):
        db.add_trial(study, i, config(i), result(value, status))
    points = db.history(study)
    assert [p.number for p in points] == [0, 1, 2, 3]
    assert [p.best_so_far for p in points] == [105.0, 105.0, 105.0, 107.0]
    assert points[1].value is None and points[2].value == 103.0


def test_dataframe_and_exports(db: Store, study: str, tmp_path: Path) -> None:
    db.add_trials(study, [(i, config(i), result(i, "complete" if i % 5 else "failed")) for i in range(40)])
    frame = db.to_dataframe(study)
    assert len(frame) == 40
    assert {"number", "status", "samples_per_s", "peak_memory_bytes", "config.tp", "config.attention"} <= set(
        frame
    )
    assert frame["config.micro_batch"].tolist() == list(range(40))
    csv = db.export(study, tmp_path / "s.csv")
    assert len(pd.read_csv(csv)) == 40
    parquet = db.export(study, tmp_path / "s.parquet")
    back = pd.read_parquet(parquet)
    assert len(back) == 40 and back["status"].tolist() == frame["status"].tolist()
    with pytest.raises(StorageError, match=r"must end in \.csv or \.parquet"):
        db.export(study, tmp_path / "s.xlsx")
    db.create_study("empty", **study_kwargs())
    assert len(db.to_dataframe("empty")) == 0


def test_optuna_shares_the_database(db: Store, study: str, store_url: str) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = db.optuna_storage(heartbeat_interval=30)
    search = optuna.create_study(study_name=study, storage=storage, direction="maximize")

    def objective(trial: optuna.Trial) -> float:
        tp = trial.suggest_categorical("tp", [1, 2, 4, 8])
        db.add_trial(study, trial.number, {"tp": tp, "n": trial.number}, result(tp))
        return float(tp)

    search.optimize(objective, n_trials=4)
    storage.engine.dispose()  # type: ignore[attr-defined]
    assert db.count_trials(study) == 4
    reloaded = optuna.load_study(study_name=study, storage=store_url)
    assert len(reloaded.trials) == 4
    with open_store(store_url) as again:
        assert again.revision() == head_revision() and again.count_trials(study) == 4


def test_schema_matches_the_migrations(db: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from store._schema import VERSION_TABLE, Base

    with db._engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        diff = [d for d in compare_metadata(context, Base.metadata) if d[0] != "remove_table"]
    assert diff == []
