"""Rerun every experiment and regenerate the committed tables and plots in experiments/results/.

    python experiments/run_all.py            # everything that exists (GPU checks only with CUDA)
    python experiments/run_all.py --quick    # smoke run: scripts that take --quick get it
    python experiments/run_all.py --only tuned_vs_baselines report_bert64

Each experiment is its own script (run in a fresh interpreter, so one failure does not stop the
rest); ``report_bert64`` is the report of ``autoslapo tune bert --gpus 64`` (sim backend) plus a
screenshot of its page in headless Chromium when one is installed. A summary of what ran, how long
it took and how it ended goes to ``experiments/results/run_all.json``; the exit code is 1 if any
experiment failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

# In order: cheap and pure first, then the ones that launch ranks or need a GPU.
SCRIPTS = [
    "validate_cost_model",
    "bench_cost_model",
    "bench_store",
    "bench_schedule",
    "bench_vs_slapo",
    "bench_tuner",
    "tuned_vs_baselines",
    "overheads",
    "check_albert_gpt_neo",
    "gpu_check",
]
GPU_ONLY = {"gpu_check"}
STEPS = [*SCRIPTS, "report_bert64"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _has_slapo() -> bool:
    # where bench_vs_slapo looks for it (a plain import, then its default directory), without importing it
    import importlib.util

    return importlib.util.find_spec("slapo") is not None or Path("/tmp/slapo-pkg/slapo").is_dir()


def run_script(name: str, quick: bool, timeout_s: float) -> dict[str, Any]:
    """Run ``experiments/<name>.py`` in its own interpreter; returns its status line."""
    path = HERE / f"{name}.py"
    if not path.exists():
        return {"name": name, "status": "missing"}
    if name in GPU_ONLY and not _has_cuda():
        return {"name": name, "status": "skipped", "why": "needs a CUDA device"}
    if name == "bench_vs_slapo" and not _has_slapo():
        return {"name": name, "status": "skipped", "why": "needs Slapo installed outside the project (see its docstring)"}
    cmd = [sys.executable, str(path)]
    if quick and "--quick" in path.read_text():
        cmd.append("--quick")
    return _run(name, cmd, timeout_s)


def _run(name: str, cmd: list[str], timeout_s: float) -> dict[str, Any]:
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=_env(), timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"name": name, "status": "timeout", "seconds": round(time.perf_counter() - start, 1)}
    seconds = round(time.perf_counter() - start, 1)
    tail = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-3:]
    for line in tail:
        print(f"   {line}")
    status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
    return {"name": name, "status": status, "seconds": seconds, "tail": tail}


def report_bert64(trials: int, timeout_s: float) -> dict[str, Any]:
    """``autoslapo tune bert --gpus 64`` (sim) in a scratch store, its report, and a page screenshot."""
    out = RESULTS / "report_bert64"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autoslapo-runall-") as tmp:
        storage = f"sqlite:///{Path(tmp) / 'bert64.db'}"
        cli = [sys.executable, "-m", "autoslapo"]
        for step in (
            ["tune", "bert", "--gpus", "64", "--backend", "sim", "--trials", str(trials), "--storage", storage],
            ["report", "bert-large-64xa100-80gb-sim", "--output", str(out), "--storage", storage],
        ):
            result = _run("report_bert64", [*cli, *step], timeout_s)
            if result["status"] != "ok":
                return result
    shot = screenshot(out / "index.html", RESULTS / "report_screenshot.png")
    return {"name": "report_bert64", "status": "ok", "seconds": round(time.perf_counter() - start, 1),
            "screenshot": "written" if shot else "skipped (no chromium)"}


def screenshot(page: Path, target: Path, *, width: int = 1280, height: int = 2000) -> Path | None:
    """Open ``page`` in headless Chromium and save a half-size PNG of it; None without Chromium."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    with tempfile.TemporaryDirectory(prefix="autoslapo-chromium-") as profile:
        raw = Path(profile) / "shot.png"
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}/data", f"--screenshot={raw}", f"--window-size={width},{height}",
             page.resolve().as_uri()],
            capture_output=True, timeout=120, check=True,
        )
        from PIL import Image

        with Image.open(raw) as img:
            small = img.convert("RGB").resize((width // 2, height // 2), Image.Resampling.LANCZOS)
            small = small.quantize(colors=128)  # a committed file: keep it small
            small.save(target, optimize=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (scripts that accept --quick)")
    parser.add_argument("--only", nargs="+", choices=STEPS, default=None, metavar="NAME",
                        help=f"run only these ({', '.join(STEPS)})")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per experiment (default 3600)")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = []
    for name in args.only or STEPS:
        if name == "report_bert64":
            summary.append(report_bert64(30 if args.quick else 100, args.timeout))
        else:
            summary.append(run_script(name, args.quick, args.timeout))
        print(f"   -> {summary[-1]['status']}", flush=True)
    doc = {"quick": args.quick, "cuda": _has_cuda(), "experiments": summary}
    if not args.only:
        (RESULTS / "run_all.json").write_text(json.dumps(doc, indent=2) + "\n")
    failed = [s["name"] for s in summary if s["status"] not in ("ok", "missing", "skipped")]
    print("failed: " + ", ".join(failed) if failed else "all experiments that exist ran")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
