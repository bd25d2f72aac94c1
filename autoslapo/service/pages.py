"""The web page: plain server-rendered HTML over the same views as the JSON API, no build step.

The study page refreshes itself from ``GET /v1/studies/{name}`` every two seconds while the
study runs (a few lines of JavaScript; the session cookie set by ``/login`` authenticates it).
"""

from __future__ import annotations

from html import escape
from typing import Any

from autoslapo.service.auth import Caller

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; } td, th { padding: .25rem .6rem; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f4f4f4; } code, pre { background: #f4f4f4; padding: .2rem .4rem; }
.bar { width: 16rem; height: .8rem; background: #eee; display: inline-block; }
.bar > span { display: block; height: 100%; background: #3a7; }
"""


def _page(title: str, body: str, script: str = "") -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}{script}</body></html>")


def _bar(done: int, budget: int | None) -> str:
    share = 0 if not budget else min(100, int(100 * done / budget))
    return f"<span class=bar><span style='width:{share}%'></span></span> {done}/{budget or '?'}"


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def _best(doc: dict[str, Any]) -> str:
    best = doc.get("best")
    return "-" if not best else f"{best['samples_per_s']:,.1f} samples/s"


def studies_page(studies: list[dict[str, Any]], who: Caller) -> str:
    """The list of studies: model, cluster, backend, progress, best, status."""
    rows = "".join(
        f"<tr><td><a href='/studies/{escape(s['name'])}'>{escape(s['name'])}</a></td>"
        f"<td>{escape(str(s['model']))}</td><td>{s['gpus']}x {escape(str(s['gpu_type']))}</td>"
        f"<td>{escape(str(s['backend']))}</td><td>{_bar(s['launched'], s['budget'])}</td>"
        f"<td>{_best(s)}</td><td class=status>{escape(s['status'])}</td></tr>"
        for s in reversed(studies))
    body = (f"<h1>autoslapo studies</h1><p>signed in as {escape(who.name)} ({who.role}) · "
            f"<a href='/docs'>API</a></p><table id=studies><tr><th>study</th><th>model</th><th>cluster</th>"
            f"<th>backend</th><th>progress</th><th>best</th><th>status</th></tr>{rows}</table>")
    if not studies:
        body += "<p>No studies yet: <code>autoslapo tune bert --gpus 8 --server URL</code>.</p>"
    return _page("autoslapo studies", body)


def study_page(doc: dict[str, Any], trials: list[dict[str, Any]]) -> str:
    """One study: progress, the best schedule with its ``apply_best`` snippet, every trial."""
    name = escape(doc["name"])
    best = doc.get("best")
    best_html = "<p>No complete trial yet.</p>"
    if best:
        best_html = (f"<h2>Best schedule</h2><p>{best['samples_per_s']:,.1f} samples/s (trial {best['number']})"
                     f": <code>{escape(best['schedule'])}</code></p>"
                     f"<pre id=snippet>import autoslapo\n{escape(doc.get('apply_best', ''))}</pre>")
    rows = "".join(
        f"<tr><td>{t['number']}</td><td>{escape(t['status'])}</td>"
        f"<td>{_rate(t['samples_per_s'])}</td>"
        f"<td>{escape(t['schedule'])}</td></tr>" for t in trials[-200:])
    body = (f"<p><a href='/'>all studies</a></p><h1>{name}</h1>"
            f"<p>{escape(str(doc['model']))} on {doc['gpus']}x {escape(str(doc['gpu_type']))}, backend "
            f"{escape(str(doc['backend']))} · status <b id=status>{escape(doc['status'])}</b> · "
            f"<span id=progress>{_bar(doc['launched'], doc['budget'])}</span></p>{best_html}"
            f"<h2>Trials</h2><table><tr><th>#</th><th>status</th><th>samples/s</th><th>schedule</th></tr>"
            f"{rows}</table>")
    script = ""
    if doc["status"] in ("queued", "running"):
        script = ("<script>setTimeout(function(){location.reload()}, 2000);</script>")
    return _page(f"autoslapo: {doc['name']}", body, script)


def login_page(problem: str = "") -> str:
    """The token form (sets an HttpOnly cookie); shown when a page is asked for without a valid token."""
    note = f"<p role=alert>{escape(problem)}</p>" if problem else ""
    body = (f"<h1>autoslapo</h1>{note}<form method=post action=/login><label>Token "
            f"<input name=token type=password autocomplete=off size=60></label> <button>Sign in</button></form>"
            f"<p>Make a token with <code>autoslapo token create --name NAME --role read</code>.</p>")
    return _page("autoslapo: sign in", body)
