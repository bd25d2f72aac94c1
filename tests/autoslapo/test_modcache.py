"""The model-file cache's upkeep: uses mark an entry, entries unused past the age limit are pruned."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autoslapo.errors import UsageError
from autoslapo.models.modcache import max_age_days, prune
from autoslapo.models.user import load_user_file, load_user_model, user_spec
from tests.modelfiles import net_source, write_model_file

DAY = 86400.0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AUTOSLAPO_MODEL_CACHE_DAYS", raising=False)
    return tmp_path / "cache"


def _age(entry: Path, days: float) -> None:
    then = time.time() - days * DAY
    os.utime(entry, (then, then))


def test_an_entry_unused_past_the_limit_is_pruned_and_a_used_one_kept(cache: Path, tmp_path: Path) -> None:
    old_file = write_model_file(tmp_path, net_source(width=8), "old.py")
    used_file = write_model_file(tmp_path, net_source(width=16), "used.py")
    old, used = load_user_file(old_file), user_spec(used_file)
    stray = cache / "notes"
    stray.mkdir()
    for entry in (cache / old.digest, cache / str(used.extra["digest"]), stray):
        _age(entry, 40)
    load_user_model(used)  # a rank process loads it by digest: that is a use
    assert prune() == [old.digest]  # 30 days by default; only <sha256> folders are the cache's
    assert not (cache / old.digest).exists() and stray.is_dir()
    assert (cache / str(used.extra["digest"]) / "used.py").is_file()
    assert user_spec(old_file).extra["digest"] == old.digest  # named again from its path: written back


def test_the_age_limit_comes_from_the_environment(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = load_user_file(write_model_file(tmp_path, net_source(width=8), "m.py")).digest
    _age(cache / digest, 3)
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE_DAYS", "0")
    assert max_age_days() == 0 and prune() == []  # 0 keeps everything
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE_DAYS", "5")
    assert prune() == []
    monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE_DAYS", "2.5")
    assert prune() == [digest]
    for bad in ("-1", "soon", "nan"):
        monkeypatch.setenv("AUTOSLAPO_MODEL_CACHE_DAYS", bad)
        with pytest.raises(UsageError, match="AUTOSLAPO_MODEL_CACHE_DAYS must be a number of days >= 0"):
            prune()


def test_pruning_a_missing_cache_does_nothing(cache: Path) -> None:
    assert not cache.exists() and prune(1.0) == []
