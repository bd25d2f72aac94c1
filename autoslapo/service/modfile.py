"""A user's own model file sent as data: ``{"model": {"module_file": {"name": "my_model.py", "source": "..."}}}``.

A module file is code, so the service takes it only when started with ``--allow-module-files``
(``serve`` and ``worker``), and no service process ever imports it: the server checks the source is
text, writes it into the model cache by its digest (``$AUTOSLAPO_MODEL_CACHE``, the layout
``autoslapo tune my_model.py`` uses) and builds the spec by running the file's trace
(``autoslapo.models.user.user_spec``) in a child process under a timeout. A file that fails there
(syntax error, no ``build``/``batch``, an exception, the timeout, or one of the child's limits: 4 GiB of
memory by default, CPU seconds as the timeout, 64 MiB a written file) is one UsageError line, before
anything is stored. Memory and CPU hold both in each process (rlimits) and summed over all the
trace's processes, which the server polls: a file that starts processes cannot multiply the limits.
Those are the child (a supervisor that reaps its orphaned descendants, so a daemon that calls
``setsid`` or forks twice stays under it), its descendants, its process group and any process
carrying the trace's mark in its environment; all of them end with the trace. Where the machine lets
the server make a memory cgroup (``autoslapo.memcg``), the trace runs in one: the kernel holds the
memory sum at every allocation, so a burst between two polls is stopped too. Where the machine lets
the child make a network namespace (root, or unprivileged user namespaces; ``autoslapo.netns``), the
trace has no network: it can neither download nor send anything. Where the kernel has Landlock
(``autoslapo.landlock``, Linux 5.13, unprivileged), the trace may write only to its work directory
and its file's cache entry (not to the store, the server's files or anyone else's), and from
Linux 6.12 cannot signal a process outside it (the server).

The job keeps the source as sent, so the worker that runs the study, and any worker that takes it
over after a crash, writes the same bytes, traces the same digest and builds the same spec; the
trial processes then load the file from the cache by digest, as they do for ``autoslapo tune
my_model.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoslapo import memcg, proctree
from autoslapo.errors import UsageError
from autoslapo.models.modcache import ensure_entry
from autoslapo.models.spec import ModelSpec

MODULE_FILE = "module_file"
ALLOW_FLAG = "--allow-module-files"
TRACE_TIMEOUT_S = 120.0
NAME_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}\.py")
MEMO_SIZE = 64
#: How often the server sums the trace's processes' memory and CPU time against the limits.
GROUP_POLL_S = 0.05
#: The environment variable that marks the trace's processes (``Family``).
TRACE_MARK = "AUTOSLAPO_TRACE_ID"
#: The trace's memory cgroups' names begin so (``autoslapo.memcg``; the server's pid follows).
CGROUP_PREFIX = "autoslapo-trace-"
#: Each of the trace's isolations is on unless its variable says ``off`` (or 0, no, false): the
#: memory cgroup (off: the polls alone hold the sum), the network namespace (off: the trace has the
#: server's network) and Landlock (off: it writes and signals what the server's user may).
CGROUP_ENV = "AUTOSLAPO_TRACE_CGROUP"
NETWORK_ENV = "AUTOSLAPO_TRACE_NETWORK_ISOLATION"
LANDLOCK_ENV = "AUTOSLAPO_TRACE_LANDLOCK"

#: The trace child's limits: its heap and other private memory (``RLIMIT_DATA``; ``$AUTOSLAPO_TRACE_MEMORY_MIB``
#: overrides the default 4 GiB: the trace of experiments/my_model.py peaks at ~220 MiB, torch's import
#: included), the files it may write (``RLIMIT_FSIZE``) and its CPU seconds (``RLIMIT_CPU``: the
#: timeout's, so its threads cannot use every core of the server for the whole timeout).
MEMORY_ENV = "AUTOSLAPO_TRACE_MEMORY_MIB"
TRACE_MEMORY_MIB = 4096
TRACE_FILE_BYTES = 64 * 2**20

# The child is a supervisor that never imports the file: it joins the trace's memory cgroup where
# the server made one (``autoslapo.memcg``), leaves the network where it may (``autoslapo.netns``),
# makes itself the reaper of orphaned descendants (so a daemon the file starts, setsid or double
# fork, stays under it), forks the tracer (which restricts what it and its descendants may write and
# signal, ``autoslapo.landlock``: its work directory and the file's cache entry; no process outside
# them, the supervisor included), waits for it, kills whatever the tracer left running and ends as
# the tracer ended (its exit code, or the signal that stopped it). The tracer sets its limits (before torch is imported), traces the
# file as `autoslapo tune FILE.py` does and writes the spec (or one error line) to a result file;
# the file's own prints go nowhere. BaseException: a file may raise SystemExit. One thread for
# torch: the trace is on the meta device.
_CHILD = """\
import contextlib, os, resource, signal, sys
from autoslapo import landlock, netns, proctree


def trace():
    import errno, json
    memory, cpu_s, file_bytes = (int(a) for a in sys.argv[3:6])
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    os.environ["OMP_NUM_THREADS"] = "1"
    result = {}
    try:
        from autoslapo.errors import AutoslapoError
        from autoslapo.models.user import user_spec
        result = {"spec": user_spec(sys.argv[1]).to_dict()}
    except MemoryError:
        result = {"limit": "memory"}
    except BaseException as exc:
        text = " ".join(str(exc).split())
        ours = isinstance(exc, AutoslapoError) and text
        result = {"error": text if ours else f"{type(exc).__name__}: {text}".rstrip(": ")}
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            result = {"limit": "file"}
        elif "can't allocate memory" in text or "Cannot allocate memory" in text:  # torch's CPU allocator
            result = {"limit": "memory"}
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(result, out)


if sys.argv[6]:  # the trace's memory cgroup: joined before anything forks, so every process is born in it
    with contextlib.suppress(OSError):
        with open(sys.argv[6], "w") as procs:
            procs.write(str(os.getpid()))
if sys.argv[7] == "1":  # a network namespace of its own: no route anywhere, for it and every process it starts
    netns.leave_network()
proctree.become_subreaper()
tracer = os.fork()
if tracer == 0:
    code = 1
    if sys.argv[8] == "1":  # writes only to its work directory (cwd) and its file's cache entry; no signal to a
        # process outside its own domain, this supervisor included (restricted here, after the fork)
        landlock.restrict([os.getcwd(), os.path.dirname(os.path.abspath(sys.argv[1]))], network=sys.argv[7] == "1")
    try:
        trace()
        code = 0
    finally:
        os._exit(code)
status = 0
while True:  # reaps the orphans handed to this process too
    try:
        pid, got = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    if pid == tracer:
        status = got
        break
proctree.kill(os.getpid(), spare_root=True)
with contextlib.suppress(ChildProcessError):
    while os.waitpid(-1, 0)[0]:
        pass
if os.WIFSIGNALED(status):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def trace_memory_bytes() -> int:
    """The trace child's memory limit: ``$AUTOSLAPO_TRACE_MEMORY_MIB`` MiB, else ``TRACE_MEMORY_MIB``.

    Raises: UsageError for a value that is not a whole number of at least 256 MiB."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return TRACE_MEMORY_MIB * 2**20
    if not text.isdigit() or int(text) < 256:
        raise UsageError(f"{MEMORY_ENV} must be a whole number of MiB, at least 256 (torch alone needs ~200): got "
                         f"{text[:40]!r}; e.g. {MEMORY_ENV}={TRACE_MEMORY_MIB}")
    return int(text) * 2**20


class ModuleFilesOff(UsageError):
    """A module file sent to a server or worker started without ``--allow-module-files``."""


@dataclass(frozen=True)
class ModuleFile:
    """A model file's name (a plain ``*.py`` file name, no directory) and its text."""

    name: str
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or NAME_RULE.fullmatch(self.name) is None:
            raise UsageError(f"model.module_file.name must be a Python file name like my_model.py (letters, digits, _; "
                             f"no directory): got {repr(self.name)[:60]}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise UsageError("model.module_file.source must be the file's text as a non-empty JSON string: got "
                             f"{type(self.source).__name__ if not isinstance(self.source, str) else 'an empty string'}")
        if "\x00" in self.source:
            raise UsageError("model.module_file.source must be text: it holds a NUL character; send the .py file's "
                             "UTF-8 text")
        try:
            self.source.encode("utf-8")
        except UnicodeEncodeError as err:
            raise UsageError(f"model.module_file.source must be text: it holds {err.reason} at character "
                             f"{err.start}; send the .py file's UTF-8 text") from None

    @classmethod
    def from_json(cls, value: Any) -> ModuleFile:
        """``{"name": ..., "source": ...}`` as sent; one-line UsageError for anything else."""
        if not isinstance(value, Mapping) or set(value) != {"name", "source"}:
            got = ", ".join(sorted(map(str, value))) if isinstance(value, Mapping) else type(value).__name__
            raise UsageError(f"model.module_file must be {{\"name\": \"my_model.py\", \"source\": \"<the file's text>\"}}: "
                             f"got {got or 'no keys'}")
        return cls(name=value["name"], source=value["source"])

    @property
    def digest(self) -> str:
        """sha256 of the file's bytes: what the model cache and the spec name it by."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def to_json(self) -> dict[str, dict[str, str]]:
        """What ``model`` holds in a request: ``{"module_file": {"name", "source"}}``."""
        return {MODULE_FILE: {"name": self.name, "source": self.source}}


def materialize(mf: ModuleFile) -> Path:
    """Write the file into the model cache by its digest (once; atomically) and return its path."""
    return ensure_entry(mf.digest, mf.name, mf.source.encode("utf-8"))


_memo: OrderedDict[tuple[str, str], ModelSpec] = OrderedDict()
_locks = [threading.Lock() for _ in range(16)]  # by digest: one trace of a file at a time, a bounded set
_guard = threading.Lock()


def module_spec(mf: ModuleFile, timeout_s: float = TRACE_TIMEOUT_S) -> ModelSpec:
    """The spec of a module file, traced in a child process (never imported here); kept by digest.

    Raises: UsageError (one line) when the file fails its trace, or the trace outlives ``timeout_s``.
    """
    key = (mf.digest, mf.name)
    with _guard:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    with _locks[int(mf.digest[:8], 16) % len(_locks)]:  # two traces of a file would race on its cached trace
        with _guard:
            if key in _memo:
                return _memo[key]
        spec = _trace_in_child(mf, materialize(mf), timeout_s)
        with _guard:
            _memo[key] = spec
            while len(_memo) > MEMO_SIZE:
                _memo.popitem(last=False)
    return spec


def forget() -> None:
    """Drop the specs kept in this process (the model cache on disk stays): the next ask traces again."""
    with _guard:
        _memo.clear()


def _trace_in_child(mf: ModuleFile, path: Path, timeout_s: float) -> ModelSpec:
    memory = trace_memory_bytes()
    limits = [str(memory), str(_cpu_seconds(timeout_s)), str(TRACE_FILE_BYTES)]
    # every process of the trace carries this mark, so one that leaves the supervisor's tree is found
    mark = f"{os.getpid()}-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="autoslapo-trace-") as work:
        result = Path(work) / "result.json"
        # where this machine lets the server make one, a memory cgroup holds the sum at every allocation
        group = memcg.create(CGROUP_PREFIX, memory) if _switched_on(CGROUP_ENV) else None
        try:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(result), *limits,
                                      str(group.procs) if group else "", "1" if _switched_on(NETWORK_ENV) else "0",
                                      "1" if _switched_on(LANDLOCK_ENV) else "0"],
                                     cwd=work,
                                     env={**os.environ, TRACE_MARK: mark, "TMPDIR": work},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        except BaseException:
            if group:
                group.remove()
            raise
        family = Family(child, f"{TRACE_MARK}={mark}".encode(), group)
        try:
            code = _wait_within_limits(mf, family, timeout_s, memory)
        finally:
            killed = family.end()  # whatever the file left running
        if killed:  # the kernel killed a process for the sum, whatever the file made of that
            raise UsageError(_memory_message(mf, memory) + " (its processes together)")
        try:
            doc = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UsageError(_no_result(mf, code, memory, timeout_s)) from None
    if doc.get("limit") == "memory":
        raise UsageError(_memory_message(mf, memory))
    if doc.get("limit") == "file":
        raise UsageError(_file_message(mf))
    if "error" in doc:
        text = str(doc["error"]).replace(str(path), mf.name).replace(str(path.parent), "<model cache>")
        raise UsageError(f"the model file {mf.name} cannot be used: {text}")
    return ModelSpec.from_dict(doc["spec"])


def _switched_on(variable: str) -> bool:
    """Whether the isolation that ``variable`` names is on: unless it says off, 0, no or false."""
    return os.environ.get(variable, "").strip().lower() not in ("off", "0", "no", "false")


def _cpu_seconds(timeout_s: float) -> int:
    """The trace's CPU limit: the timeout's seconds, whole (at least 1)."""
    return max(1, math.ceil(timeout_s))


@dataclass(frozen=True)
class Family:
    """The trace's processes: the supervisor child, its descendants (it reaps their orphans), its
    process group and whatever carries the trace's mark in its environment (``autoslapo.proctree``);
    and every process in its memory cgroup, where the server made one (``autoslapo.memcg``)."""

    child: subprocess.Popen[bytes]
    marker: bytes
    cgroup: memcg.MemoryCgroup | None = None

    def oom_kills(self) -> int:
        """Processes the kernel killed for the cgroup's limit (0 without a cgroup)."""
        return self.cgroup.oom_kills() if self.cgroup else 0

    def usage(self) -> tuple[int, float] | None:
        """(memory bytes, proportional set sizes; CPU seconds) of the family together; None without ``/proc``."""
        return proctree.usage(self.child.pid, self.marker)

    def end(self) -> int:
        """Kill every member, the supervisor last (so orphans stay under it meanwhile), and reap it;
        remove the cgroup. Returns ``oom_kills()`` as it stood at the end."""
        proctree.kill(self.child.pid, self.marker, spare_root=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group at once: a member forked
            os.killpg(self.child.pid, signal.SIGKILL)  # after the scan above, or a system without /proc
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.child.kill()
        self.child.wait()
        proctree.kill(None, self.marker)  # one that forked as the supervisor went
        if self.cgroup is None:
            return 0
        killed = self.cgroup.oom_kills()
        self.cgroup.remove()  # kills what is left in it: a member that cleared its mark and left the tree
        return killed


def _wait_within_limits(mf: ModuleFile, family: Family, timeout_s: float, memory: int) -> int:
    """The trace child's exit code, once it ends within the timeout and the limits summed over its
    processes (what a file that starts processes uses in all of them; polled every ``GROUP_POLL_S``).
    Raises: UsageError (one line) for the timeout or a summed limit."""
    deadline, cpu_s = time.monotonic() + timeout_s, _cpu_seconds(timeout_s)
    while (code := family.child.poll()) is None:
        if time.monotonic() > deadline:
            raise UsageError(f"the model file {mf.name} did not finish its trace within {timeout_s:g} s; build() and "
                             "one forward on the meta device must be quick (no downloads, no loops on data)")
        used = family.usage()
        if family.oom_kills() or (used is not None and used[0] > memory):
            raise UsageError(_memory_message(mf, memory) + " (its processes together)")
        if used is not None and used[1] > cpu_s:
            raise UsageError(f"the model file {mf.name} used more than {cpu_s} s of CPU in its trace, its processes "
                             "together (the server's limit); build() and one forward on the meta device must be quick")
        time.sleep(GROUP_POLL_S)
    return code


def _memory_message(mf: ModuleFile, memory: int) -> str:
    return (f"the model file {mf.name} needed more than {memory // 2**20} MiB to trace (the server's limit, "
            f"{MEMORY_ENV}); build() and the forward run on the meta device: create no real tensors or data")


def _file_message(mf: ModuleFile) -> str:
    return (f"the model file {mf.name} wrote a file over {TRACE_FILE_BYTES // 2**20} MiB in its trace (the server's "
            "limit); the trace must not write data")


def _no_result(mf: ModuleFile, code: int, memory: int, timeout_s: float) -> str:
    """Why a trace child ended without writing its result: a limit's signal, else its exit code."""
    cpu_s = _cpu_seconds(timeout_s)
    if code == -signal.SIGXCPU:
        return (f"the model file {mf.name} used more than {cpu_s} s of CPU in its trace (the server's limit); "
                "build() and one forward on the meta device must be quick")
    if code == -signal.SIGKILL:
        return (f"the trace of the model file {mf.name} was killed (its CPU limit of {cpu_s} s, or the system's "
                "out-of-memory killer); build() and one forward on the meta device must be quick and small")
    if code == -signal.SIGXFSZ:
        return _file_message(mf)
    if code == -signal.SIGSEGV or code == -signal.SIGABRT:  # an allocation failing outside Python's reach
        return _memory_message(mf, memory) + f" (it ended with signal {-code})"
    return f"the trace of the model file {mf.name} ended with exit code {code} and no result; the file must not end the process"
