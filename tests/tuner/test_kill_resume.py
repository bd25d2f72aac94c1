"""kill -9 the tuner mid-search, resume, count: no trial lost or duplicated, exactly the budget."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from store import open_store
from tuner.mirror import mirrored_numbers

# A real tuner process: the cost model as evaluator but written as running before each trial
# (instant=False), so a kill can land between a trial's start and its finish as well.
SCRIPT = """
import sys, time
from dataclasses import dataclass
from autoslapo.cluster import ClusterSpec
from autoslapo.models.spec import ModelSpec
from store import open_store
from tuner import SimEvaluator, TuneOptions, tune

@dataclass
class Slow:
    inner: SimEvaluator
    name: str = "sim"
    instant: bool = False
    def evaluate(self, config):
        time.sleep(0.02)
        return self.inner.evaluate(config)

model, cluster = ModelSpec.from_name("bert-base"), ClusterSpec(gpus=16, gpu_type="v100-32gb")
store = open_store(sys.argv[1])
resume = store.has_study("k")
print("ready", flush=True)
tune(TuneOptions(model=model, cluster=cluster, trials=int(sys.argv[2]), study="k", resume=resume,
                 baselines=False, mirror_every=5), store, evaluator=Slow(SimEvaluator(model, cluster)))
print("done", flush=True)
"""


def _run(url: str, budget: int, kill_after: float | None, *, kill_at_trials: int = 0) -> int:
    """Run the tuner; kill -9 it ``kill_after`` s after it has ``kill_at_trials`` rows stored."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, url, str(budget)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    if kill_after is None:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        return 0
    assert proc.stdout is not None
    proc.stdout.readline()  # "ready": the study exists
    if kill_at_trials:
        store = open_store(url)
        deadline = time.monotonic() + 120
        while (not store.has_study("k") or store.count_trials("k") < kill_at_trials) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        store.close()
    time.sleep(kill_after)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.communicate()
    return proc.returncode


def _check(url: str, budget: int) -> None:
    store = open_store(url)
    rows = store.trials("k")
    launched = [t for t in rows if t.status != "pruned"]
    assert len(launched) == budget
    assert len({t.config_hash for t in rows}) == len(rows)  # no config stored twice
    assert len({t.number for t in rows}) == len(rows)
    assert not [t for t in rows if t.status == "running" or t.reason.startswith("interrupted")]
    # the Optuna mirror caught up what the killed tuner had not written, and duplicated nothing
    mirrored = mirrored_numbers(optuna.load_study(study_name="k", storage=store.url).get_trials(deepcopy=False))
    assert mirrored == sorted(t.number for t in rows)
    store.close()


@pytest.mark.slow  # an end-to-end run of separate processes (see pyproject's markers)
def test_kill_9_then_resume_ends_with_exactly_the_budget(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    _run(url, 25, kill_after=0.0, kill_at_trials=8)
    store = open_store(url)
    left = store.trials("k")
    store.close()
    assert 8 <= len(left) < 25  # killed mid-search
    _run(url, 25, kill_after=None)
    _check(url, 25)


@pytest.mark.slow
def test_repeated_kills_at_random_moments(tmp_path: Path) -> None:
    rng = random.Random(7)
    url = f"sqlite:///{tmp_path / 'kills.db'}"
    for _ in range(5):
        _run(url, 60, kill_after=rng.uniform(0.0, 0.3), kill_at_trials=rng.randrange(1, 60))
    _run(url, 60, kill_after=None)
    _check(url, 60)
