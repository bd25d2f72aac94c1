"""What every endpoint shares: the one-line error answer and a JSON body read under the size limit."""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

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


MAX_JSON_DEPTH = 64  # far more than any body of the API nests; deeper is refused before it is looked at


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request's body decoded as JSON. Raises ApiError: 413 over ``max_bytes`` (declared or
    sent), 400 for a body that is not JSON, is nested deeper than ``MAX_JSON_DEPTH`` or holds a
    number that is not finite (``NaN``, ``Infinity``, ``1e999``: Python's decoder takes them)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request bodies must be at most {max_bytes} bytes: got {declared}")
    body = await request.body()
    if len(body) > max_bytes:
        raise ApiError(413, f"request bodies must be at most {max_bytes} bytes: got {len(body)}")
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body must be JSON: {err}") from None
    except RecursionError:
        raise ApiError(400, f"the body must be JSON nested at most {MAX_JSON_DEPTH} levels deep: got deeper "
                            "than Python can decode; send the fields the endpoint takes (see /docs)") from None
    check_json_values(doc)
    return doc


def check_json_values(doc: Any) -> None:
    """Raise ApiError (400) for a decoded body nested deeper than ``MAX_JSON_DEPTH`` or holding a
    number that is not finite, naming where (walked without recursion)."""
    todo: list[tuple[str, Any, int]] = [("", doc, 1)]
    while todo:
        where, value, depth = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            field = f"field {redact(where)[:60]!r}" if where else "the body"
            raise ApiError(400, f"{field} must be a finite number: got {json.dumps(value)}; send a number (JSON has no "
                                "NaN or Infinity) or leave the field out for its default")
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ApiError(400, f"the body must be JSON nested at most {MAX_JSON_DEPTH} levels deep: "
                                    f"{redact(where)[:60] or 'the body'!r} is deeper; send the fields the endpoint takes (see /docs)")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                path = f"{where}[{key}]" if isinstance(value, list) else f"{where}.{key}" if where else str(key)
                todo.append((path, item, depth + 1))


def _query_names(dependant: Any) -> set[str]:
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


#: Parameters that mail and chat clients and ad networks add to shared links (with ``utm_*``).
TRACKING_PARAMS = frozenset({"fbclid", "gclid", "mc_cid", "mc_eid", "ref"})


def known_query(request: Request) -> None:
    """Refuse a query parameter the API endpoint or HTML page does not take (a mistyped filter would
    otherwise be ignored, and its answer taken for the filtered one)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    response_class = getattr(route, "response_class", None)
    page = isinstance(response_class, type) and issubclass(response_class, HTMLResponse)
    if dependant is None or not (request.url.path.startswith("/v1/") or page):
        return
    given = set(request.query_params)
    if page:  # a link shared by chat or e-mail gains tracking parameters: a page ignores those
        given = {q for q in given if not (q.startswith("utm_") or q in TRACKING_PARAMS)}
    unknown = sorted(given - _query_names(dependant))
    if unknown:
        names = ", ".join(sorted(_query_names(dependant)))
        takes = f"takes only the query parameters {names}" if names else "takes no query parameters"
        raise ApiError(400, f"{request.url.path} {takes}: got {redact(unknown[0])[:60]!r}; see /docs for the parameters")
