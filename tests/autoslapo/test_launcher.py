"""The launcher: results from every rank, failed / timeout / oom outcomes, and nothing left behind.

The entries below run inside the rank processes (they import this module by name).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autoslapo.errors import ConfigError
from autoslapo.runtime.launcher import _classify, launch

HERE = "tests.autoslapo.test_launcher"


# -- entries (run on the ranks) -------------------------------------------------------------------


def _record(ctx: Any, payload: dict[str, Any], **more: Any) -> None:
    path = Path(payload["dir"]) / f"pids{ctx.rank}.json"
    path.write_text(json.dumps({"pid": os.getpid(), **more}))


def sum_ranks(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return {"rank": ctx.rank, "sum": t.item(), "world": dist.get_world_size(), "device": ctx.device}


def crash_on_rank_1(ctx: Any, payload: dict[str, Any]) -> int:
    import torch.distributed as dist

    _record(ctx, payload)
    if ctx.rank == 1:
        raise ValueError("rank one gives up on purpose")
    dist.barrier()  # rank 0 waits for a peer that never comes
    return 0


def collective_dtype_mismatch(ctx: Any, payload: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist

    # The same all-reduce with bf16 on rank 0 and fp32 on rank 1 (what a bias subtracted in fp32 on
    # one tensor-parallel rank under bf16 autocast did): gloo aborts rank 0 in C++ ("collective
    # mismatch", no Python exception, no result) and rank 1 then reads "Connection reset by peer".
    dtype = torch.bfloat16 if ctx.rank == 0 else torch.float32
    t = torch.ones(4096, dtype=dtype)
    for _ in range(3):
        dist.all_reduce(t)
    return 0


def hang_with_child_and_shm(ctx: Any, payload: dict[str, Any]) -> None:
    import torch
    import torch.multiprocessing as tmp_mp

    # A grandchild process and a /dev/shm segment that only a clean-up removes.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    tmp_mp.set_sharing_strategy("file_system")
    shared = torch.zeros(1024).share_memory_()
    _record(ctx, payload, child=child.pid)
    time.sleep(600)
    del shared


def allocate(ctx: Any, payload: dict[str, Any]) -> int:
    import torch

    x = torch.ones(int(payload["bytes"]), dtype=torch.uint8)
    time.sleep(0.3)
    return int(x[0])


def wait_to_be_killed(ctx: Any, payload: dict[str, Any]) -> int:
    import torch.distributed as dist

    _record(ctx, payload)
    if ctx.rank == 1:
        time.sleep(600)  # until the test kills it
    dist.barrier()
    return 0


def allocate_impossible(ctx: Any, payload: dict[str, Any]) -> int:
    import torch

    x = torch.empty(2**60, dtype=torch.uint8)  # the allocator refuses: an out-of-memory error
    return int(x.numel())


# -- helpers --------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _strays(launch_id: str) -> list[int]:
    """Processes whose environment carries this launch's id."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"AUTOSLAPO_LAUNCH_ID={launch_id}".encode() in env and _alive(int(entry)):
            found.append(int(entry))
    return found


def _recorded(d: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("pids*.json"))]


# -- tests ----------------------------------------------------------------------------------------


def test_every_rank_returns_its_value() -> None:
    out = launch(f"{HERE}:sum_ranks", 2, timeout_s=120)
    assert out.status == "complete", out.reason
    assert [v["rank"] for v in out.values] == [0, 1]
    assert all(v["sum"] == 1.0 and v["world"] == 2 and v["device"] == "cpu" for v in out.values)
    assert all(p > 10 * 2**20 for p in out.peak_rss_bytes)
    assert not Path("/tmp", out.launch_id).exists()
    assert _strays(out.launch_id) == []


def test_a_crashing_rank_makes_the_launch_failed_with_its_reason(tmp_path: Path) -> None:
    out = launch(f"{HERE}:crash_on_rank_1", 2, {"dir": str(tmp_path)}, timeout_s=120, grace_s=2)
    assert out.status == "failed"
    assert out.reason.startswith("rank 1: ValueError: rank one gives up on purpose")
    assert "\n" not in out.reason
    assert all(not _alive(r["pid"]) for r in _recorded(tmp_path))
    assert _strays(out.launch_id) == []


def test_a_rank_aborted_in_cpp_is_the_reason_not_its_peers_lost_connection() -> None:
    out = launch(f"{HERE}:collective_dtype_mismatch", 2, timeout_s=120, grace_s=2)
    assert out.status == "failed"
    assert out.reason.startswith("rank 0 was killed by signal 6 (SIGABRT) without a result"), out.reason
    assert "gloo::EnforceNotMet" in out.reason and "collective mismatch" in out.reason
    assert "by peer" not in out.reason and "\n" not in out.reason
    assert _strays(out.launch_id) == []


PEER = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by peer."
ABORT_LOG = ("Traceback ...\nterminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
             "  what():  [enforce fail at pair.cc:456] 16384 vs 8192. Is there a distributed collective mismatch?")


@pytest.mark.parametrize(
    ("results", "codes", "logs", "exit_at", "want"),
    [
        # a peer's socket error recorded before the aborted rank was seen gone: still the abort
        ([None, {"status": "error", "error": PEER, "time": 1.0}], [-6, 1], [ABORT_LOG, ""], [2.0, 1.5],
         "rank 0 was killed by signal 6 (SIGABRT) without a result: gloo::EnforceNotMet: [enforce fail"),
        # a rank's own error beats an earlier lost-peer error
        ([{"status": "error", "error": PEER, "time": 1.0}, {"status": "error", "error": "ValueError: x", "time": 5.0}],
         [1, 1], ["", ""], [1.1, 5.1], "rank 1: ValueError: x"),
        # two own errors: the earliest
        ([{"status": "error", "error": "KeyError: a", "time": 3.0}, {"status": "error", "error": "ValueError: b", "time": 2.0}],
         [1, 1], ["", ""], [3.1, 2.1], "rank 1: ValueError: b"),
        # only lost peers and a rank killed by the launcher: the lost peer
        ([{"status": "error", "error": PEER, "time": 1.0}, None], [1, None], ["", ""], [1.1, None], "rank 0: RuntimeError"),
        # nothing but ranks killed by the launcher
        ([None, None], [None, None], ["", ""], [None, None], "rank 0 gave no result before the launch ended"),
    ],
)
def test_the_reason_is_the_root_cause_not_a_lost_peer(
    results: list[Any], codes: list[Any], logs: list[str], exit_at: list[Any], want: str
) -> None:
    status, reason, evidence = _classify(results, logs, codes, [0] * len(results), None, exit_at)
    assert status == "failed" and evidence == ""
    assert reason.startswith(want), reason


def test_a_sigkill_is_oom_only_with_evidence() -> None:
    killed: list[Any] = [None, {"status": "error", "error": PEER, "time": 1.0}]
    codes: list[Any] = [-9, 1]
    status, reason, evidence = _classify(killed, ["", ""], codes, [0, 0], None, [2.0, 1.5])
    assert (status, evidence) == ("failed", "")
    assert reason == "rank 0 was killed by signal 9 (SIGKILL), no out-of-memory evidence"
    status, reason, evidence = _classify(killed, ["", ""], codes, [0, 0], None, [2.0, 1.5],
                                         "cgroup memory.events oom_kill 3 -> 4")
    assert (status, evidence) == ("oom", "cgroup memory.events oom_kill 3 -> 4")
    assert reason == ("out of memory: rank 0 was killed by signal 9 (SIGKILL) "
                      "(evidence: cgroup memory.events oom_kill 3 -> 4)")


@pytest.mark.slow
def test_a_hang_times_out_and_its_processes_and_shm_files_are_gone(tmp_path: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    t0 = time.monotonic()
    out = launch(f"{HERE}:hang_with_child_and_shm", 2, {"dir": str(tmp_path)}, timeout_s=30)
    assert out.status == "timeout"
    assert "30 s" in out.reason
    assert time.monotonic() - t0 < 60
    recs = _recorded(tmp_path)
    assert len(recs) == 2, out.logs  # both ranks got as far as the hang
    for r in recs:
        assert not _alive(r["pid"]) and not _alive(r["child"])
    assert _strays(out.launch_id) == []
    pids = {r["pid"] for r in recs}
    left = [n for n in set(os.listdir("/dev/shm")) - shm_before if any(f"torch_{p}_" in n for p in pids)]
    assert left == []


def test_going_over_the_memory_cap_is_oom() -> None:
    out = launch(f"{HERE}:allocate", 2, {"bytes": 700 * 2**20}, timeout_s=120, mem_cap_bytes=500 * 2**20)
    assert out.status == "oom"
    assert "cap of 500 MiB" in out.reason and out.reason.endswith("(evidence: memory-cap monitor)")
    assert out.oom_evidence == "memory-cap monitor"
    assert _strays(out.launch_id) == []


def test_staying_under_the_cap_completes() -> None:
    out = launch(f"{HERE}:allocate", 1, {"bytes": 64 * 2**20}, timeout_s=120, mem_cap_bytes=2 * 2**30)
    assert out.status == "complete", out.reason
    assert out.peak_rss_bytes[0] >= 64 * 2**20


def test_an_allocation_the_allocator_refuses_is_oom() -> None:
    out = launch(f"{HERE}:allocate_impossible", 1, timeout_s=120)
    assert out.status == "oom", out.reason
    assert "rank 0" in out.reason and out.reason.endswith("(evidence: allocator error)")
    assert out.oom_evidence == "allocator error"


def test_a_rank_killed_from_outside_is_failed_without_oom_evidence(tmp_path: Path) -> None:
    # kill -9 from outside (an operator, a scheduler), no memory cap reached: not an out-of-memory.
    def kill_rank_1() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            rec = tmp_path / "pids1.json"
            if rec.exists():
                os.kill(json.loads(rec.read_text())["pid"], signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    out = launch(f"{HERE}:wait_to_be_killed", 2, {"dir": str(tmp_path)}, timeout_s=120, grace_s=2,
                 mem_cap_bytes=8 * 2**30)
    killer.join()
    assert out.status == "failed", out.reason
    assert out.reason == "rank 1 was killed by signal 9 (SIGKILL), no out-of-memory evidence"
    assert out.oom_evidence == ""
    assert _strays(out.launch_id) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"world_size": 0},
        {"world_size": 2, "device": "tpu"},
        {"world_size": 2, "entry": "no_colon"},
        {"world_size": 2, "mem_cap_bytes": 0},
    ],
)
def test_bad_arguments_are_rejected_before_anything_starts(kwargs: dict[str, Any]) -> None:
    entry = kwargs.pop("entry", f"{HERE}:sum_ranks")
    with pytest.raises(ConfigError):
        launch(entry, timeout_s=10, **kwargs)


def test_a_killed_launchers_folder_and_processes_are_swept_a_live_ones_kept(tmp_path: Path) -> None:
    """A Ray trial's actor killed by a Ctrl-C of its study left /tmp/autoslapo-trial-* (its ``finally``
    never ran); the next launch on the machine, and a local Ray study's end, sweep it."""
    from autoslapo.runtime.launcher import LAUNCH_ID_ENV, TRIAL_DIR_PREFIX, sweep_stale_trial_dirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, live, other = (f"{TRIAL_DIR_PREFIX}{gone.pid}-abc", f"{TRIAL_DIR_PREFIX}{os.getpid()}-def",
                         f"{TRIAL_DIR_PREFIX}xyz")
    for name in (dead, live, other):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank0.log").write_text("x")
    # a rank of the dead launch, in a session of its own, still running
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            env={**os.environ, LAUNCH_ID_ENV: dead})
    try:
        assert sweep_stale_trial_dirs(tmp_path) == [dead]
        assert rank.wait(timeout=10) == -signal.SIGKILL
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, other])
    finally:
        if rank.poll() is None:
            rank.kill()
    # a study's end waits for its own launches only, not another study's live one
    t0 = time.monotonic()
    assert sweep_stale_trial_dirs(tmp_path, wait_s=5.0, wait_for=set()) == [] and time.monotonic() - t0 < 2.0
    out = launch(f"{HERE}:sum_ranks", 1, timeout_s=120)  # its folder names its launcher
    assert out.status == "complete" and out.launch_id.startswith(f"{TRIAL_DIR_PREFIX}{os.getpid()}-")
