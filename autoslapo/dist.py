"""Process-group plumbing, in one place: local multi-rank runs, fake worlds, and the pp x dp x tp mesh.

Rank ordering (``build_groups``): the mesh has dims ``("pp", "dp", "tp")`` with ``tp`` innermost, so

    global_rank = (pp_rank * dp + dp_rank) * tp + tp_rank

Tensor-parallel peers are consecutive ranks (on one node, sharing the fastest links), data-parallel
peers are ``tp`` apart, pipeline stages ``dp * tp`` apart. This matches Megatron and torchtitan.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autoslapo.errors import AutoslapoError, ConfigError, TrialError

__all__ = ["ParallelGroups", "SpawnTimeout", "build_groups", "free_port", "init_fake_world", "spawn"]


class SpawnTimeout(TrialError):
    """``spawn``'s ranks did not all return within its timeout (``done``: how many did)."""

    def __init__(self, message: str, done: int) -> None:
        super().__init__(message)
        self.done = done


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _worker(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    threads: int,
    timeout: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    received: Any,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
        )
        results.put((rank, "ok", fn(*args)))
        # A returned tensor travels as a file descriptor of its shared memory, which the parent fetches
        # from this process while it reads the result: stay until it has (else ConnectionResetError)
        received.wait(timeout)
    except BaseException as exc:
        cls = type(exc)
        results.put((rank, "err", (cls.__module__, cls.__qualname__, str(exc), traceback.format_exc())))
    finally:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()


def _rebuild(rank: int, info: tuple[str, str, str, str]) -> BaseException:
    module, name, msg, tb = info
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    text = f"rank {rank}: {first}" if first else f"rank {rank}: {name}"
    cls: Any = None
    with contextlib.suppress(Exception):
        cls = getattr(importlib.import_module(module), name)
    if isinstance(cls, type) and issubclass(cls, AutoslapoError | AssertionError | ValueError | RuntimeError):
        try:
            err: BaseException = cls(text)
        except Exception:
            err = TrialError(f"{text} ({name})")
    else:
        err = TrialError(f"{text} ({module}.{name})")
    err.__cause__ = RuntimeError(f"traceback on rank {rank}:\n{tb}")
    return err


def _start_forkserver() -> None:
    """Start multiprocessing's fork server (once) with ``PYTHONSAFEPATH`` set: it runs ``python -c``, which
    would put the working directory first on its path while it imports the standard library, so a
    ``copy.py`` or ``queue.py`` there would be imported in its place (the ranks, forked from it, keep
    the parent's path)."""
    from multiprocessing import forkserver

    before = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = before


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    backend: str = "gloo",
    threads: int = 1,
    start_method: str = "forkserver",
    preload: tuple[str, ...] = ("torch", "torch.distributed", "autoslapo.primitives", "autoslapo.verify"),
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` local processes joined in one process group.

    Each process gets ``RANK``/``WORLD_SIZE``/``MASTER_*`` set, ``torch.set_num_threads(threads)``,
    and an initialized default group (``backend``); ``fn`` finds its rank with
    ``torch.distributed.get_rank()``. ``fn`` and ``args`` must be picklable (a module-level function).
    Returns: every rank's return value, by rank.
    Raises: the first failing rank's exception, re-created in this process with the message
    ``"rank R: <first line>"`` (autoslapo errors keep their class; other types become TrialError;
    the rank's traceback is the ``__cause__``); TrialError on timeout or a rank that died silently.
    Remaining ranks are terminated either way.

    ``start_method`` "forkserver" (default) forks each rank from a server process that imported
    ``preload`` once (the first spawn pays ~5 s, later ones well under a second) and that never ran
    torch ops, so no OpenMP or CUDA state is inherited; "spawn" starts every rank from scratch.
    """
    if world_size < 1:
        raise ConfigError(f"spawn needs world_size >= 1: got {world_size}")
    ctx: Any = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(preload))  # no effect once the server is running
        _start_forkserver()
    results = ctx.Queue()
    received = ctx.Event()  # set once this process has read every result (a rank waits for it to exit)
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, backend, threads, timeout, fn, args, results, received),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    outs: dict[int, Any] = {}
    error: BaseException | None = None
    deadline = time.monotonic() + timeout
    try:
        while len(outs) < world_size and error is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpawnTimeout(
                    f"spawn timed out after {timeout:.0f} s with {len(outs)}/{world_size} ranks done; "
                    f"raise timeout= or look for a collective that not every rank reaches",
                    done=len(outs),
                )
            try:
                rank, status, payload = results.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in outs]
                if dead:
                    # Give a crashing rank a moment to report through the queue before giving up.
                    with contextlib.suppress(queue_mod.Empty):
                        rank, status, payload = results.get(timeout=2.0)
                        if status == "err":
                            error = _rebuild(rank, payload)
                            break
                        outs[rank] = payload
                        continue
                    raise TrialError(
                        f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} without a result"
                    ) from None
                continue
            if status == "err":
                error = _rebuild(rank, payload)
            else:
                outs[rank] = payload
    finally:
        received.set()
        for p in procs:
            p.join(timeout=5.0 if error is None else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
        results.close()
    if error is not None:
        raise error
    return [outs[r] for r in range(world_size)]


def init_fake_world(world_size: int, rank: int = 0) -> None:
    """Join a fake process group of ``world_size`` ranks in this one process (collectives are no-ops).

    For shape rehearsals of large layouts on the meta device (torchtitan's trick). Destroys any
    existing default group first. Raises: ConfigError if ``rank`` is out of range.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not 0 <= rank < world_size:
        raise ConfigError(f"fake world rank must be in [0, {world_size}): got {rank}")
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


@dataclass(frozen=True)
class ParallelGroups:
    """The pp x dp x tp layout of this process: degrees, groups and this rank's coordinates."""

    tp: int
    pp: int
    dp: int
    rank: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_group: Any
    pp_group: Any
    dp_group: Any
    mesh: Any

    @property
    def world_size(self) -> int:
        """tp * pp * dp."""
        return self.tp * self.pp * self.dp


def build_groups(tp: int, pp: int = 1, dp: int = 1, *, device_type: str | None = None) -> ParallelGroups:
    """Split the initialized default group into tp, pp and dp groups (mesh dims pp, dp, tp).

    Takes: the degrees and the mesh's device type (default: "cuda" when the default backend is
    nccl, else "cpu"). Returns: a ParallelGroups for this rank (rank ordering: module docstring).
    Raises: ConfigError if a degree is < 1, no group is initialized, or tp*pp*dp != world size.
    """
    from torch.distributed.device_mesh import init_device_mesh

    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        if value < 1:
            raise ConfigError(f"parallel degree {name} must be >= 1: got {name}={value}")
    if not dist.is_initialized():
        raise ConfigError("build_groups needs an initialized process group; run under spawn() or torchrun")
    world = dist.get_world_size()
    if tp * pp * dp != world:
        raise ConfigError(
            f"tp*pp*dp must equal the world size: got tp={tp}, pp={pp}, dp={dp} ({tp * pp * dp}) "
            f"for {world} ranks; pick degrees whose product is {world}"
        )
    if device_type is None:
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank()
    return ParallelGroups(
        tp=tp,
        pp=pp,
        dp=dp,
        rank=rank,
        tp_rank=rank % tp,
        dp_rank=(rank // tp) % dp,
        pp_rank=rank // (tp * dp),
        tp_group=mesh.get_group("tp"),
        pp_group=mesh.get_group("pp"),
        dp_group=mesh.get_group("dp"),
        mesh=mesh,
    )
