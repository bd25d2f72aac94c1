"""A client of a running ``autoslapo serve``: what ``--server URL`` and ``best(..., server=URL)`` use.

The token comes from ``$AUTOSLAPO_TOKEN`` unless given. A server that cannot be reached, or that
refuses the token, is a one-line UsageError (the CLI exits 2); the token never appears in a message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autoslapo.errors import UsageError
from autoslapo.redact import redact

TOKEN_ENV = "AUTOSLAPO_TOKEN"
TIMEOUT_S = 30.0


class Client:
    """JSON over HTTP to one autoslapo server."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = TIMEOUT_S) -> None:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--server must be an http:// or https:// URL: got {url[:80]!r}; e.g. http://127.0.0.1:8321")
        self.url = url.rstrip("/")
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request; returns the decoded JSON answer. Raises UsageError with the server's one line."""
        import httpx

        try:
            r = httpx.request(method, self.url + path, headers=self._headers, timeout=self.timeout_s, **kwargs)
        except httpx.HTTPError as err:
            raise UsageError(f"cannot reach the autoslapo server at {self.url}: {redact(str(err)) or type(err).__name__}; "
                             "check --server and that `autoslapo serve` runs there") from None
        try:
            doc = r.json()
        except ValueError:
            doc = {"error": r.text.strip().splitlines()[0] if r.text.strip() else r.reason_phrase}
        if r.status_code in (401, 403):
            raise UsageError(f"the server at {self.url} refused the request ({r.status_code}): {doc.get('error')}; "
                             f"set {TOKEN_ENV} to a token with the needed role")
        if r.status_code >= 400:
            raise UsageError(f"the server at {self.url} answered {r.status_code}: {doc.get('error', doc)}")
        return doc

    def get(self, path: str, **params: Any) -> Any:
        """``GET path?params`` (None values left out)."""
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """``POST path`` with a JSON body."""
        return self.request("POST", path, json=body or {})


def model_field(model: str) -> str | dict[str, Any]:
    """What ``POST /v1/studies`` gets as ``model``: a preset name, ``{"hf_config": ...}`` holding the
    config.json at path ``model`` (checked here first, so a bad config is refused before it is sent),
    or ``{"module_file": {"name", "source"}}`` holding the model file (.py) at path ``model`` as its
    text (the server traces it, when it allows model files at all).

    Raises: UsageError for a config the reader refuses (ConfigError), or a model file that cannot be
    read or is not UTF-8 text.
    """
    from autoslapo.models.resolve import is_model_file, read_hf_config, resolve_model

    if not is_model_file(model):
        return model
    if model.lower().endswith(".py"):
        return {"module_file": read_module_file(model)}
    resolve_model(model)
    return {"hf_config": read_hf_config(model)}


def read_module_file(path: str) -> dict[str, str]:
    """``{"name", "source"}`` of the model file at ``path``: its bytes as UTF-8 text (so the server's
    copy has the digest the file has here). Raises UsageError for a missing, unreadable or non-UTF-8 file."""
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read the model file {str(p)!r}: {err.strerror}; check the path") from None
    try:
        return {"name": p.name, "source": data.decode("utf-8")}
    except UnicodeDecodeError as err:
        raise UsageError(f"the model file {str(p)!r} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None


def model_query(model: Any) -> str:
    """What ``GET /v1/best?model=`` gets: a preset name as given, else the spec's signature (which the
    store matches): for a ``ModelSpec``, or the path of a config.json or of a model file (traced here,
    as ``autoslapo best my_model.py`` does)."""
    from autoslapo.models.resolve import is_model_file, resolve_model
    from autoslapo.models.spec import ModelSpec

    if isinstance(model, ModelSpec):
        return model.signature()
    if isinstance(model, str) and is_model_file(model):
        return resolve_model(model).signature()
    return str(model)
