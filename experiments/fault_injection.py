"""Fault injection: kill the tuner, break trials, take the database away; count what is lost.

    .venv/bin/python experiments/fault_injection.py            # everything (~15-25 min on 2 cores)
    .venv/bin/python experiments/fault_injection.py --quick    # sim faults and bad inputs only

Faults injected (all real: signals to real processes, a real PostgreSQL server stopped):
* ``kill -9`` of ``autoslapo tune`` at random moments of simulated studies (SQLite and PostgreSQL)
  and of a real local study (CPU ranks, gpt2-tiny) while a trial runs; each kill is followed by
  ``--resume``; afterwards no rank process of the killed tuner may be left;
* trial faults inside one real search: a rank killed, a rank that hangs (SIGSTOP), a memory cap
  the trial goes over (oom), a loss that goes non-finite (lr 1e30); each must be stored with its
  status and reason while the search goes on to its budget;
* PostgreSQL stopped mid-study (``pg_ctl stop -m immediate``) and restarted: a short outage the
  store's retries ride out, and a long one the tuner stops on cleanly and ``--resume`` finishes;
* the bad-input corpus of ``tests/hardening/bad_inputs.py`` through the CLI.

Writes ``experiments/results/reliability.md`` (the table) and prints it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.hardening.harness import audit, env, tune_argv  # noqa: E402

OUT = ROOT / "experiments" / "results" / "reliability.md"


@dataclass
class Row:
    """One line of the reliability table."""

    fault: str
    injected: int = 0
    survived: int = 0
    lost: int = 0
    duplicated: int = 0
    left_running: int = 0
    notes: list[str] = field(default_factory=list)


def rank_pids(tag: str) -> list[int]:
    """Live rank processes (``autoslapo.runtime.worker``) whose trial directory contains ``tag``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if "autoslapo.runtime.worker" in cmd and tag in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def _popen(argv: list[str], log: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    out = open(log, "a")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**env(), **(extra_env or {})})


def _count(url: str, study: str, status: str | None = None) -> int:
    from store import open_store

    try:
        with open_store(url) as s:
            if not s.has_study(study):
                return 0
            return len(s.trials(study, status=status)) if status else s.count_trials(study)
    except Exception:  # the database may be down on purpose
        return 0


def kill_and_resume(row: Row, url: str, study: str, budget: int, kills: int, rng: random.Random, work: Path,
                    *, argv_extra: tuple[str, ...] = (), model: str = "bert-base", gpus: int = 16,
                    gpu_type: str = "v100-32gb", backend: str = "sim", when_running: bool = False,
                    max_wait_s: float = 120.0) -> None:
    """``kills`` times: start (or resume) the tuner, kill -9 it mid-study; then resume to the end.

    Adds to ``row``; the study's kills count as survived when the final audit finds nothing lost,
    duplicated or left running.
    """
    injected0 = row.injected
    tag = f"fi-{study}-"
    tmp = Path(tempfile.mkdtemp(prefix=tag, dir=work))
    log = work / f"{study}.log"
    for k in range(kills):
        exists = _count(url, study) > 0
        argv = tune_argv(url, study, budget, model=model, gpus=gpus, gpu_type=gpu_type, backend=backend,
                         extra=(*argv_extra, *(("--resume",) if exists else ())))
        proc = _popen(argv, log, {"TMPDIR": str(tmp)})
        before = _count(url, study)
        t0 = time.monotonic()
        if when_running:  # kill while a trial runs (its ranks alive)
            while time.monotonic() - t0 < max_wait_s and proc.poll() is None and not rank_pids(tag):
                time.sleep(0.2)
            time.sleep(rng.uniform(0.5, 3.0))
        else:  # kill after a random number of new rows, or at a random moment of start-up
            target = before + rng.randint(0, max(1, (budget - before) // 3))
            while time.monotonic() - t0 < max_wait_s and proc.poll() is None and _count(url, study) < target:
                time.sleep(0.05)
        if proc.poll() is not None:
            row.notes.append(f"{study}: kill {k + 1} came after the tuner ended (rc {proc.returncode})")
            continue
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        row.injected += 1
        time.sleep(2.5)  # rank watchdogs poll their parent every second
        orphans = rank_pids(tag)
        if orphans:
            row.left_running += len(orphans)
            row.notes.append(f"{study}: {len(orphans)} rank processes outlived the killed tuner")
            for pid in orphans:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    argv = tune_argv(url, study, budget, model=model, gpus=gpus, gpu_type=gpu_type, backend=backend,
                     extra=(*argv_extra, "--resume"))
    rc = _popen(argv, log, {"TMPDIR": str(tmp)}).wait(timeout=1800)
    a = audit(url, study)
    lost = a.lost(budget) if rc == 0 else budget
    row.lost += lost
    row.duplicated += a.duplicated
    row.left_running += a.running
    if rc == 0 and lost == 0 and a.duplicated == 0 and a.running == 0 and row.left_running == 0:
        row.survived += row.injected - injected0
    else:
        row.notes.append(f"{study}: final resume rc {rc}, audit {a}")


def sim_kills(rows: list[Row], work: Path, rng: random.Random, pg_url: str | None, studies: int, kills: int) -> None:
    row = Row("kill -9 of `autoslapo tune`, simulated study, SQLite")
    for i in range(studies):
        kill_and_resume(row, f"sqlite:///{work / f'sim{i}.db'}", f"sim{i}", 120, kills, rng, work)
    rows.append(row)
    if pg_url:
        prow = Row("kill -9 of `autoslapo tune`, simulated study, PostgreSQL")
        kill_and_resume(prow, pg_url, "simpg", 120, max(2, kills // 2), rng, work)
        rows.append(prow)


def real_kills(rows: list[Row], work: Path, rng: random.Random, kills: int) -> None:
    row = Row("kill -9 of `autoslapo tune` during a real trial (local CPU ranks)")
    kill_and_resume(row, f"sqlite:///{work / 'real.db'}", "real", 3, kills, rng, work, model="gpt2-tiny",
                    gpus=1, gpu_type="cpu", backend="local", when_running=True, max_wait_s=300,
                    argv_extra=("--steps", "2", "--seq-len", "32", "--trial-timeout", "300"))
    rows.append(row)


@dataclass
class FaultyEvaluator:
    """The real local runtime, with one fault planned per trial (by launch order)."""

    plan: list[str]
    tag: str
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    name: str = "local"
    instant: bool = False

    def _signal_rank(self, sig: int, delay: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300:
            pids = rank_pids(self.tag)
            if pids:
                time.sleep(delay)
                for pid in rank_pids(self.tag):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
                return
            time.sleep(0.2)

    def evaluate(self, config: Any) -> Any:
        from autoslapo.models.spec import ModelSpec
        from autoslapo.result import TrialResult
        from autoslapo.runtime import run_trial

        fault = self.plan[len(self.seen)] if len(self.seen) < len(self.plan) else "none"
        kw: dict[str, Any] = dict(steps=3, warmup=1, timeout_s=300.0, device="cpu")
        if fault == "nan":
            kw["lr"] = 1e30
        elif fault == "oom":
            kw["mem_cap_bytes"] = 150 * 2**20
        elif fault == "hang":
            kw["timeout_s"] = 40.0
            threading.Thread(target=self._signal_rank, args=(signal.SIGSTOP, 3.0), daemon=True).start()
        elif fault == "kill":
            threading.Thread(target=self._signal_rank, args=(signal.SIGKILL, 3.0), daemon=True).start()
        try:
            r = run_trial(ModelSpec.from_name("gpt2-tiny", seq_len=32), config, **kw)
        except Exception as err:  # a trial that cannot run is data
            r = TrialResult.failure("failed", f"{type(err).__name__}: {err}")
        self.seen.append((fault, r.status, r.reason))
        return r


def trial_faults(rows: list[Row], work: Path) -> None:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec
    from store import open_store
    from tuner import TuneOptions, tune

    tag = "fi-trialfaults-"
    tempfile.tempdir = tempfile.mkdtemp(prefix=tag, dir=work)  # rank directories carry the tag
    plan = ["kill", "hang", "oom", "nan", "none"]
    ev = FaultyEvaluator(plan, tag)
    url = f"sqlite:///{work / 'trialfaults.db'}"
    model = ModelSpec.from_name("gpt2-tiny", seq_len=32)
    cluster = ClusterSpec(gpus=1, gpu_type="cpu", gpus_per_node=1)
    with open_store(url) as store:
        out = tune(TuneOptions(model=model, cluster=cluster, backend="local", trials=len(plan), study="faults",
                               baselines=False, warm_start=False), store, evaluator=ev)
        stored = {t.number: t for t in store.trials("faults")}
    tempfile.tempdir = None
    # A rank killed by SIGKILL from outside (no memory cap reached, no kernel OOM report, no rise of
    # the cgroup's oom_kill counter) is failed, its reason naming the signal and the missing evidence.
    want = {"kill": ("failed",), "hang": ("timeout",), "oom": ("oom",), "nan": ("failed",),
            "none": ("complete",)}
    a = audit(url, "faults")
    for fault, status, reason in ev.seen:
        if fault == "none":
            continue
        row = Row({"kill": "a trial's rank process killed (SIGKILL)", "hang": "a trial that hangs (rank SIGSTOPped)",
                   "oom": "a trial over its memory cap (oom)", "nan": "a trial whose loss goes NaN"}[fault])
        row.injected = 1
        ok = status in want[fault] and out.launched == len(plan) and a.duplicated == 0 and a.running == 0
        row.survived = int(ok)
        row.lost = 0 if out.launched == len(plan) else 1
        row.notes.append(f"stored as {status}: {reason[:90]}")
        rows.append(row)
    orphans = rank_pids(tag)
    if orphans:
        rows[-1].left_running += len(orphans)
    print(json.dumps({n: (t.status, t.reason[:80]) for n, t in stored.items()}, indent=1))


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ray_worker_kill(rows: list[Row], work: Path) -> None:
    """A real trial under ``--backend ray`` (local Ray): kill -9 the Ray worker running it."""
    row = Row("a Ray worker process killed during a real trial")
    url, study, budget = f"sqlite:///{work / 'ray.db'}", "ray", 2
    log = work / "ray.log"
    proc = _popen(tune_argv(url, study, budget, model="gpt2-tiny", gpus=1, gpu_type="cpu", backend="ray",
                            extra=("--steps", "2", "--seq-len", "32")), log)
    t0, victim, ranks = time.monotonic(), 0, []
    while time.monotonic() - t0 < 400 and proc.poll() is None and not victim:
        for pid in rank_pids(""):
            parent = _ppid(pid)
            if "ray::" in _cmdline(parent) and _ppid(parent) and _is_ours(parent, proc.pid):
                victim, ranks = parent, [pid]
                break
        time.sleep(0.3)
    if victim:
        time.sleep(2.0)
        os.kill(victim, signal.SIGKILL)
        row.injected = 1
    rc = proc.wait(timeout=900)
    time.sleep(2.5)
    left = [p for p in ranks if Path(f"/proc/{p}").exists() and _ppid(p) != 0
            and Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]
    a = audit(url, study) if rc == 0 else None
    if a is not None:
        row.lost, row.duplicated, row.left_running = a.lost(budget), a.duplicated, a.running + len(left)
        row.survived = int(row.injected == 1 and row.lost == row.duplicated == row.left_running == 0)
        row.notes.append(f"statuses {a.statuses}")
    else:
        row.lost = budget
        row.notes.append(f"tuner exit {rc}: {log.read_text()[-300:]!r}")
    if not victim:
        row.notes.append("no Ray worker with a running trial was found")
    rows.append(row)


def _is_ours(pid: int, root: int) -> bool:
    """True if ``pid`` belongs to the Ray session our tuner ``root`` started (its raylet is a descendant)."""
    seen = 0
    while pid > 1 and seen < 64:
        if pid == root:
            return True
        pid, seen = _ppid(pid), seen + 1
    return False


def pg_outages(rows: list[Row], work: Path, rng: random.Random) -> None:
    from tests.pgserver import PgServer, unavailable_reason

    if unavailable_reason():
        print("PostgreSQL unavailable:", unavailable_reason())
        return
    server = PgServer().start()
    assert server.dir is not None
    data = str(server.dir / "data")
    # The test server runs without fsync; an immediate stop is a crash, so here it must be durable
    # (a committed trial must survive it, as on a production server).
    opts = (f"-p {server.port} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on "
            f"-c full_page_writes=on -c max_connections=200 -k {server.dir}")
    server._run(str(server.bin_dir / "pg_ctl"), "-D", data, "-l", str(server.dir / "log"), "-o", opts,
                "-w", "-t", "60", "-m", "fast", "restart")
    try:
        for outage_s, label in ((2.0, "short"), (25.0, "long")):
            row = Row(f"PostgreSQL stopped mid-study for {outage_s:.0f} s, then restarted")
            url = server.create_database(f"outage_{label}")
            study, budget = f"out{label}", 400
            log = work / f"{study}.log"
            proc = _popen(tune_argv(url, study, budget), log)
            t0 = time.monotonic()
            while _count(url, study) < 60 and proc.poll() is None and time.monotonic() - t0 < 120:
                time.sleep(0.05)
            if proc.poll() is not None:
                row.notes.append("the study ended before the outage")
                rows.append(row)
                continue
            server._run(str(server.bin_dir / "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
            row.injected = 1
            time.sleep(outage_s)
            server._run(str(server.bin_dir / "pg_ctl"), "-D", data, "-l", str(server.dir / "log"), "-o", opts,
                        "-w", "-t", "60", "start")
            rc = proc.wait(timeout=600)
            text = log.read_text()
            if rc != 0:
                last = [ln for ln in text.splitlines() if ln.strip()][-1:]
                clean = "Traceback" not in text
                row.notes.append(f"tuner stopped with exit {rc}{'' if clean else ' WITH A TRACEBACK'}: "
                                 f"{last[0][:140] if last else ''}; resumed")
                rc = _popen(tune_argv(url, study, budget, extra=("--resume",)), log).wait(timeout=600)
            else:
                row.notes.append("the tuner rode out the outage on the store's retries")
            a = audit(url, study)
            row.lost = a.lost(budget) if rc == 0 else budget
            row.duplicated, row.left_running = a.duplicated, a.running
            row.survived = int(rc == 0 and row.lost == row.duplicated == row.left_running == 0)
            rows.append(row)
    finally:
        server.stop()


def bad_inputs() -> tuple[int, int, list[str]]:
    """Run the corpus in-process (as the tests do); returns (tried, handled, failures)."""
    with tempfile.TemporaryDirectory(prefix="fi-bad-") as tmp:
        return _bad_inputs_in(Path(tmp))


def _bad_inputs_in(d: Path) -> tuple[int, int, list[str]]:
    import hashlib

    from autoslapo.cli import main
    from tests.hardening.bad_inputs import CASES, SECRET, fill, write_space_files

    db = d / "seed.db"
    url = f"sqlite:///{db}"
    subprocess.run([*tune_argv(url, "seeded", 5, model="bert-tiny", gpus=4, gpu_type="a100-80gb")], check=True,
                   capture_output=True, env=env(), cwd=d)
    notdb = d / "notes.txt"
    notdb.write_text("hello, not a database\n")
    spaces = write_space_files(d)
    os.environ["AUTOSLAPO_STORAGE"] = url
    os.environ.pop("RAY_AUTH_MODE", None)
    cwd = os.getcwd()
    os.chdir(d)
    handled, failures = 0, []
    try:
        for cid, argv, expected in CASES:
            before = hashlib.sha256(db.read_bytes()).hexdigest()
            err, out = io.StringIO(), io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                try:
                    code = main(fill(argv, url=url, dir=d, notdb=notdb, spaces=spaces))
                except SystemExit as e:
                    code = int(e.code or 0)
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            ok = (code == 2 and len(lines) == 1 and "Traceback" not in err.getvalue()
                  and expected.lower() in lines[0].lower() and SECRET not in err.getvalue() + out.getvalue()
                  and hashlib.sha256(db.read_bytes()).hexdigest() == before)
            handled += ok
            if not ok:
                failures.append(f"{cid}: exit {code}, {err.getvalue()[-200:]!r}")
    finally:
        os.chdir(cwd)
        os.environ.pop("AUTOSLAPO_STORAGE", None)
    return len(CASES), handled, failures


def table(rows: list[Row], bad: tuple[int, int, list[str]], elapsed: float) -> str:
    lines = [
        "| fault injected | injected | survived | trials lost | duplicated | left running |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.fault} | {r.injected} | {r.survived} | {r.lost} | {r.duplicated} | {r.left_running} |")
    tot = Row("**all faults**")
    for r in rows:
        tot.injected += r.injected
        tot.survived += r.survived
        tot.lost += r.lost
        tot.duplicated += r.duplicated
        tot.left_running += r.left_running
    lines.append(f"| **all faults** | **{tot.injected}** | **{tot.survived}** | **{tot.lost}** | "
                 f"**{tot.duplicated}** | **{tot.left_running}** |")
    tried, handled, failures = bad
    lines += ["", "| bad inputs through the CLI | tried | handled (exit 2, one line, no traceback, store unchanged) |",
              "|---|---:|---:|", f"| tests/hardening/bad_inputs.py | {tried} | {handled} |", ""]
    notes = [f"- {r.fault}: {n}" for r in rows for n in r.notes] + [f"- bad input not handled: {f}" for f in failures]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    lines.append(f"Produced by `experiments/fault_injection.py` in {elapsed / 60:.1f} min "
                 f"({time.strftime('%Y-%m-%d')}).")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="simulated kills and bad inputs only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--studies", type=int, default=3, help="simulated SQLite studies, each killed --kills times")
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--real-kills", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="+", choices=("sim", "pg", "trial", "real", "ray", "bad"), default=None,
                    help="run only these parts (the table then holds only them)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="fi-") as tmp:
        work = Path(tmp)
        parts = set(args.only or (("sim", "bad") if args.quick else ("sim", "pg", "trial", "real", "ray", "bad")))
        pg_url = None
        server = None
        if "sim" in parts and not args.quick:
            from tests.pgserver import PgServer, unavailable_reason

            if unavailable_reason() is None:
                server = PgServer().start()
                pg_url = server.create_database("kills")
        try:
            if "sim" in parts:
                sim_kills(rows, work, rng, pg_url, args.studies, args.kills)
        finally:
            if server is not None:
                server.stop()
        print(table(rows, (0, 0, []), time.monotonic() - t0), flush=True)
        if "pg" in parts:
            pg_outages(rows, work, rng)
            print(table(rows, (0, 0, []), time.monotonic() - t0), flush=True)
        if "trial" in parts:
            trial_faults(rows, work)
            print(table(rows, (0, 0, []), time.monotonic() - t0), flush=True)
        if "real" in parts:
            real_kills(rows, work, rng, args.real_kills)
        if "ray" in parts:
            ray_worker_kill(rows, work)
    bad = bad_inputs() if "bad" in parts else (0, 0, [])
    text = table(rows, bad, time.monotonic() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("# Reliability: faults injected and bad inputs\n\n" + text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
