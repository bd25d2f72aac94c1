"""Schema migrations: upgrading from the first schema, and refusing a newer one untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from autoslapo.errors import StorageError
from store import open_store
from store._engine import build_engine
from store._migrate import head_revision, known_revisions, upgrade
from store._schema import VERSION_TABLE
from store._url import parse_url
from tests.store.conftest import config, result


def test_revisions_form_one_line() -> None:
    assert known_revisions() == {"0001", "0002", "0003", "0004", "0005"}
    assert head_revision() == "0005"


def _first_schema_db(url: str) -> None:
    """A database as the first autoslapo release left it: revision 0001, one study, two trials."""
    engine = build_engine(parse_url(url))
    try:
        assert upgrade(engine, "0001") == "0001"
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO autoslapo_studies (id, name, model_name, model_family, model, model_signature, "
                    "cluster, cluster_fingerprint, gpus, gpu_type, gpu_memory_bytes, space_name, space_version, "
                    "objective, backend, status, software, created_at, updated_at) VALUES (1, 'old', "
                    "'bert-large', 'bert', '{\"preset\": \"bert-large\"}', 'sig', '{\"gpus\": 8}', 'fp', 8, "
                    "'a100-80gb', 85899345920, 'transformer', '1', 'samples_per_s', 'sim', 'complete', '{}', "
                    "'2024-01-01 00:00:00', '2024-01-01 00:00:00')"
                )
            )
            for number, value in ((0, 120.0), (1, 150.0)):
                conn.execute(
                    text(
                        "INSERT INTO autoslapo_trials (study_id, number, config, config_hash, status, "
                        "samples_per_s, peak_memory_bytes, measured, reason, host, result, started_at, ended_at) "
                        "VALUES (1, :n, :cfg, :h, 'complete', :v, 1000, true, '', 'old-host', '{}', "
                        "'2024-01-01 00:00:00', '2024-01-01 00:01:00')"
                    ),
                    {"n": number, "cfg": f'{{"tp": {number}}}', "h": f"hash{number}", "v": value},
                )
        columns = {c["name"] for c in inspect(engine).get_columns("autoslapo_trials")}
        assert "final_loss" not in columns
    finally:
        engine.dispose()


def test_upgrade_from_the_first_schema_keeps_the_data(store_url: str) -> None:
    _first_schema_db(store_url)
    with open_store(store_url) as db:
        assert db.revision() == head_revision()
        old = db.get_study("old")
        assert (old.model_name, old.gpus, old.status) == ("bert-large", 8, "complete")
        trials = db.trials("old")
        assert [(t.number, t.samples_per_s, t.host) for t in trials] == [
            (0, 120.0, "old-host"),
            (1, 150.0, "old-host"),
        ]
        assert trials[0].final_loss is None and trials[0].started_at is not None
        assert db.best_trials("bert-large", 8, "a100-80gb")[0].number == 1
        db.add_trial("old", 2, config(2), result(2))  # new columns are written
        assert db.get_trial("old", 2).final_loss == 7.5  # type: ignore[union-attr]
        with db._engine.connect() as conn:
            indexes = {i["name"] for i in inspect(conn).get_indexes("autoslapo_trials")}
        assert "ix_autoslapo_trials_best" in indexes


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_newer_schema_is_refused_untouched(store_url: str, backend: str) -> None:
    with open_store(store_url) as db:
        db._engine.dispose()
        with db._engine.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
        db.close()
    path = Path(parse_url(store_url).database or "") if backend == "sqlite" else None
    before = _digest(path) if path else None
    with pytest.raises(StorageError, match=r"'0099', written by a newer autoslapo.*left untouched") as caught:
        open_store(store_url)
    assert "\n" not in str(caught.value)
    if path is not None:
        assert _digest(path) == before
        assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    engine = create_engine(parse_url(store_url))
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == "0099"
    engine.dispose()


def test_optuna_keeps_its_own_version_table(store_url: str) -> None:
    import optuna

    with open_store(store_url) as db:
        storage = db.optuna_storage(heartbeat_interval=None)
        optuna.create_study(study_name="x", storage=storage)
        storage.engine.dispose()  # type: ignore[attr-defined]
        with db._engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            assert {"alembic_version", VERSION_TABLE, "studies", "trials", "autoslapo_trials"} <= tables
            optuna_rev = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            assert optuna_rev is not None and optuna_rev not in known_revisions()
    with open_store(store_url) as again:  # reopening with Optuna's tables present is fine
        assert again.revision() == head_revision()
