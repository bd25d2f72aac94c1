"""`show` with trials that have no measurement: pruned trials (stored with zeros) and a real trial
a Ctrl-C interrupted sort last by any metric and show ``-``, not 0.0 or "E"."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoslapo.cli import main
from autoslapo.cluster import ClusterSpec
from autoslapo.config import ScheduleConfig
from autoslapo.models.spec import ModelSpec

GiB = 2**30
STUDY = "mix"
# what the tuner stores for a trial the cost model pruned before it ran
PRUNED = {"status": "pruned", "reason": "predicted 193.3 GiB per device exceeds 80.0 GiB", "samples_per_s": 0.0,
          "tokens_per_s": 0.0, "tflops_per_device": 0.0, "hw_tflops_per_device": 0.0, "peak_memory_bytes": 0,
          "step_time_s": 0.0, "step_time_spread_s": 0.0, "measured": False}


def _config(i: int) -> dict[str, object]:
    return ScheduleConfig(tp=1, pp=1, dp=8, micro_batch=2 ** (i % 5), ckpt_ratio=0.25 * (i // 5)).to_dict()


def _study(tmp_path: Path, backend: str = "sim") -> str:
    """Trials 0, 2 pruned; 1, 3, 4 complete (memory 30, 10, 20 GiB; step time 3, 1, 2 s)."""
    from store import open_store

    url = f"sqlite:///{tmp_path / 'r.db'}"
    spec, cluster = ModelSpec.from_name("bert"), ClusterSpec(gpus=8, gpu_type="a100-80gb")
    complete = {1: (30, 3.0), 3: (10, 1.0), 4: (20, 2.0)}
    with open_store(url) as db:
        db.create_study(STUDY, model=spec.to_dict(), cluster=cluster.to_dict(), space_name=spec.family,
                        space_version="1", objective="samples_per_s", backend=backend,
                        model_signature=spec.signature(), cluster_fingerprint=cluster.fingerprint())
        for i in range(5):
            if i in complete:
                gib, step = complete[i]
                result = {"status": "complete", "samples_per_s": 100.0 / step, "tflops_per_device": 50.0 / step,
                          "peak_memory_bytes": gib * GiB, "step_time_s": step, "measured": backend != "sim"}
            else:
                result = dict(PRUNED)
            db.add_trial(STUDY, i, _config(i), result)
    return url


def _json_numbers(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[int]:
    import json

    assert main(argv) == 0
    return [t["number"] for t in json.loads(capsys.readouterr().out)["trials"]]


@pytest.mark.parametrize("order, memory, steps", [
    ([], [3, 4, 1, 0, 2], [3, 4, 1, 0, 2]),             # least memory, shortest step first
    (["--desc"], [1, 4, 3, 0, 2], [1, 4, 3, 0, 2]),
    (["--asc"], [3, 4, 1, 0, 2], [3, 4, 1, 0, 2]),
])
def test_trials_without_the_metric_sort_last_in_both_directions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], order: list[str], memory: list[int], steps: list[int]) -> None:
    url = _study(tmp_path)
    assert _json_numbers(capsys, ["show", STUDY, "--storage", url, "--json", "--sort", "memory", *order]) == memory
    assert _json_numbers(capsys, ["show", STUDY, "--storage", url, "--json", "--sort", "step-time", *order]) == steps


def test_the_table_shows_a_missing_metric_as_a_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _study(tmp_path)
    assert main(["show", STUDY, "--storage", url, "--sort", "memory", "--limit", "3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["3"], ["4"], ["1"])]
    assert [r[:2] for r in rows] == [["3", "complete"], ["4", "complete"], ["1", "complete"]]
    assert main(["show", STUDY, "--storage", url, "--status", "pruned"]) == 0
    pruned = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[1:2] == ["pruned"]]
    assert [r[:6] for r in pruned] == [["0", "pruned", "-", "-", "-", "-"], ["2", "pruned", "-", "-", "-", "-"]]


def test_an_interrupted_real_trial_is_not_labelled_estimated(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from store import open_store

    url = _study(tmp_path, backend="local")
    with open_store(url) as db:  # what Ctrl-C of `tune --backend local` leaves: the running trial failed
        db.start_trial(STUDY, 5, _config(5))
        (interrupted,) = db.mark_stale_running(STUDY)
        assert interrupted.status == "failed" and interrupted.reason.startswith("interrupted")
    assert main(["show", STUDY, "--storage", url]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.split()[:1] and line.split()[0].isdigit()}
    assert rows["5"][1:6] == ["failed", "-", "-", "-", "-"]  # no metric, so neither M nor E
    assert rows["3"][5] == "M"  # a measured trial keeps its M
