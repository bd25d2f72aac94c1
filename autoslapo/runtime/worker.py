"""One rank of a launch: ``python -m autoslapo.runtime.worker DIR RANK`` (started by the launcher).

Reads ``DIR/request.json``, joins the other ranks (rank 0 opens a ``TCPStore`` on a port the OS
picks and writes it to ``DIR/port``), initializes the default process group (gloo on CPU, nccl on
CUDA), calls the entry ``fn(ctx, payload)`` and writes ``DIR/rank<R>.json``:
``{"status": "ok"|"oom"|"error", "value": ..., "error": "<Type: first line>", "time": <epoch s>,
"peak_rss_bytes": ...}``. Whatever happens, the process ends with ``os._exit`` so no library thread
can keep it alive.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import resource
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["WorkerContext", "is_oom", "main", "one_line"]


@dataclass(frozen=True)
class WorkerContext:
    """What an entry function learns about its rank: position, device and the launch's limits."""

    rank: int
    world_size: int
    local_rank: int
    device: str  # "cpu" or "cuda:<local_rank>"
    backend: str  # "gloo" or "nccl"
    timeout_s: float
    workdir: str


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 400 characters)."""
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return msg[:400]


def is_oom(exc: BaseException) -> bool:
    """True for out-of-memory errors: MemoryError, torch's OutOfMemoryError, allocator failures."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text.lower() or "can't allocate memory" in text or "DefaultCPUAllocator" in text
    )


def peak_rss_bytes() -> int:
    """This process's peak resident memory (``ru_maxrss``, KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _rendezvous(workdir: Path, rank: int, world_size: int, timeout_s: float,
                master: list[Any] | None = None, local_rank: int | None = None,
                local_world: int | None = None) -> Any:
    """The TCPStore of this launch: rank 0 serves it on an OS-picked port, the others join.

    ``master`` ([host, port]): a job spanning machines, whose global rank 0 serves the store on
    that port and the others reach it at that host.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=max(30.0, timeout_s))
    local_rank = rank if local_rank is None else local_rank
    local_world = world_size if local_world is None else local_world
    if master is not None:
        host, port = str(master[0]), int(master[1])
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
        if rank == 0:
            (workdir / "port").write_text(str(port))  # the launcher cleans up after this port too
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                          LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR=host, MASTER_PORT=str(port))
        return store
    port_file = workdir / "port"
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=timeout, wait_for_workers=False)
        tmp = workdir / "port.tmp"
        tmp.write_text(str(store.port))
        os.replace(tmp, port_file)
        port = store.port
    else:
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not announce its store port within {timeout_s:g} s")
            time.sleep(0.02)
        port = int(port_file.read_text())
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timeout)
    # DeepSpeed reads these even when the process group already exists.
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    return store


def _run(workdir: Path, rank: int) -> dict[str, Any]:
    request = json.loads((workdir / "request.json").read_text())
    world_size = int(request["world_size"])
    device = str(request["device"])
    timeout_s = float(request["timeout_s"])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(request.get("threads") or 1))
    backend = "nccl" if device == "cuda" else "gloo"
    local_rank = rank - int(request.get("rank_offset") or 0)  # this machine's devices count from 0
    dev = f"cuda:{local_rank}" if device == "cuda" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)
    store = _rendezvous(workdir, rank, world_size, timeout_s, request.get("master"), local_rank,
                        request.get("local_world_size"))
    kw: dict[str, Any] = {}
    if device == "cuda":
        kw["device_id"] = torch.device(dev)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=max(30.0, timeout_s)), **kw,
    )
    module_name, fn_name = str(request["entry"]).split(":", 1)
    fn = getattr(importlib.import_module(module_name), fn_name)
    ctx = WorkerContext(rank, world_size, local_rank, dev, backend, timeout_s, str(workdir))
    try:
        value = fn(ctx, request.get("payload") or {})
    except BaseException as exc:
        # When it failed, not when the process group was torn down: the first failure is the cause.
        exc.autoslapo_time = time.time()  # type: ignore[attr-defined]
        raise
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return {"status": "ok", "value": value}


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit code (0 ok, 1 error, 3 out of memory)."""
    workdir, rank = Path(argv[0]), int(argv[1])
    code = 1
    try:
        out = _run(workdir, rank)
        code = 0
    except BaseException as exc:
        oom = is_oom(exc)
        out = {"status": "oom" if oom else "error", "error": one_line(exc), "traceback": traceback.format_exc()}
        code = 3 if oom else 1
        out["time"] = getattr(exc, "autoslapo_time", time.time())
        sys.stderr.write(traceback.format_exc())
    out.setdefault("time", time.time())
    out["peak_rss_bytes"] = peak_rss_bytes()
    try:
        _write_json(workdir / f"rank{rank}.json", out)
    except (TypeError, ValueError) as exc:  # a value that JSON cannot hold is the entry's bug
        _write_json(workdir / f"rank{rank}.json", {
            "status": "error", "error": f"result is not JSON-safe: {one_line(exc)}",
            "time": time.time(), "peak_rss_bytes": out["peak_rss_bytes"],
        })
        code = 1
    return code


def _exit_with_launcher(parent: int) -> None:
    """End this rank once its launcher is gone (a tuner killed with -9 must leave no orphan ranks).

    Ranks lead their own sessions, so nothing else reaches them; a reparented rank sees a new ppid.
    """
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(4)


if __name__ == "__main__":
    import threading

    threading.Thread(target=_exit_with_launcher, args=(os.getppid(),), daemon=True).start()
    rc = 1
    try:
        rc = main(sys.argv[1:])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
