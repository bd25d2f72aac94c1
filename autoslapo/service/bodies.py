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
