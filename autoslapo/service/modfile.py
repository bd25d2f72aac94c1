"""A user's own model file sent as data: ``{"model": {"module_file": {"name": "my_model.py", "source": "..."}}}``.

A module file is code, so the service takes it only when started with ``--allow-module-files``
(``serve`` and ``worker``), and no service process ever imports it: the server checks the source is
text, writes it into the model cache by its digest (``$AUTOSLAPO_MODEL_CACHE``, the layout
``autoslapo tune my_model.py`` uses) and builds the spec by running the file's trace
(``autoslapo.models.user.user_spec``) in a child process under a timeout. A file that fails there
(syntax error, no ``build``/``batch``, an exception, the timeout) is one UsageError line, before
anything is stored. The job keeps the source as sent, so the worker that runs the study, and any
worker that takes it over after a crash, writes the same bytes, traces the same digest and builds
the same spec; the trial processes then load the file from the cache by digest, as they do for
``autoslapo tune my_model.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoslapo.errors import UsageError
from autoslapo.models.spec import ModelSpec
from autoslapo.models.user import model_cache_dir

MODULE_FILE = "module_file"
ALLOW_FLAG = "--allow-module-files"
TRACE_TIMEOUT_S = 120.0
NAME_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}\.py")
MEMO_SIZE = 64

# The child: trace the file as `autoslapo tune FILE.py` does and write the spec (or one error line)
# to a result file; the file's own prints go nowhere. BaseException: a file may raise SystemExit.
_CHILD = """\
import json, sys
result = {}
try:
    from autoslapo.errors import AutoslapoError
    from autoslapo.models.user import user_spec
    result = {"spec": user_spec(sys.argv[1]).to_dict()}
except BaseException as exc:
    text = " ".join(str(exc).split())
    ours = isinstance(exc, AutoslapoError) and text
    result = {"error": text if ours else f"{type(exc).__name__}: {text}".rstrip(": ")}
with open(sys.argv[2], "w", encoding="utf-8") as out:
    json.dump(result, out)
"""


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
    path = model_cache_dir() / mf.digest / mf.name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-", suffix=".tmp")
    with os.fdopen(fd, "wb") as out:
        out.write(mf.source.encode("utf-8"))
    os.replace(tmp, path)
    return path


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
    with tempfile.TemporaryDirectory(prefix="autoslapo-trace-") as work:
        result = Path(work) / "result.json"
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(result)], cwd=work,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)  # its own group: a timeout ends what it started too
        try:
            code = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            raise UsageError(f"the model file {mf.name} did not finish its trace within {timeout_s:g} s; build() and "
                             "one forward on the meta device must be quick (no downloads, no loops on data)") from None
        finally:
            _kill_group(child)  # whatever the file left running in its group
        try:
            doc = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UsageError(f"the trace of the model file {mf.name} ended with exit code {code} and no result; "
                             "the file must not end the process") from None
    if "error" in doc:
        text = str(doc["error"]).replace(str(path), mf.name).replace(str(path.parent), "<model cache>")
        raise UsageError(f"the model file {mf.name} cannot be used: {text}")
    return ModelSpec.from_dict(doc["spec"])


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
