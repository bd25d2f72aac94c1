"""Joining a real token-protected Ray cluster (``ray start --head``) with ``--ray-address``.

The head runs in its own processes, started by ``ray start`` with a token of this test's; they are
stopped by their PIDs (the ones whose command line names this test's Ray temp dir), never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_of(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd:
                pids.append(int(entry.name))
    return pids


def _parents() -> dict[int, int]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def _stop(marker: str) -> None:
    """Stop the processes whose command line names ``marker`` and all their descendants (Ray's
    agents rename themselves ``ray::...``), collected before any is killed."""
    pids = set(_pids_of(marker))
    parents = _parents()
    grew = True
    while grew:
        kids = {pid for pid, ppid in parents.items() if ppid in pids} - pids
        grew = bool(kids)
        pids |= kids
    pids.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    # Ray's socket paths must stay short: a short temp dir of our own, unique to this test run
    base = Path(f"/tmp/asl-ray-{uuid.uuid4().hex[:8]}")
    base.mkdir()
    token = base / "token"
    token.write_text(uuid.uuid4().hex)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0"}
    port = _free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    try:
        subprocess.run([ray, "start", "--head", "--port", str(port), "--num-cpus", "2", "--include-dashboard=false",
                        f"--temp-dir={base / 't'}", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=120)
        yield {"address": f"127.0.0.1:{port}", "env": env, "base": base}
    finally:
        _stop(str(base))
        subprocess.run(["rm", "-rf", str(base)], check=False)


def _tune(address: str, env: dict[str, str], db: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "autoslapo", "tune", "bert-tiny", "--gpus", "4", "--trials", "3",
            "--dispatch", "ray", "--ray-address", address, "--storage", f"sqlite:///{db}", "--no-baselines"]
    return subprocess.run(argv, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)


def test_tune_joins_a_token_protected_cluster_and_refuses_a_wrong_token(token_cluster: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    from store import open_store

    env, address = token_cluster["env"], token_cluster["address"]
    ok = _tune(address, env, tmp_path / "ok.db")
    assert ok.returncode == 0, ok.stderr[-2000:]
    store = open_store(f"sqlite:///{tmp_path / 'ok.db'}")
    try:
        rows = [t for t in store.trials("bert-tiny-4xa100-80gb-sim") if t.status != "pruned"]
        assert len(rows) == 3 and all(t.result["extra"].get("ray_node_id") for t in rows)
    finally:
        store.close()

    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-cluster-token")
    bad = _tune(address, {**env, "RAY_AUTH_TOKEN_PATH": str(wrong)}, tmp_path / "bad.db")
    lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr[-2000:]
    assert "refused this process's authentication token" in lines[0]
    assert not (tmp_path / "bad.db").exists()  # refused before the store was touched

    nothing = _tune(f"127.0.0.1:{_free_port()}", env, tmp_path / "none.db")
    assert nothing.returncode == 2 and "nothing answers there" in nothing.stderr
