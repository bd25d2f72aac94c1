"""The service's error lines in the client's words: request fields, not command-line flags.

Checks shared with the CLI (``ClusterSpec``, ``ModelSpec``, ``TuneOptions`` ...) name the flags a
user of ``autoslapo tune`` types (``--gpus must fill whole nodes: got --gpus 12 with
--gpus-per-node 8``); a client of the service sent ``gpus`` and ``gpus_per_node``. ``body_fields``
rewrites such a line once, where the service answers an error (``autoslapo.service.handlers``), so
every endpoint that passes values to shared checks names what its client sent. A command quoted in
backticks (`` `autoslapo tune bert --gpus 8 --server URL` ``) is a command to run and is kept.

``best_missing`` words ``GET /v1/best``'s "nothing recorded" for a client of this server: no store
URL (the server's own business), and the way to get an answer is to submit a study here.
"""

from __future__ import annotations

import re
from dataclasses import fields

from autoslapo.models.spec import SHAPE_LIMITS
from autoslapo.service.estimate import ESTIMATE_FIELDS
from autoslapo.service.jobs import StudyRequest

#: Query parameters of the JSON endpoints that are not body fields too.
QUERY_FIELDS = ("metric", "measured_only", "offset", "limit", "sort", "status", "all")
#: Request fields named by a flag of another name (``tune --timeout`` is ``timeout_s``, ``--study`` ``name``).
FLAG_ALIASES = {"timeout": "timeout_s", "study": "name"}
#: A model's dimensions: ``shape.<name>`` in ``POST /v1/estimate``'s body (``--hidden`` on the command line).
SHAPE_NAMES = frozenset(SHAPE_LIMITS) | {"hidden", "layers", "heads", "kv_heads", "ffn", "seq_len", "vocab",
                                         "max_positions"}
ESTIMATE_PATH = "/v1/estimate"

_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: (-?\d[\d,.]*(?:e-?\d+)?))?(?![\w-])")
#: A model signature (``ModelSpec.signature``): how a client asks ``GET /v1/best`` for a config's or model file's studies.
SIGNATURE = re.compile(r"[0-9a-f]{16}")
_STORE_URL = re.compile(r" in [a-z][a-z0-9+.-]*://[^\s;]*")


def request_fields() -> frozenset[str]:
    """Every name a client of the service sends: the bodies' fields and the query parameters."""
    return frozenset(f.name for f in fields(StudyRequest)) | frozenset(ESTIMATE_FIELDS) | frozenset(QUERY_FIELDS)


def field_of(flag: str, path: str) -> str | None:
    """The request field a command-line ``flag`` (without its dashes) stands for at ``path``, or
    None when it stands for none (a flag of the server itself, say)."""
    name = FLAG_ALIASES.get(flag, flag.replace("-", "_"))
    if name in SHAPE_NAMES:
        return f"shape.{name}" if path.rstrip("/") == ESTIMATE_PATH else name
    return name if name in request_fields() else None


def body_fields(message: str, path: str) -> str:
    """``message`` with each request field's flag named as the field (``--gpus-per-node 8`` becomes
    ``gpus_per_node=8``), outside backtick-quoted commands; the request was made to ``path``."""
    parts = message.split("`")

    def named(match: re.Match[str]) -> str:
        name = field_of(match.group(1), path)
        if name is None:
            return match.group(0)
        return f"{name}={match.group(2)}" if match.group(2) is not None else name

    return "`".join(part if i % 2 else _FLAG.sub(named, part) for i, part in enumerate(parts))


def best_missing(message: str, server: str, model: str | None = None) -> str:
    """``api.best_trial``'s "nothing matches" line as this server's answer: ``on this server``
    instead of the store's URL, and the way to tune it here (``POST /v1/studies``, or the same
    ``autoslapo tune`` command with ``--server``) instead of a local tune. ``model``: what was
    asked; a model signature (what ``best CONFIG.json --server`` sends) is named as one, and
    the command to tune it takes the config.json or model file, not the signature."""
    if model is not None and SIGNATURE.fullmatch(model):
        if message.startswith("model must be a preset"):
            return (f"no study on this server tuned the model of signature {model!r} (a config.json or model file, "
                    "asked for by its signature); submit one: POST /v1/studies with that model ({\"hf_config\": "
                    "...} or {\"module_file\": ...}) and this cluster, or `autoslapo tune CONFIG.json --gpus N "
                    f"--server {server}` with its config.json or model file")
        message = message.replace(f"for {model} on ", f"for the model of signature {model!r} on ", 1).replace(
            f"`autoslapo tune {model} ", "`autoslapo tune CONFIG.json ", 1)
    if message.startswith("no recorded schedule for "):
        text = _STORE_URL.sub("", message.replace("no recorded schedule for ",
                                                  "no study on this server has a recorded schedule for ", 1), count=1)
    else:
        text = _STORE_URL.sub(" on this server", message, count=1)
    command = re.search(r"; run `(autoslapo tune [^`]*)` first$", text)
    if command is not None:
        text = (text[:command.start()] + "; submit one: POST /v1/studies with this model and cluster, or "
                f"`{command.group(1)} --server {server}`")
    return text.replace("; relax them or tune with a measuring backend",
                        "; relax them, or submit a study with a measuring backend (POST /v1/studies, backend ray)")
