"""What every endpoint shares: the one-line error answer and a JSON body read under the size limit."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from autoslapo.redact import redact


class ApiError(Exception):
    """An answer other than success: HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(str(message).split())


def one_line(err: BaseException) -> str:
    """The first line of an error's message, secrets redacted (its type's name when it has none)."""
    return redact(str(err)).strip().splitlines()[0] if str(err).strip() else type(err).__name__


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's body decoded as JSON. Raises ApiError: 413 over ``max_bytes`` (declared or
    sent), 400 for a body that is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request bodies must be at most {max_bytes} bytes: got {declared}")
    body = await request.body()
    if len(body) > max_bytes:
        raise ApiError(413, f"request bodies must be at most {max_bytes} bytes: got {len(body)}")
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body must be JSON: {err}") from None


def _query_names(dependant: Any) -> set[str]:
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def known_query(request: Request) -> None:
    """Refuse a query parameter the API endpoint does not take (a mistyped filter would otherwise be
    ignored, and its answer taken for the filtered one). HTML pages are left alone."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.url.path.startswith("/v1/"):
        return
    unknown = sorted(set(request.query_params) - _query_names(dependant))
    if unknown:
        names = ", ".join(sorted(_query_names(dependant)))
        takes = f"takes only the query parameters {names}" if names else "takes no query parameters"
        raise ApiError(400, f"{request.url.path} {takes}: got {redact(unknown[0])[:60]!r}; see /docs for the parameters")
