"""``autoslapo tune --server URL``: submit the study to the service and follow it to its end."""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace
from typing import Any

from autoslapo.cli._knobs import knob_values
from autoslapo.cli._links import link_args
from autoslapo.cli._shape import shape_overrides
from autoslapo.config import describe
from autoslapo.errors import AutoslapoError, UsageError
from autoslapo.models.resolve import resolve_model
from search_spaces import SearchSpace, load_space, space_for

POLL_S = 1.0
# Flags that change what runs locally only; the service would silently ignore them, so refuse them.
_LOCAL_ONLY = ("storage", "ray_address", "dispatch", "repeats", "max_concurrent", "steps", "trial_timeout",
               "no_warm_start")


def _space(args: argparse.Namespace) -> SearchSpace | None:
    """The space ``--space`` and the knob flags describe (None: the server uses the family's)."""
    pins = knob_values(args, "tune")
    if not args.space and not pins:
        return None
    space = load_space(args.space) if args.space else space_for(resolve_model(args.model).family)
    return space.pin(pins) if pins else space


def run_remote(args: argparse.Namespace, bar: Any) -> int:
    """Submit, print progress until the study ends, then the table of the best trials. Returns 0 (1: none complete)."""
    from autoslapo.remote import Client, model_field
    from tuner.options import check_timeout

    check_timeout(args.timeout)  # before it is sent: nan and inf are not JSON
    given = [f"--{k.replace('_', '-')}" for k in _LOCAL_ONLY if getattr(args, k, None)]
    if shape_overrides(args):
        given.append("shape flags")
    if given:
        them = "them" if len(given) > 1 or given == ["shape flags"] else "it"
        raise UsageError(f"--server submits a plain study: {', '.join(given)} cannot be sent; drop {them} or tune locally")
    body: dict[str, Any] = {"model": model_field(args.model), "gpus": args.gpus, "backend": args.backend or "sim",
                            "trials": args.trials, "sampler": args.sampler, "seed": args.seed,
                            "baselines": not args.no_baselines}
    body.update(link_args(args))
    for key, value in (("gpu_type", args.gpu_type), ("gpus_per_node", args.gpus_per_node),
                       ("global_batch", args.global_batch), ("timeout_s", args.timeout),
                       ("patience", args.patience), ("name", args.study)):
        if value is not None:
            body[key] = value
    if args.resume:
        if not args.study:
            raise UsageError("--resume with --server continues a submitted study: name it with --study")
        body["resume"] = True  # the server keeps the space the study began with unless one is sent
    if args.join:
        if not args.study:
            raise UsageError("--join with --server shares a study on the server: name it with --study")
        body["join"] = True  # the server submits it, follows it while it runs (raising its budget), or continues it
    space = _space(args)
    if space is not None:
        body["space"] = space.to_dict()  # sent as data: the server checks it with the same code
    client = Client(args.server)
    submitted = client.post("/v1/studies", body)
    name = submitted["name"]
    if submitted.get("note"):  # a resume with nothing to run: the service says how to run more
        sys.stderr.write(f"autoslapo tune: {submitted['note']}\n")
    seen = -1
    try:
        try:
            while True:
                doc = client.get(f"/v1/studies/{name}")
                if doc["launched"] != seen:
                    seen = doc["launched"]
                    best = (doc.get("best") or {}).get("samples_per_s") or 0.0
                    bar(SimpleNamespace(launched=seen, budget=doc["budget"] or args.trials, best=best,
                                        counts=doc["counts"], last=doc["status"]))
                if doc["status"] not in ("queued", "running"):
                    break
                if doc["status"] == "queued" and doc.get("error"):  # why it waits (a model file, no worker for it)
                    bar(SimpleNamespace(launched=seen, budget=doc["budget"] or args.trials, best=0.0,
                                        counts=doc["counts"], last=f"queued: {doc['error']}"))
                time.sleep(POLL_S)
        finally:
            bar.close()
    except KeyboardInterrupt:  # the client stops following; the study is the server's and goes on
        sys.stderr.write(f"autoslapo tune: stopped following study {name!r}, which goes on at {client.url}: follow it "
                         f"again with --study {name} --join, cancel it with POST /v1/studies/{name}/cancel\n")
        raise
    out = sys.stdout
    out.write(f"study {name}: {doc['launched']} trials launched, status {doc['status']} "
              f"({doc['model']} on {doc['gpus']}x {doc['gpu_type']}, backend {doc['backend']}, server {client.url})\n")
    if doc["status"] == "failed":
        raise AutoslapoError(f"the service's run of study {name!r} failed: {doc.get('error')}")
    rows = client.get(f"/v1/studies/{name}/trials", sort="samples_per_s", status="complete", limit=args.top)["trials"]
    if not rows:
        out.write(f"no trial completed: see GET {client.url}/v1/studies/{name}/trials for the reasons\n")
        return 1
    out.write(f"{'#':>4} {'samples/s':>11} {'TFLOP/s/dev':>11} {'mem GiB':>8}  schedule\n")
    for t in rows:
        mem = (t["peak_memory_bytes"] or 0) / 2**30
        out.write(f"{t['number']:>4} {t['samples_per_s'] or 0:>11,.1f} {t['tflops_per_device'] or 0:>11.1f} "
                  f"{mem:>8.1f}  {describe(t['config'])}\n")
    return 0
