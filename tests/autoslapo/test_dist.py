"""dist: spawn returns by rank and re-raises a rank's error; build_groups orders ranks pp, dp, tp."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autoslapo.dist import SpawnTimeout, build_groups, spawn
from autoslapo.errors import ConfigError, ScheduleError


def _coords(tp: int, pp: int, dp: int) -> tuple[int, int, int, int, list[int]]:
    g = build_groups(tp=tp, pp=pp, dp=dp)
    ranks = dist.get_process_group_ranks(g.tp_group)
    return g.rank, g.tp_rank, g.dp_rank, g.pp_rank, ranks


def _fail_on_rank1() -> int:
    if dist.get_rank() == 1:
        raise ScheduleError("shard needs size % tp == 0: got 10 for tp=4\nsecond line")
    dist.barrier()
    return 0


def test_spawn_groups_and_errors() -> None:
    out = spawn(_coords, 4, 2, 1, 2, timeout=120)
    assert [o[:4] for o in out] == [(0, 0, 0, 0), (1, 1, 0, 0), (2, 0, 1, 0), (3, 1, 1, 0)]
    assert out[2][4] == [2, 3]
    with pytest.raises(ScheduleError, match=r"^rank 1: shard needs size % tp == 0: got 10 for tp=4$"):
        spawn(_fail_on_rank1, 2, timeout=60)
    with pytest.raises(ConfigError, match="world_size >= 1"):
        spawn(_fail_on_rank1, 0)


def _slow_on_rank1() -> int:
    if dist.get_rank() == 1:
        time.sleep(30)
    return dist.get_rank()


@pytest.mark.slow  # ~11 s: two ranks, a 3 s timeout and their teardown
def test_spawn_past_its_timeout_raises_spawn_timeout_with_the_ranks_done() -> None:
    """``verify`` tells a shape too slow for ``--timeout`` from a hang by this error's kind and count."""
    with pytest.raises(SpawnTimeout, match=r"spawn timed out after 3 s with 1/2 ranks done") as caught:
        spawn(_slow_on_rank1, 2, timeout=3)
    assert caught.value.done == 1


def _a_tensor() -> torch.Tensor:
    return torch.arange(6, dtype=torch.float64).reshape(2, 3) * (dist.get_rank() + 1)


class _SlowReader:
    """A results queue whose reader takes its time: each rank has long put its tensor by then."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def put(self, item: Any) -> None:
        self.inner.put(item)

    def get(self, timeout: float | None = None) -> Any:
        time.sleep(1.0)
        return self.inner.get(timeout=timeout)

    def close(self) -> None:
        self.inner.close()


def test_spawn_returns_tensors_a_slow_reader_gets_after_the_ranks_are_done(monkeypatch: pytest.MonkeyPatch) -> None:
    # A returned tensor travels as a file descriptor its rank hands over while the result is read:
    # a rank that exited before then broke the read (ConnectionResetError on a loaded machine)
    import torch.multiprocessing as mp

    real = mp.get_context

    class Context:
        def __init__(self, method: str) -> None:
            self.ctx = real(method)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.ctx, name)

        def Queue(self) -> _SlowReader:  # multiprocessing's name
            return _SlowReader(self.ctx.Queue())

    monkeypatch.setattr(mp, "get_context", Context)
    out = spawn(_a_tensor, 2, timeout=120)
    for rank, t in enumerate(out):
        assert torch.equal(t, torch.arange(6, dtype=torch.float64).reshape(2, 3) * (rank + 1))


def test_build_groups_needs_a_group() -> None:
    with pytest.raises(ConfigError, match="initialized process group"):
        build_groups(2)


def test_a_working_directory_shadowing_the_standard_library_does_not_break_the_ranks(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "copy.py").write_text("raise RuntimeError('the working directory shadowed copy')\n")
    # a script file, not -c, so that this process itself keeps the working directory off its path
    (scripts / "run.py").write_text(
        "import os\nfrom autoslapo.dist import spawn\n"
        "if __name__ == '__main__':\n    print(spawn(os.getpid, 2, timeout=120.0) and 'ranks ok')\n")
    out = subprocess.run([sys.executable, str(scripts / "run.py")], cwd=work, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)
    assert out.returncode == 0 and "ranks ok" in out.stdout, out.stderr[-2000:]
