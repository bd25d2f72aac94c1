"""``autoslapo studies`` names the global batch each study's trials ran at: two studies of one model
and cluster at different batches no longer read alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoslapo.cli import main


def test_studies_show_the_global_batch_their_trials_ran_at(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    for name, batch in (("small", "8"), ("large", "64")):
        assert main(["tune", "bert-tiny", "--gpus", "4", "--backend", "sim", "--trials", "2", "--no-baselines",
                     "--global-batch", batch, "--study", name, "--storage", url]) == 0
    capsys.readouterr()
    assert main(["studies", "--json", "--storage", url]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["small"]["global_batch"], rows["large"]["global_batch"]) == (8, 64)
    assert main(["studies", "--storage", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:4] == ["STUDY", "MODEL", "CLUSTER", "BATCH"]
    for line in lines[1:3]:
        name = line.split()[0]
        assert {"small": " 8 ", "large": " 64 "}[name] in line, line
