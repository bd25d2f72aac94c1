"""``autoslapo tune``: search schedules for a model on a cluster; every trial goes to the store.

Shows a live progress bar (trial, best so far, status counts) on stderr and ends with a table of
the best schedules and the tuned schedule's speedup over a DeepSpeed-style and a Megatron-style
baseline scored by the same evaluator. ``--resume`` continues an interrupted study to its budget.
With ``--backend sim`` (and no ``--sampler``) every valid configuration is scored instead of
sampled (``tuner/sweep.py``): the output says how many were scored, how many do not fit, and the
cost model's exact optimum over the space.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any, TextIO

from autoslapo.cli._knobs import add_knob_arguments, knob_values
from autoslapo.cli._links import add_link_arguments, link_args
from autoslapo.cli._shape import add_shape_arguments, shape_overrides
from autoslapo.cli.studies import figure
from autoslapo.config import describe
from autoslapo.errors import UsageError
from autoslapo.redact import redact
from autoslapo.stats import interval_samples
from autoslapo.storage import check_study_name

SAMPLER_NAMES = ("tpe", "random", "grid", "cmaes", "gp", "nsga2")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo tune``."""
    parser.add_argument("model", help="model preset (bert, bert-tiny, gpt2-xl, llama-70b, ...; see `autoslapo models`), a Hugging Face config.json or a model file (.py)")
    parser.add_argument("--gpus", type=int, required=True, help="number of devices (ranks) a trial uses")
    parser.add_argument("--gpu-type", default=None,
                        help="device preset (default: for --backend local / ray, the preset of this machine's first "
                             "CUDA device, cpu without one; else a100-80gb)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="devices a node (default 8; cpu: --gpus)")
    add_link_arguments(parser)
    parser.add_argument("--backend", choices=["sim", "local", "ray"], default=None,
                        help="sim: cost model; local: real trials on this machine's ranks; ray: real trials "
                             "placed by Ray (default: local if this machine has --gpus CUDA devices, else sim)")
    parser.add_argument("--trials", type=int, default=100,
                        help="launched trials (predicted-OOM configurations are pruned, not counted); with --backend "
                             "sim, the best configurations stored (default 100)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop the search S seconds after it starts (walking and ranking the space count); a "
                             "sim sweep stores the best configurations scored by then")
    parser.add_argument("--patience", type=int, default=None,
                        help="stop after K trials without a new best (a sampled search: with --backend sim, give "
                             "--sampler)")
    parser.add_argument("--storage", default=None, help="store URL (default $AUTOSLAPO_STORAGE or sqlite:///autoslapo.db)")
    parser.add_argument("--study", default=None, help="study name (default <model>-<gpus>x<gpu-type>-<backend>, with -2, -3 ... when "
                        "a study of that name exists: a new study each time; a name given here must be new)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the study named by --study (without it: the newest study of the default "
                             "name, or its -2, -3 ..., that is not complete)")
    parser.add_argument("--join", action="store_true",
                        help="create the study named by --study, or join it: tuners started with the same "
                             "--study and --join share its budget (e.g. on one PostgreSQL store; with --server, the "
                             "server submits it, follows it while it runs, raising its budget to --trials, or "
                             "continues it when it ended short)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--global-batch", type=int, default=None, help="sequences an optimizer step (default per space)")
    parser.add_argument("--sampler", choices=SAMPLER_NAMES, default=None,
                        help="Optuna sampler (nsga2: throughput vs memory, prints the Pareto front; default tpe); "
                             "--backend sim scores every configuration unless a sampler is given")
    parser.add_argument("--space", default=None, help="search space file (.toml or .json) instead of the family's")
    parser.add_argument("--ray-address", default=None, help="join this Ray cluster (implies Ray dispatch)")
    parser.add_argument("--dispatch", choices=["inline", "ray"], default=None,
                        help="run trials in this process or through Ray Tune (default: ray for --backend ray)")
    parser.add_argument("--max-concurrent", type=int, default=None, help="trials at once under Ray (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps a real trial runs (default 4)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="after the search, re-measure the best 3 trials and the baselines N more times in "
                             "interleaved rounds (A B C A B C ...); throughput is the median, each speedup gets a "
                             "95%% bootstrap interval (default 3 for --backend local/ray, 0 for sim)")
    parser.add_argument("--trial-timeout", type=float, default=None,
                        help="seconds before a real trial times out (default 300)")
    parser.add_argument("--no-warm-start", action="store_true", help="do not start from earlier studies")
    parser.add_argument("--no-baselines", action="store_true", help="skip the DeepSpeed/Megatron baselines")
    parser.add_argument("--top", type=int, default=5, help="rows in the final table (default 5)")
    parser.add_argument("--server", default=None,
                        help="submit the study to a running `autoslapo serve` at this URL and follow it "
                             "(token: $AUTOSLAPO_TOKEN; backend sim or ray)")
    add_knob_arguments(parser, "tune")
    add_shape_arguments(parser)


def _cuda_device_names() -> list[str]:
    """This machine's CUDA devices by name, as ``nvidia-smi -L`` lists them ("GPU 0: NVIDIA H100 80GB
    HBM3 (UUID: ...)"); none without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split(":", 1)[1].split("(UUID")[0].strip() for line in out.stdout.splitlines()
            if line.startswith("GPU ") and ":" in line]


def default_gpu_type(backend: str, cuda_names: list[str]) -> str:
    """``--gpu-type``'s default: real trials (``local``, ``ray``) run on this machine's kind of device,
    the preset of its first CUDA device's name (``cuda_names``), ``cpu`` without one; a described
    cluster (``sim``), or a device without a preset, is an A100-80GB."""
    from autoslapo.cluster import DEFAULT_GPU_TYPE, preset_for_device_name

    if backend in ("local", "ray"):
        if not cuda_names:
            return "cpu"
        return preset_for_device_name(cuda_names[0]) or DEFAULT_GPU_TYPE
    return DEFAULT_GPU_TYPE


class ProgressBar:
    """One live line on a terminal (else a line every tenth of the budget, and of a phase that reports
    its configurations done: ranking or scoring the space)."""

    def __init__(self, stream: TextIO, budget: int) -> None:
        self.stream, self.budget = stream, budget
        self.tty = stream.isatty()
        self.step = max(1, budget // 10)
        self.t0 = time.monotonic()
        self.tenth: tuple[str, int, int] | None = None  # the phase and tenth of it a line was last written for

    def __call__(self, p: Any) -> None:
        width = 24
        done = min(width, int(width * p.launched / max(1, p.budget)))
        counts = " ".join(f"{k} {v}" for k, v in sorted(p.counts.items()))
        line = (f"[{'#' * done}{'.' * (width - done)}] {p.launched}/{p.budget} best {p.best:,.1f} samples/s "
                f"| {counts} | {p.last} | {time.monotonic() - self.t0:.0f}s")
        part, of = getattr(p, "done", None), getattr(p, "of", None)
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            self.stream.flush()
        elif part is not None and of:  # a phase's progress: a line at each tenth of it
            tenth = (p.last.split(":")[0], of, part * 10 // of)
            if tenth != self.tenth:
                self.tenth = tenth
                self.stream.write(line + "\n")
        elif p.launched % self.step == 0 or p.launched == p.budget:
            self.stream.write(line + "\n")

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def run(args: argparse.Namespace) -> int:
    """Run or resume a study; print the table. Returns 0."""
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.resolve import resolve_model

    if args.top < 1:
        raise UsageError(f"--top must be a positive integer: got {args.top}")
    if args.server:
        from autoslapo.cli._remote_tune import run_remote

        return run_remote(args, ProgressBar(sys.stderr, args.trials))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    backend = args.backend
    cuda = [] if backend == "sim" else _cuda_device_names()  # asked once: a described cluster needs none
    if backend is None:
        backend = "local" if len(cuda) >= args.gpus else "sim"
    gpu_type = args.gpu_type or default_gpu_type(backend, cuda)
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node must be a positive integer: got {args.gpus_per_node}")
    if args.ray_address and args.dispatch == "inline":
        raise UsageError("--ray-address places trials through Ray: it cannot go with --dispatch inline; "
                         "drop one of them")
    auth = os.environ.get("RAY_AUTH_MODE", "")
    if args.ray_address and auth != "token":
        # Trials are code run on the cluster's nodes: join only a cluster that checks who joins.
        raise UsageError(
            f"--ray-address joins a Ray cluster only with its token authentication: got RAY_AUTH_MODE={auth!r}; "
            "set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
        )
    if args.ray_address:
        from tuner.dispatch import join_ray

        join_ray(args.ray_address)  # before the store changes: a cluster that cannot be joined is bad input
    if backend == "local" and gpu_type != "cpu" and len(cuda) < args.gpus:
        raise UsageError(f"--backend local runs --gpus {args.gpus} ranks on this machine's CUDA devices: it has "
                         f"{len(cuda)}; use --gpu-type cpu, fewer --gpus, or --backend sim")
    per_node = args.gpus_per_node or (args.gpus if gpu_type == "cpu" else 8)
    model = resolve_model(args.model, **shape_overrides(args))
    cluster = ClusterSpec(gpus=args.gpus, gpu_type=gpu_type, gpus_per_node=per_node).with_links(link_args(args))
    from search_spaces import load_space, space_for

    pins = knob_values(args, "tune")
    space = load_space(args.space) if args.space else None
    if pins:  # pinned knobs: fixed in the study's space, whatever it searched
        space = (space or space_for(model.family)).pin(pins)
    dispatch = args.dispatch or ("ray" if backend == "ray" or args.ray_address else "inline")
    if backend == "sim" and args.repeats:  # an estimate is the same every time: nothing to re-measure
        raise UsageError(f"--repeats re-measures real trials (--backend local or ray): got --repeats {args.repeats} "
                         "with --backend sim; drop --repeats or run real trials")
    repeats = args.repeats if args.repeats is not None else (3 if backend in ("local", "ray") else 0)
    real = [f for f, v in (("--steps", args.steps), ("--trial-timeout", args.trial_timeout)) if v is not None]
    if backend == "sim" and real:  # an estimate runs no steps: say so rather than ignore them
        raise UsageError(f"{' and '.join(real)} set how real trials run (--backend local or ray): got them with "
                         "--backend sim; drop them or run real trials")
    if args.max_concurrent is not None and dispatch != "ray":
        raise UsageError(f"--max-concurrent sets how many trials Ray runs at once: got --max-concurrent "
                         f"{args.max_concurrent} without Ray; drop it, or use --backend ray (or --dispatch ray)")
    if args.study is not None and not args.resume:
        check_study_name(args.study)  # a new study's (an existing one is resumed by the name it has)

    from store import open_store
    from tuner import TuneOptions, tune

    options = TuneOptions(
        model=model, cluster=cluster, backend=backend, trials=args.trials, timeout_s=args.timeout,
        patience=args.patience, sampler=args.sampler or "tpe", seed=args.seed, global_batch=args.global_batch,
        space=space, study=args.study, resume=args.resume, join=args.join, warm_start=not args.no_warm_start,
        dispatch=dispatch, ray_address=args.ray_address, max_concurrent=args.max_concurrent if args.max_concurrent is not None else 1,
        steps=args.steps if args.steps is not None else 4,
        trial_timeout_s=args.trial_timeout if args.trial_timeout is not None else 300.0,
        baselines=not args.no_baselines, repeats=repeats,
        sweep=False if args.sampler else None,  # an explicit sampler samples, on sim too
    )
    store = open_store(args.storage)
    bar = ProgressBar(sys.stderr, args.trials)
    t0 = time.monotonic()
    opened: list[str] = []

    def on_open(name: str) -> None:
        opened.append(name)
        if args.resume and args.study is None:  # the default name's newest interrupted study: say which
            sys.stderr.write(f"autoslapo tune: resuming study {name}\n")

    try:
        outcome = tune(options, store, progress=bar, opened=on_open)
    except KeyboardInterrupt:
        bar.close()
        if opened:  # the study is stopped (its trials kept): name it and how to go on
            again = "rejoin it" if args.join else "resume it"
            sys.stderr.write(redact(f"autoslapo tune: study {opened[-1]} stopped; {again} with: "
                                    f"{resume_command(args, opened[-1])}") + "\n")
        raise
    except BaseException:
        bar.close()
        raise
    bar.close()
    out = sys.stdout
    where = f"{model.preset} on {cluster.described_as()}, backend {backend}"
    if outcome.sweep is not None:
        out.write(sweep_line(outcome.study, outcome.sweep, time.monotonic() - t0, where) + "\n")
        if cluster.gpu_type != "cpu":  # what the GPU presets describe, not autoslapo's own runtime
            out.write("estimates of the published runs' Megatron-LM / DeepSpeed stack (16-bit weights and gradients); "
                      "autoslapo's own trials (--backend local or ray) keep fp32 ones and need more memory\n")
    else:
        out.write(f"study {outcome.study}: {outcome.launched} trials launched, {outcome.pruned} pruned as "
                  f"predicted OOM, stopped by {outcome.stop_reason}, {time.monotonic() - t0:.1f}s ({where})\n")
    rows = sorted((t for t in store.trials(outcome.study) if t.status == "complete"),
                  key=lambda t: -(t.samples_per_s or 0.0))
    if not rows and outcome.stop_reason == "timeout" and outcome.launched == 0:
        out.write(f"no trial completed: --timeout {args.timeout:g} s ran out before the first trial (walking and ranking the "
                  f"space is part of the search); give a longer --timeout, or go on with: "
                  f"{redact(resume_command(args, outcome.study, drop=('timeout',)))}\n")
        return 1
    if not rows:
        out.write("no trial completed: see `autoslapo show " + outcome.study + "` for the reasons\n")
        return 1
    if options.sampler == "nsga2":  # a two-objective search: show its trade-off, fastest first
        from autoslapo.result import pareto_front

        points = [(float(t.peak_memory_bytes or 0), float(t.samples_per_s or 0.0)) for t in rows]
        front = sorted(pareto_front(points), key=lambda i: -points[i][1])
        rows = [rows[i] for i in front]
        out.write(f"Pareto front of throughput vs memory per device ({len(rows)} schedules):\n")
    rows = rows[: args.top]
    out.write(f"{'#':>4} {'samples/s':>11} {'TFLOP/s/dev':>11} {'mem GiB':>8}  schedule\n")
    for t in rows:
        mem = (t.peak_memory_bytes or 0) / 2**30
        out.write(f"{t.number:>4} {t.samples_per_s or 0:>11,.1f} {figure(t.tflops_per_device or 0):>11} "
                  f"{mem:>8.1f}  {describe(t.config, model.family)}\n")
    note = repeats_note(rows)
    if note:
        out.write(note + "\n")
    if outcome.sweep is not None and outcome.best_config is not None and outcome.best_result is not None:
        what = ("optimum of the cost model over the space" if "of" not in outcome.sweep else
                f"best of the {outcome.sweep['scored']:,} configurations scored before the timeout")
        out.write(f"{what}: {outcome.best_result.samples_per_s:,.1f} samples/s: "
                  f"{describe(outcome.best_config.to_dict(), model.family)}\n")
    for name, b in outcome.baselines.items():
        out.write(speedup_line(name, b, model.family) + "\n")
    return 0


def sweep_line(study: str, summary: dict[str, Any], elapsed_s: float, where: str) -> str:
    """``study S: scored every valid configuration, 58,320: 58,320 fit, 0 do not fit ...; 8.6s in all``.

    ``summary``: ``Sweep.summary`` (configurations scored, counts per status, trials stored);
    ``elapsed_s``: the whole study's time (space, scoring, store, baselines).
    """
    counts = summary["counts"]
    fit = counts.get("complete", 0)
    others = ", ".join(f"{n:,} {status}" for status, n in sorted(counts.items())
                       if status not in ("complete", "pruned"))
    scored = (f"scored every valid configuration, {summary['scored']:,}" if "of" not in summary else
              f"stopped by timeout after scoring {summary['scored']:,} of {summary['of']:,} valid configurations")
    return (f"study {study}: {scored}: "
            f"{fit:,} fit, {counts.get('pruned', 0):,} do not fit (pruned as predicted OOM)"
            f"{', ' + others if others else ''}; stored the best {summary['stored']}; {elapsed_s:.1f}s in all "
            f"({where})")


def resume_command(args: argparse.Namespace, study: str, *, drop: tuple[str, ...] = ()) -> str:
    """The command that goes on with ``study``: this one's flags (those given a value other than their
    default, less the ``drop`` dests), with ``--resume --study STUDY`` (``--join --study STUDY`` for a joined study)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    words = ["autoslapo", "tune"]
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if action.dest in ("resume", "join", "study", *drop) or value is None or value == action.default:
            continue
        if not action.option_strings:
            words.append(str(value))
        elif action.nargs == 0:  # a switch (store_true)
            words.append(action.option_strings[-1])
        else:
            words += [action.option_strings[-1], str(value)]
    words += ["--join" if args.join else "--resume", "--study", study]
    return shlex.join(words)


def speedup_line(name: str, b: dict[str, Any], family: str | None = None) -> str:
    """``speedup over deepspeed-style baseline: 1.19x (95% CI 1.07-1.31, 3 interleaved repeats; ...)``.

    ``b``: a baseline summary of ``score_baselines``; ``family``: the model's (its knobs alone shown). An interval that holds 1.0 reads "no
    significant speed-up"; without repeats (estimates) the line has no interval.
    """
    head = f"speedup over {name}-style baseline:"
    if b["speedup"] is None:
        return f"{head} n/a (baseline {b['status']}: {b['reason']})"
    base = f"baseline {b['samples_per_s']:,.1f} samples/s: {describe(b['config'], family)}"
    ci = b.get("speedup_ci95")
    if not ci:
        return f"{head} {b['speedup']:.2f}x ({base})"
    value = f"{ci['speedup']:.2f}x" if ci["significant"] else f"no significant speed-up, {ci['speedup']:.2f}x"
    return f"{head} {value} (95% CI {ci['low']:.2f}-{ci['high']:.2f}, {interval_samples(ci)}; {base})"


def repeats_note(rows: list[Any]) -> str | None:
    """The line under the table on its re-measured trials (stored rows with ``result.extra``), or None.

    Counted from the samples stored: after resumes a trial holds every run's repeats."""
    repeated = [t for t in rows if t.result.get("extra", {}).get("repeats_samples_per_s")]
    if not repeated:
        return None
    counts = sorted({len(t.result["extra"]["repeats_samples_per_s"]) for t in repeated})
    n = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    again = str(counts[0] - 1) if len(counts) == 1 else f"{counts[0] - 1}-{counts[-1] - 1}"
    return (f"samples/s of the re-measured trials ({', '.join(f'#{t.number}' for t in repeated)}): median of "
            f"{n} measurements (the search's and {again} interleaved repeat{'s' if again != '1' else ''})")
