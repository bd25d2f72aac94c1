"""A bounded load test of ``autoslapo serve`` on loopback: readers and submitters against one server.

    .venv/bin/python experiments/load_service.py [--readers 50] [--submitters 8] [--seconds 60]
                                                [--trials 5] [--think 0] [--nice 0] [--no-postgres]
                                                [--client-procs 1] [--no-warmup] [--no-stagger]
                                                [--output FILE]

One server with ``--workers 2`` on a fresh SQLite file (then on a private PostgreSQL started with
tests/pgserver.py, when the binaries are installed). ``--readers`` clients loop over
``GET /v1/best`` and ``GET /v1/studies`` (pausing ``--think`` s after each pair; 0: back to back);
``--submitters`` clients each submit a small sim study
(``--trials``), wait for it to end, and submit the next, for ``--seconds``. Then the submitted
studies are drained (at most ``--drain`` s) and each one is checked: complete, with exactly its
budget of launched trials. Reports the count of 5xx, p50/p99 latency per endpoint (measured by the
clients, which share the machine with the server), the server's own view of ``/v1/best`` (its
latency histogram) and how late its event loop ran (its loop-lag probe: the share of the clients'
latency that the server adds outside its request handlers), how late the client's event loop ran (latency it adds to every request), the
machine's load average during the run and the CPU seconds of server and client, and the budget
check. The readers stand for separate machines: before the clock starts each opens its keep-alive
connection with one untimed request (``--no-warmup``: not), and with ``--think`` each starts at its
own offset within the pause (``--no-stagger``: all at once, so that they stay in step and every
second hit the server, and this one client process, as one burst of 50).
``--client-procs N`` splits the readers over N processes (one event loop each), so that one Python
client's per-request cost (httpx: ~2.5 ms of CPU) is not queued 50 deep in a single loop; the
tally and the CPU seconds add up all of them. ``--nice N`` runs the server (its workers keep their +10 below it), this client and the private
PostgreSQL at
niceness N: a negative N (root only) shields them from unrelated work sharing the machine, to
approximate an idle one; say so wherever the numbers are quoted. Bounded: everything listens on
127.0.0.1 and stops at the end. Committed output: experiments/results/load_service.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing import Queue, get_context
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoslapo.service import create_token  # noqa: E402
from store import open_store  # noqa: E402

BEST = "/v1/best?model=bert&gpus=8&gpu_type=a100-80gb"
P99_TARGET_MS = 50.0


@dataclass
class Tally:
    """What the clients saw: latencies per endpoint, status codes, submitted studies."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {"best": [], "studies": [], "submit": []})
    codes: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    submitted: dict[str, int] = field(default_factory=dict)
    loop_lag: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)

    async def call(self, client: httpx.AsyncClient, kind: str, method: str, path: str,
                   **kw: object) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            r = await client.request(method, path, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as err:
            self.errors[type(err).__name__] += 1
            return None
        self.latencies[kind].append((time.perf_counter() - started) * 1000)
        self.codes[r.status_code] += 1
        return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    """``serve --workers 2`` on ``url``; it inherits this process's niceness (see ``--nice``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOSLAPO_STORAGE": url}
    p = subprocess.Popen([sys.executable, "-m", "autoslapo", "serve", "--port", str(port), "--workers", "2"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            time.sleep(0.2)
    stop_server(p)
    raise SystemExit("autoslapo serve did not answer /healthz within 60 s")


def stop_server(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()  # the server stops its workers on the way out
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


async def wait_done(client: httpx.AsyncClient, name: str, deadline: float) -> dict | None:
    while time.monotonic() < deadline:
        try:
            r = await client.get(f"/v1/studies/{name}")
            if r.status_code == 200 and r.json()["status"] not in ("queued", "running"):
                return dict(r.json())
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.25)
    return None


async def reader(client: httpx.AsyncClient, tally: Tally, stop: float, think: float, offset: float = 0.0) -> None:
    """Loop over best+studies until ``stop``, first waiting ``offset`` s (so that readers started
    together do not stay in step, as separate machines would not be)."""
    await asyncio.sleep(offset)
    while time.monotonic() < stop:
        await tally.call(client, "best", "GET", BEST)
        await tally.call(client, "studies", "GET", "/v1/studies")
        if think > 0:
            await asyncio.sleep(think)


async def watch(tally: Tally, stop: float) -> None:
    """Every 10 ms: how late the client's own event loop woke (it adds that to the latencies it
    measures); every second: the machine's 1-minute load average."""
    last_load = 0.0
    while time.monotonic() < stop:
        asked = time.perf_counter()
        await asyncio.sleep(0.01)
        tally.loop_lag.append((time.perf_counter() - asked - 0.01) * 1000)
        if time.monotonic() - last_load >= 1.0:
            last_load = time.monotonic()
            tally.load.append(os.getloadavg()[0])


async def submitter(client: httpx.AsyncClient, tally: Tally, stop: float, index: int, trials: int) -> None:
    j = 0
    while time.monotonic() < stop:
        name = f"load-{index}-{j}"
        body = {"model": "bert", "gpus": 8, "trials": trials, "backend": "sim", "name": name, "baselines": False}
        r = await tally.call(client, "submit", "POST", "/v1/studies", json=body)
        if r is not None and r.status_code == 202:
            tally.submitted[name] = trials
            await wait_done(client, name, stop)
        else:
            await asyncio.sleep(0.5)
        j += 1


async def warm(client: httpx.AsyncClient, count: int) -> None:
    """Open ``count`` keep-alive connections with one untimed request each (a reader's first request
    otherwise pays for a TCP handshake and a new connection on both sides, all at the same instant)."""
    await asyncio.gather(*(client.get(BEST) for _ in range(count)))


async def read_load(base: str, token: str, readers: int, args: argparse.Namespace, start: float,
                    first: int = 0) -> Tally:
    """``readers`` readers (numbered from ``first`` of ``args.readers``, for their start offsets)
    from ``start`` (monotonic) for ``args.seconds``, with the ``watch`` probe."""
    tally = Tally()
    limits = httpx.Limits(max_connections=readers + 2)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=30) as rc:
        if args.warmup:
            await warm(rc, readers)
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        stop = start + args.seconds
        spread = args.think if args.stagger else 0.0
        await asyncio.gather(*(reader(rc, tally, stop, args.think, spread * (first + i) / args.readers)
                               for i in range(readers)), watch(tally, stop))
    return tally


def read_process(base: str, token: str, readers: int, first: int, args: argparse.Namespace, start: float,
                 out: Queue) -> None:
    """A reader process (``--client-procs``): its tally goes back through ``out``."""
    tally = asyncio.run(read_load(base, token, readers, args, start, first))
    out.put((tally.latencies, dict(tally.codes), dict(tally.errors), tally.loop_lag, tally.load,
             own_cpu_seconds()))


async def load(base: str, tokens: dict[str, str], args: argparse.Namespace,
               start: float) -> tuple[Tally, dict[str, dict | None]]:
    """This process's share of the load (its readers and every submitter) from ``start``; other
    reader processes run beside it."""
    tally = Tally()
    mine = args.readers - (args.readers * (args.client_procs - 1)) // args.client_procs
    limits = httpx.Limits(max_connections=args.submitters + 4)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {tokens['submit']}"},
                                 limits=limits, timeout=30) as sc:
        read = asyncio.get_running_loop().create_task(read_load(base, tokens["read"], mine, args, start))
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        stop = start + args.seconds
        await asyncio.gather(*(submitter(sc, tally, stop, i, args.trials) for i in range(args.submitters)))
        merge(tally, await read)
        deadline = time.monotonic() + args.drain
        ends = await asyncio.gather(*(wait_done(sc, n, deadline) for n in tally.submitted))
    return tally, dict(zip(tally.submitted, ends, strict=True))


def merge(into: Tally, part: Tally) -> None:
    for kind, values in part.latencies.items():
        into.latencies[kind].extend(values)
    into.codes.update(part.codes)
    into.errors.update(part.errors)
    into.loop_lag.extend(part.loop_lag)
    into.load.extend(part.load)


def run_load(base: str, tokens: dict[str, str],
             args: argparse.Namespace) -> tuple[Tally, dict[str, dict | None], float, float]:
    """The whole load: ``--client-procs`` - 1 reader processes beside this one, all starting at one
    instant once every process has warmed its connections. Returns the tally, the submitted
    studies' ends, the reader processes' CPU seconds and the (monotonic) start of the timed load."""
    ctx = get_context("fork")
    out: Queue = ctx.Queue()
    start = time.monotonic() + 2.0 + 0.5 * args.client_procs  # time for every process to warm up
    procs, first = [], args.readers - (args.readers * (args.client_procs - 1)) // args.client_procs
    for _ in range(args.client_procs - 1):
        count = args.readers // args.client_procs
        procs.append(ctx.Process(target=read_process, args=(base, tokens["read"], count, first, args, start, out)))
        first += count
    for p in procs:
        p.start()
    tally, ends = asyncio.run(load(base, tokens, args, start))
    cpu = 0.0
    for _ in procs:
        latencies, codes, errors, lag, load_avg, used = out.get(timeout=args.seconds + 120)
        merge(tally, Tally(latencies=latencies, codes=Counter(codes), errors=Counter(errors), loop_lag=lag,
                           load=load_avg))
        cpu += used
    for p in procs:
        p.join(timeout=30)
    return tally, ends, cpu, start


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(url: str, label: str, args: argparse.Namespace) -> list[str]:
    with open_store(url) as store:
        tokens = {role: create_token(store, f"load-{role}", role) for role in ("read", "submit")}
    port = free_port()
    server = start_server(url, port)
    server_nice = os.getpriority(os.PRIO_PROCESS, server.pid)
    base = f"http://127.0.0.1:{port}"
    try:
        seed = httpx.post(f"{base}/v1/studies", headers={"Authorization": f"Bearer {tokens['submit']}"},
                          json={"model": "bert", "gpus": 8, "trials": args.trials, "backend": "sim",
                                "name": "seed", "baselines": False}, timeout=30)
        seed.raise_for_status()
        end = time.monotonic() + 120
        while time.monotonic() < end and httpx.get(f"{base}{BEST}", timeout=30,
                                                   headers={"Authorization": f"Bearer {tokens['read']}"}
                                                   ).status_code != 200:
            time.sleep(0.5)
        server_cpu, client_cpu = cpu_seconds(server.pid), own_cpu_seconds()
        lag_before = server_loop_lag(base, tokens["read"])
        tally, ends, readers_cpu, started = run_load(base, tokens, args)
        elapsed = time.monotonic() - started
        server_cpu, client_cpu = cpu_seconds(server.pid) - server_cpu, own_cpu_seconds() - client_cpu + readers_cpu
        seen_by_server = server_best_histogram(base, tokens["read"])
        lag = {le: n - lag_before.get(le, 0.0) for le, n in server_loop_lag(base, tokens["read"]).items()}
    finally:
        stop_server(server)
    five = sum(n for code, n in tally.codes.items() if code >= 500)
    other = {code: n for code, n in sorted(tally.codes.items()) if code >= 400 and code < 500}
    at_budget = sum(1 for name, doc in ends.items() if doc is not None and doc["status"] == "complete"
                    and doc["launched"] == tally.submitted[name])
    lines = [f"== {label}: {args.readers} readers (pause {args.think:g} s after each best+studies pair), "
             f"{args.submitters} submitters, {args.seconds:.0f} s (+ drain {elapsed - args.seconds:.1f} s), "
             f"2 workers, studies of {args.trials} sim trials; nice: server {server_nice}, its workers "
             f"{min(19, server_nice + 10)}, client {os.getpriority(os.PRIO_PROCESS, 0)}; readers in "
             f"{args.client_procs} client process(es), connections {'warmed' if args.warmup else 'cold'}, starts "
             f"{'staggered' if args.stagger and args.think > 0 else 'together'}"]
    total = sum(tally.codes.values())
    lines.append(f"requests answered: {total} ({total / elapsed:.0f}/s); 5xx: {five}; 4xx: {other or 0}; "
                 f"transport errors: {dict(tally.errors) or 0}")
    for kind in ("best", "studies", "submit"):
        values = tally.latencies[kind]
        lines.append(f"{kind:8s} n={len(values):6d}  p50 {pct(values, 0.5):8.1f} ms  p99 {pct(values, 0.99):8.1f} ms"
                     f"  max {max(values, default=float('nan')):8.1f} ms")
    if seen_by_server:
        under = {le: n / seen_by_server["+Inf"] for le, n in seen_by_server.items() if le != "+Inf"}
        lines.append("server-side /v1/best (request in to first byte out, its histogram): "
                     + ", ".join(f"{100 * share:.1f}% <= {float(le) * 1000:g} ms" for le, share in under.items()
                                 if float(le) <= 0.1) + f" of {seen_by_server['+Inf']:.0f}")
    if lag.get("+Inf"):
        p99_le = min((float(le) for le, n in lag.items() if n >= 0.99 * lag["+Inf"]), default=float("inf"))
        lines.append("server event-loop lag (how late its probe woke, every 10 ms, during the load and drain): "
                     + ", ".join(f"{100 * n / lag['+Inf']:.1f}% <= {float(le) * 1000:g} ms" for le, n in lag.items()
                                 if le != "+Inf" and 0.005 <= float(le) <= 0.1)
                     + f"; p99 <= {p99_le * 1000:g} ms")
    lines.append(f"client event-loop lag: p50 {pct(tally.loop_lag, 0.5):.1f} ms, p99 {pct(tally.loop_lag, 0.99):.1f} ms"
                 f" (added to every latency above); machine load average (1 min) during the run: mean "
                 f"{sum(tally.load) / max(1, len(tally.load)):.1f}, max {max(tally.load, default=0):.1f} on "
                 f"{os.cpu_count()} cores; CPU seconds: server {server_cpu:.0f}, client {client_cpu:.0f} "
                 f"(of {elapsed * (os.cpu_count() or 1):.0f} core-seconds)")
    p99 = pct(tally.latencies["best"], 0.99)
    lines.append(f"GET /v1/best p99 {p99:.1f} ms: {'meets' if p99 < P99_TARGET_MS else 'misses'} the "
                 f"{P99_TARGET_MS:.0f} ms target")
    lines.append(f"submitted studies: {len(ends)}; ended complete at exactly their budget: {at_budget}/{len(ends)}")
    bad = [n for n, doc in ends.items() if doc is None or doc["status"] != "complete"
           or doc["launched"] != tally.submitted[n]]
    if bad:
        shown = [(n, ends[n] or {"status": "still running", "launched": "?"}) for n in bad[:10]]
        lines.append("not at budget: " + ", ".join(f"{n} ({doc['status']}, {doc['launched']})" for n, doc in shown))
    return lines


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_best_histogram(base: str, token: str) -> dict[str, float]:
    """The server's cumulative ``/v1/best`` latency buckets (``le`` -> count) from ``/metrics``."""
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    found = re.findall(r'autoslapo_http_request_seconds_bucket\{le="([^"]+)",route="/v1/best"\} (\S+)', text)
    return {le: float(n) for le, n in found}


def server_loop_lag(base: str, token: str) -> dict[str, float]:
    """The server's cumulative event-loop lag buckets (``le`` -> count) from ``/metrics``."""
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    found = re.findall(r'autoslapo_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)', text)
    return {le: float(n) for le, n in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=50)
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--trials", type=int, default=5, help="budget of each submitted sim study")
    parser.add_argument("--drain", type=float, default=180.0, help="longest wait for submitted studies to end")
    parser.add_argument("--think", type=float, default=0.0, help="each reader's pause after a best+studies pair (s)")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="split the readers over this many client processes (the submitters stay in the first)")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="do not open the readers' connections (one untimed request each) before the clock starts")
    parser.add_argument("--no-stagger", dest="stagger", action="store_false",
                        help="start every reader at once rather than spread over the --think pause")
    parser.add_argument("--nice", type=int, default=0, help="niceness of server and client (negative: root only)")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--output", type=Path, default=None, help="also write the report here")
    args = parser.parse_args()
    if not 1 <= args.client_procs <= max(1, args.readers):
        parser.error(f"--client-procs must be 1-{max(1, args.readers)} (at most one per reader): got {args.client_procs}")
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)
    out = [f"# autoslapo serve under load on loopback ({platform.node()}, {os.cpu_count()} cores, "
           f"Python {platform.python_version()}); client and server share the machine"]
    with tempfile.TemporaryDirectory(prefix="autoslapo-load-") as tmp:
        out += run(f"sqlite:///{Path(tmp) / 'load.db'}", "sqlite", args)
        print("\n".join(out), flush=True)
    if args.no_postgres:
        out.append("== postgresql: skipped (--no-postgres)")
    else:
        from tests.pgserver import PgServer, unavailable_reason

        reason = unavailable_reason()
        if reason:
            out.append(f"== postgresql: skipped ({reason})")
        else:
            with PgServer() as pg:
                lines = run(pg.create_database("load"), "postgresql (private server, fsync off)", args)
            out += lines
            print("\n".join(lines), flush=True)
    if args.output:
        args.output.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
