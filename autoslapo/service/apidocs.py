"""``/docs``: the API's reference as one self-contained HTML page, made from ``/openapi.json``.

FastAPI's own ``/docs`` (Swagger UI) and ``/redoc`` load their scripts from a CDN: blank on a
machine with no network, which is where a server often runs. This page needs nothing from
elsewhere (no script, no stylesheet, no font): each endpoint with its method, what it does, its
path and query parameters, its JSON body's fields (type, required, default, meaning) and its
answers, read from the app's OpenAPI document as it is served.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from autoslapo.service.pages import html_page

METHODS = ("get", "post", "put", "patch", "delete")


def _type(schema: dict[str, Any]) -> str:
    """A schema's JSON type(s), e.g. ``integer``, ``string | null``."""
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return " | ".join(str(k) for k in kinds)
    options = schema.get("anyOf") or schema.get("oneOf") or []
    return " | ".join(_type(o) for o in options) or "any"


def _default(schema: dict[str, Any]) -> str:
    return f"<code>{escape(json.dumps(schema['default']))}</code>" if "default" in schema else ""


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]], css: str) -> str:
    header = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table class={css}><tr>{header}</tr>{body}</table>"


def _parameters(operation: dict[str, Any]) -> str:
    rows = [(f"<code>{escape(p['name'])}</code>", escape(p.get("in", "")), escape(_type(p.get("schema", {}))),
             "yes" if p.get("required") else "", _default(p.get("schema", {})), escape(p.get("description", "")))
            for p in operation.get("parameters", [])]
    return (f"<h4>Parameters</h4>{_table(('name', 'in', 'type', 'required', 'default', ''), rows, 'params')}"
            if rows else "")


def _body(operation: dict[str, Any]) -> str:
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    if not schema:
        return ""
    required = set(schema.get("required", []))
    rows = [(f"<code>{escape(name)}</code>", escape(_type(field)), "yes" if name in required else "",
             _default(field), escape(field.get("description", "")))
            for name, field in schema.get("properties", {}).items()]
    only = " No other field is taken." if schema.get("additionalProperties") is False else ""
    return (f"<h4>JSON body</h4><p>An object with these fields.{only}</p>"
            f"{_table(('field', 'type', 'required', 'default', ''), rows, 'body')}")


def docs_page(openapi: dict[str, Any]) -> str:
    """The reference page of an OpenAPI document: every path and method, in the document's order."""
    info = openapi.get("info", {})
    toc, sections = [], []
    for path, item in openapi.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            anchor = f"{method}-{path}".replace("/", "_").replace("{", "").replace("}", "")
            title = f"{method.upper()} {path}"
            toc.append(f"<li><a href='#{escape(anchor)}'><code>{escape(title)}</code></a>"
                       f" {escape(operation.get('summary', ''))}</li>")
            # FastAPI lists 422 for a parameter's validation: this app answers those 400 (``handlers``)
            answers = ", ".join(dict.fromkeys(escape("400" if code == "422" else code)
                                              for code in operation.get("responses", {})))
            text = escape(operation.get("description", "")).replace("\n\n", "<br><br>")
            sections.append(f"<section id='{escape(anchor)}'><h3><code>{escape(title)}</code></h3><p>{text}</p>"
                            f"{_parameters(operation)}{_body(operation)}<p>Answers: {answers or '-'}; an error is "
                            "<code>{\"error\": \"&lt;one line&gt;\"}</code>.</p></section>")
    body = (f"<p><a href='/'>all studies</a> · <a href='/openapi.json'>openapi.json</a></p>"
            f"<h1>{escape(info.get('title', 'API'))} API {escape(str(info.get('version', '')))}</h1>"
            f"<p>{escape(info.get('description', ''))} Send a token as <code>Authorization: Bearer &lt;token&gt;</code>"
            f" (make one with <code>autoslapo token create</code>).</p><ul id=endpoints>{''.join(toc)}</ul>"
            f"{''.join(sections)}")
    return html_page(f"{info.get('title', 'API')}: API", body)


def install(app: FastAPI) -> None:
    """Serve ``docs_page`` of ``app`` at ``/docs`` (create the app with ``docs_url=None``)."""

    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(docs_page(app.openapi()))
