"""How the app answers what is not a success: ``{"error": "<one line>"}`` (an HTML page for a page).

Every 4xx line goes through ``body_fields`` here, at one place, so a value checked by code shared
with the CLI is named as the client sent it (``gpus_per_node``), not as the CLI's flag. A page
(an HTML route outside ``/v1/``) answers its error as a page a browser shows.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from autoslapo.errors import AutoslapoError, UsageError
from autoslapo.redact import redact
from autoslapo.service import pages
from autoslapo.service.bodies import ApiError, one_line
from autoslapo.service.messages import body_fields
from autoslapo.service.modfile import ModuleFilesOff

#: An error page's title by its status (503, the store's failure: "unavailable").
PAGE_TITLES = {400: "bad request", 403: "forbidden", 404: "not found", 409: "conflict"}


def is_page(request: Request) -> bool:
    """Whether ``request`` asked for one of the HTML pages (not the JSON API, not a report under ``/v1/``)."""
    route = request.scope.get("route")
    response_class = getattr(route, "response_class", None)
    return (not request.url.path.startswith("/v1/") and isinstance(response_class, type)
            and issubclass(response_class, HTMLResponse))


def error_answer(request: Request, status: int, message: str) -> Response:
    """The answer of an error: its line in the request's field names, as JSON (a page for a page)."""
    line = body_fields(message, request.url.path) if 400 <= status < 500 else message
    if is_page(request):
        return HTMLResponse(pages.missing_page(line, title=PAGE_TITLES.get(status, "unavailable")), status_code=status)
    return JSONResponse({"error": line}, status_code=status)


def install(app: FastAPI) -> None:
    """Register the app's error answers."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        return error_answer(request, err.status, err.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Response:
        # a query parameter missing or of the wrong type: bad input like any other (400), with its value
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        given = "" if first.get("type") == "missing" else f": got {redact(repr(first.get('input')))[:200]}"
        return error_answer(request, 400, f"{where}: {first.get('msg', 'invalid')}{given}; see /docs for the parameters")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        return JSONResponse({"error": str(err.detail)}, status_code=err.status_code)

    @app.exception_handler(AutoslapoError)
    async def domain_error(request: Request, err: AutoslapoError) -> Response:
        status = 403 if isinstance(err, ModuleFilesOff) else 400 if isinstance(err, UsageError) else 503
        return error_answer(request, status, one_line(err))
