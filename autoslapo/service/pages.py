"""The web page: plain server-rendered HTML over the same views as the JSON API, no build step.

The studies page carries a submit form for tokens that may submit: a few lines of JavaScript
post it as JSON to ``POST /v1/studies`` (the same checks as any client) and go to the study page.
The study page follows a running study through its server-sent events
(``GET /v1/studies/{name}/events``, authenticated by the session cookie that ``/login`` sets): each
ended trial adds a row, a point on the throughput-over-trials chart (an inline SVG: every trial's
samples/s and the best so far) and moves the progress bar and the best; ``done`` reloads the page
once, which then shows the final best with its copyable ``apply_best`` line and the report's
figures (the report of ``GET /v1/studies/{name}/report``, framed).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from autoslapo.cluster import DEVICES, links_text
from autoslapo.models.spec import list_presets
from autoslapo.service.auth import Caller
from autoslapo.service.views import IN_FLIGHT, LAUNCHED

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; } td, th { padding: .25rem .6rem; border-bottom: 1px solid #ddd; text-align: left; }
th { background: #f4f4f4; } code, pre { background: #f4f4f4; padding: .2rem .4rem; }
.bar { width: 16rem; height: .8rem; background: #eee; display: inline-block; }
.bar > span { display: block; height: 100%; background: #3a7; }
form#submit label { margin-right: .8rem; } form#submit input[type=number] { width: 5rem; }
#submit-error { color: #b00; }
#chart { border: 1px solid #ddd; background: #fcfcfc; } #chart .best { fill: none; stroke: #3a7; stroke-width: 2; }
#chart circle { fill: #36c; } #chart circle.failed { fill: #c33; } #chart text { font-size: 11px; fill: #555; }
#report { width: 100%; height: 60rem; border: 1px solid #ddd; }
"""


def _page(title: str, body: str, script: str = "") -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}{script}</body></html>")


html_page = _page  # the page frame, for the service's other pages (``autoslapo.service.apidocs``)


def _bar(done: int, budget: int | None) -> str:
    share = 0 if not budget else min(100, int(100 * done / budget))
    return f"<span class=bar><span style='width:{share}%'></span></span> {done}/{budget or '?'}"


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def _best(doc: dict[str, Any]) -> str:
    best = doc.get("best")
    return "-" if not best else f"{best['samples_per_s']:,.1f} samples/s"


def _links(doc: dict[str, Any]) -> str:
    """" (inter-node 6.25 GB/s)" for a study whose cluster has its own links, else ""."""
    text = links_text(doc.get("links") or {})
    return f" ({escape(text)})" if text else ""


def studies_page(studies: list[dict[str, Any]], who: Caller) -> str:
    """The list of studies: model, cluster, backend, progress, best, status."""
    rows = "".join(
        f"<tr><td><a href='/studies/{escape(s['name'])}'>{escape(s['name'])}</a></td>"
        f"<td>{escape(str(s['model']))}</td><td>{s['gpus']}x {escape(str(s['gpu_type']))}{_links(s)}</td>"
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
    """The form for a new study (model, cluster and its network, backend, budget, name), posted by ``SUBMIT_SCRIPT``."""
    gpu_types = [name for name in DEVICES if name != "cpu"]
    return ("<h2>Submit a study</h2><form id=submit>"
            f"<label>model <select name=model>{_options(list_presets(), 'bert-large')}</select></label>"
            "<label>gpus <input name=gpus type=number min=1 value=8 required></label>"
            f"<label>gpu type <select name=gpu_type>{_options(gpu_types, 'a100-80gb')}</select></label>"
            "<label>network GB/s a device <input name=inter_node_gbps type=number min=0.01 max=10000 step=any "
            "placeholder='(the preset\'s)'></label>"
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
  if (f.inter_node_gbps.value.trim()) { body.inter_node_gbps = parseFloat(f.inter_node_gbps.value); }
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
    """One study: progress, throughput over trials (a chart), the best schedule with a copyable
    ``apply_best`` line, every trial, and once it ended the report's figures; a running study is
    followed live through its events (``STUDY_SCRIPT``)."""
    name = escape(doc["name"])
    best = doc.get("best")
    best_html = "<p id=best>No complete trial yet.</p>"
    if best:
        best_html = (f"<p id=best>{best['samples_per_s']:,.1f} samples/s (trial {best['number']})"
                     f": <code>{escape(best['schedule'])}</code></p>")
        if doc.get("apply_best"):
            best_html += (f"<pre id=snippet>import autoslapo\n{escape(doc['apply_best'])}</pre>"
                          "<button id=copy type=button>Copy</button>")
    shown = trials[-200:]
    rows = "".join(_trial_row(t) for t in shown)
    points = [{"n": t["number"], "v": t["samples_per_s"], "s": t["status"]} for t in trials if t["status"] in LAUNCHED]
    live = doc["status"] in ("queued", "running")
    report = ""
    if not live and trials:
        report = (f"<h2>Report</h2><p><a href='/v1/studies/{name}/report'>open the report</a></p>"
                  f"<iframe id=report title='the study report' loading=lazy src='/v1/studies/{name}/report'></iframe>")
    body = (f"<p><a href='/'>all studies</a></p><h1>{name}</h1>"
            f"<p>{escape(str(doc['model']))} on {doc['gpus']}x {escape(str(doc['gpu_type']))}{_links(doc)}, backend "
            f"{escape(str(doc['backend']))} · status <b id=status>{escape(doc['status'])}</b> · "
            f"<span id=progress data-launched={int(doc['launched'])} data-budget={int(doc['budget'] or 0)}>"
            f"{_bar(doc['launched'], doc['budget'])}</span></p>"
            f"<h2>Best schedule</h2>{best_html}"
            "<h2>Throughput over trials</h2><svg id=chart width=720 height=240 role=img "
            "aria-label='samples/s of each trial and the best so far'></svg>"
            f"<h2>Trials</h2><table id=trials><thead><tr><th>#</th><th>status</th><th>samples/s</th><th>schedule</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>{report}")
    running = [t["number"] for t in trials if t["status"] == IN_FLIGHT]  # counted in launched already
    data = json.dumps({"name": doc["name"], "live": live, "points": points, "running": running}).replace("</", "<\\/")
    script = f"<script type=application/json id=study-data>{data}</script>{STUDY_SCRIPT}"
    return _page(f"autoslapo: {doc['name']}", body, script)


def _trial_row(t: dict[str, Any]) -> str:
    return (f"<tr><td>{t['number']}</td><td>{escape(t['status'])}</td>"
            f"<td>{_rate(t['samples_per_s'])}</td><td>{escape(t['schedule'])}</td></tr>")


# Draws the chart from the embedded trials; while the study runs, follows its events: a trial adds a row
# and a point and moves the progress bar and the best; ``done`` reloads the page for the final view.
STUDY_SCRIPT = """<script>
(function () {
  var data = JSON.parse(document.getElementById('study-data').textContent);
  var seen = {}, points = data.points, svg = document.getElementById('chart');
  points.forEach(function (p) { seen[p.n] = true; });
  var inflight = {};  // running when the page was made: already in its launched count
  (data.running || []).forEach(function (n) { inflight[n] = true; });
  function el(tag, attrs, text) {
    var e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function draw() {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var W = 720, H = 240, L = 60, B = 24, ok = points.filter(function (p) { return p.v !== null; });
    var xmax = Math.max(1, Math.max.apply(null, points.map(function (p) { return p.n; }).concat([1])));
    var ymax = Math.max(1e-9, Math.max.apply(null, ok.map(function (p) { return p.v; }).concat([0]))) * 1.1;
    var x = function (n) { return L + (W - L - 10) * n / xmax; };
    var y = function (v) { return H - B - (H - B - 10) * v / ymax; };
    svg.appendChild(el('line', {x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: '#999'}));
    svg.appendChild(el('line', {x1: L, y1: 10, x2: L, y2: H - B, stroke: '#999'}));
    svg.appendChild(el('text', {x: 4, y: 20}, (ymax / 1.1).toFixed(1)));
    svg.appendChild(el('text', {x: 4, y: H - B}, '0'));
    svg.appendChild(el('text', {x: W - 90, y: H - 6}, 'trial ' + xmax));
    svg.appendChild(el('text', {x: L + 6, y: H - 6}, 'samples/s per trial; line: best so far'));
    var best = null, path = [];
    points.slice().sort(function (a, b) { return a.n - b.n; }).forEach(function (p) {
      if (p.v === null) {
        svg.appendChild(el('circle', {cx: x(p.n), cy: H - B, r: 3, 'class': 'failed'}));
        return;
      }
      svg.appendChild(el('circle', {cx: x(p.n), cy: y(p.v), r: 3}));
      if (best === null || p.v > best) { best = p.v; }
      path.push(x(p.n).toFixed(1) + ',' + y(best).toFixed(1));
    });
    if (path.length) { svg.appendChild(el('polyline', {points: path.join(' '), 'class': 'best'})); }
  }
  draw();
  var copy = document.getElementById('copy');
  if (copy) {
    copy.addEventListener('click', function () {
      var text = document.getElementById('snippet').textContent;
      if (navigator.clipboard) { navigator.clipboard.writeText(text); }
      var range = document.createRange();
      range.selectNodeContents(document.getElementById('snippet'));
      window.getSelection().removeAllRanges(); window.getSelection().addRange(range);
      copy.textContent = 'Copied';
    });
  }
  if (!data.live || !window.EventSource) { return; }
  var progress = document.getElementById('progress');
  var source = new EventSource('/v1/studies/' + encodeURIComponent(data.name) + '/events');
  source.addEventListener('trial', function (ev) {
    var t = JSON.parse(ev.data);
    if (seen[t.number]) { return; }
    seen[t.number] = true;
    points.push({n: t.number, v: t.samples_per_s, s: t.status});
    draw();
    var row = document.createElement('tr');
    [t.number, t.status, t.samples_per_s === null ? '' : t.samples_per_s.toFixed(1), t.schedule].forEach(
      function (v) { var td = document.createElement('td'); td.textContent = v; row.appendChild(td); });
    document.querySelector('#trials tbody').appendChild(row);
    var done = parseInt(progress.dataset.launched, 10) + (inflight[t.number] ? 0 : 1);
    var given = parseInt(progress.dataset.budget, 10), budget = given ? Math.max(given, done) : 0;
    progress.dataset.launched = done;
    progress.querySelector('.bar > span').style.width = Math.min(100, Math.floor(100 * done / (budget || 1))) + '%';
    progress.lastChild.textContent = ' ' + done + '/' + (budget || '?');
    document.getElementById('status').textContent = 'running';
    var best = Math.max.apply(null, points.filter(function (p) { return p.v !== null; })
                                             .map(function (p) { return p.v; }).concat([-1]));
    if (t.samples_per_s !== null && t.samples_per_s >= best) {
      document.getElementById('best').textContent = t.samples_per_s.toFixed(1) + ' samples/s (trial ' +
        t.number + '): ' + t.schedule;
    }
  });
  source.addEventListener('done', function () { source.close(); location.reload(); });
})();
</script>"""


def login_page(problem: str = "") -> str:
    """The token form (sets an HttpOnly cookie); shown when a page is asked for without a valid token."""
    note = f"<p role=alert>{escape(problem)}</p>" if problem else ""
    body = (f"<h1>autoslapo</h1>{note}<form method=post action=/login><label>Token "
            f"<input name=token type=password autocomplete=off size=60></label> <button>Sign in</button></form>"
            f"<p>Make a token with <code>autoslapo token create --name NAME --role read</code>.</p>")
    return _page("autoslapo: sign in", body)


def missing_page(message: str, title: str = "not found") -> str:
    """A page asked for what is not there (a study name mistyped), or asked wrongly (a query parameter
    the page does not take): the error, and the way back."""
    return _page(f"autoslapo: {title}", f"<h1>autoslapo</h1><p role=alert>{escape(message)}</p>"
                                        "<p><a href='/'>all studies</a></p>")
