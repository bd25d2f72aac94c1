"""The web page: plain server-rendered HTML over the same views as the JSON API, no build step.

The studies page carries a submit form for tokens that may submit: a few lines of JavaScript
post it as JSON to ``POST /v1/studies`` (the same checks as any client) and go to the study page.
The study page refreshes itself from ``GET /v1/studies/{name}`` every two seconds while the
study runs (a few lines of JavaScript; the session cookie set by ``/login`` authenticates it).
"""

from __future__ import annotations

from html import escape
from typing import Any

from autoslapo.cluster import DEVICES
from autoslapo.models.spec import list_presets
from autoslapo.service.auth import Caller

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; } td, th { padding: .25rem .6rem; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f4f4f4; } code, pre { background: #f4f4f4; padding: .2rem .4rem; }
.bar { width: 16rem; height: .8rem; background: #eee; display: inline-block; }
.bar > span { display: block; height: 100%; background: #3a7; }
form#submit label { margin-right: .8rem; } form#submit input[type=number] { width: 5rem; }
#submit-error { color: #b00; }
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
    if who.may("submit"):
        return _page("autoslapo studies", body + submit_form(), SUBMIT_SCRIPT)
    return _page("autoslapo studies", body)


def _options(values: list[str], chosen: str) -> str:
    return "".join(f"<option{' selected' if v == chosen else ''}>{escape(v)}</option>" for v in values)


def submit_form() -> str:
    """The form for a new study (model, cluster, backend, budget, name), posted by ``SUBMIT_SCRIPT``."""
    gpu_types = [name for name in DEVICES if name != "cpu"]
    return ("<h2>Submit a study</h2><form id=submit>"
            f"<label>model <select name=model>{_options(list_presets(), 'bert-large')}</select></label>"
            "<label>gpus <input name=gpus type=number min=1 value=8 required></label>"
            f"<label>gpu type <select name=gpu_type>{_options(gpu_types, 'a100-80gb')}</select></label>"
            "<label>backend <select name=backend><option selected>sim</option><option>ray</option></select></label>"
            "<label>trials <input name=trials type=number min=1 max=100000 value=20 required></label>"
            "<label>name <input name=name pattern='[A-Za-z0-9._-]{1,100}' placeholder='(default)'></label>"
            "<button>Submit</button></form><p id=submit-error role=alert></p>")


# Posts the form as JSON with the session cookie; on 202 goes to the study page, else shows the error line.
SUBMIT_SCRIPT = """<script>
document.getElementById('submit').addEventListener('submit', function (ev) {
  ev.preventDefault();
  var f = ev.target.elements, out = document.getElementById('submit-error');
  var body = {model: f.model.value, gpus: parseInt(f.gpus.value, 10), gpu_type: f.gpu_type.value,
              backend: f.backend.value, trials: parseInt(f.trials.value, 10)};
  if (f['name'].value.trim()) { body.name = f['name'].value.trim(); }
  out.textContent = 'submitting...';
  fetch('/v1/studies', {method: 'POST', credentials: 'same-origin',
                        headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)})
    .then(function (r) { return r.json().then(function (doc) { return [r.status, doc]; }); })
    .then(function (res) {
      if (res[0] === 202) { location.href = '/studies/' + encodeURIComponent(res[1].name); }
      else { out.textContent = res[1].error || ('HTTP ' + res[0]); }
    })
    .catch(function (err) { out.textContent = 'could not reach the server: ' + err; });
});
</script>"""


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
