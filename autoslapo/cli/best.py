"""``autoslapo best``: the best recorded schedule for a model on a cluster, from the store."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from autoslapo.cli._links import add_link_arguments, link_args
from autoslapo.cli._links import flag as _flag
from autoslapo.cli._shape import add_shape_arguments, shape_overrides
from autoslapo.errors import AutoslapoError, UsageError

if TYPE_CHECKING:
    from autoslapo.models.spec import ModelSpec
    from store import Store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo best``."""
    parser.add_argument("model", help="model preset (bert, gpt2-xl, llama-70b, ...; see `autoslapo models`), a Hugging Face config.json or a model file (.py)")
    parser.add_argument("--gpus", type=int, required=True, help="number of devices")
    parser.add_argument("--gpu-type", default=None, help="device preset (default: any)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="only studies of nodes of this many devices (default: any; the answer names its node size)")
    add_link_arguments(parser)
    parser.add_argument("--storage", default=None, help="store URL (default $AUTOSLAPO_STORAGE or sqlite:///autoslapo.db)")
    parser.add_argument("--metric", default="samples_per_s",
                        choices=["samples_per_s", "tokens_per_s", "tflops_per_device", "hw_tflops_per_device"])
    parser.add_argument("--global-batch", type=int, default=None, metavar="N",
                        help="only trials that ran at this global batch, micro_batch x grad_accum x dp "
                             "(default: any; the answer names its batch, `autoslapo studies` each study's)")
    parser.add_argument("--measured", "--measured-only", dest="measured", action="store_true",
                        help="only measured trials (no cost-model estimates)")
    parser.add_argument("--headroom", default=None, metavar="GIB|PCT",
                        help="leave at least this much device memory free at peak: GiB (e.g. 8) or a "
                             "share of the device (e.g. 10%%); trials with unknown memory are dropped")
    parser.add_argument("--json", action="store_true", help="print the schedule and its metrics as JSON")
    parser.add_argument("--server", default=None,
                        help="ask a running `autoslapo serve` at this URL instead of the store (token: $AUTOSLAPO_TOKEN)")
    add_shape_arguments(parser)


def parse_headroom(text: str | None) -> tuple[int | None, float | None]:
    """``--headroom``: "10%" -> (None, 0.10); "8" or "8GiB" -> (8 GiB in bytes, None); None -> (None, None)."""
    if text is None:
        return None, None
    raw = text.strip()
    try:
        if raw.endswith("%"):
            share = float(raw[:-1]) / 100.0
            if not 0 <= share < 1:
                raise ValueError
            return None, share
        gib = float(raw[:-3] if raw.lower().endswith("gib") else raw)
        if not 0 <= gib < 2**40:  # nan and inf too
            raise ValueError
        return int(gib * 1024**3), None
    except ValueError:
        raise UsageError(
            f"--headroom must be GiB (e.g. 8) or a share of device memory below 100% (e.g. 10%): got {text!r}"
        ) from None


NOISE_KEYS = ("repeats_samples_per_s", "samples_per_s_spread", "speedup_ci95")


def measurement_noise(result: dict[str, Any]) -> dict[str, Any]:
    """The repeats, their spread and the speed-up intervals a stored result carries in ``extra``
    (``tuner/repeats.py``); keys without a value are left out."""
    extra = result.get("extra") or {}
    return {k: extra[k] for k in NOISE_KEYS if extra.get(k) is not None}


def run(args: argparse.Namespace) -> int:
    """Print the best schedule; exit 1 when the store has none for this model and cluster."""
    from autoslapo.cluster import MAX_GPUS
    from autoslapo.models.resolve import resolve_model
    from autoslapo.storage import require_store

    if args.gpus < 1:
        raise UsageError(f"--gpus must be a positive integer: got {args.gpus}")
    if args.gpus > MAX_GPUS:
        raise UsageError(f"--gpus must be at most {MAX_GPUS:,} (2**20, beyond the largest machines built): "
                         f"got {args.gpus:,}; give a smaller --gpus")
    if args.gpu_type is not None:
        from autoslapo.cluster import DEVICES

        if args.gpu_type not in DEVICES:
            raise UsageError(f"--gpu-type must be one of {', '.join(DEVICES)}: got {args.gpu_type!r}")
    links = link_args(args)  # (None: a study of any links)
    if args.gpus_per_node is not None:
        from autoslapo.cluster import ClusterSpec

        if args.gpus_per_node < 1:
            raise UsageError(f"--gpus-per-node must be a positive integer: got {args.gpus_per_node}")
        ClusterSpec(gpus=args.gpus, gpus_per_node=args.gpus_per_node)  # whole nodes, as `tune` refuses them
    if args.global_batch is not None:
        from autoslapo.layout import check_global_batch

        check_global_batch(args.global_batch)  # a batch `tune` could have run, as it refuses others
    if args.server:
        return _remote(args)
    model = resolve_model(args.model, **shape_overrides(args))
    headroom = parse_headroom(args.headroom)
    with require_store(args.storage, read_only=True) as store:  # a read: never creates a store or writes one
        return _answer(args, store, model, links, headroom)


def _answer(args: argparse.Namespace, store: Store, model: ModelSpec, links: dict[str, Any],
            headroom: tuple[int | None, float | None]) -> int:
    """``run``'s answer from the open ``store``."""
    from autoslapo.best_batch import best_at_batch
    from autoslapo.cluster import ClusterSpec
    from autoslapo.storage import config_global_batch

    headroom_bytes, headroom_fraction = headroom
    per_node, batch = args.gpus_per_node, args.global_batch
    cluster = {"metric": args.metric, "links": links, "gpus_per_node": per_node}
    found = best_at_batch(store, model.signature(), args.gpus, args.gpu_type, batch, measured_only=args.measured,
                          min_headroom_bytes=headroom_bytes, min_headroom_fraction=headroom_fraction, **cluster)
    if not found:
        where = f"{args.gpus}x {args.gpu_type}" if args.gpu_type else f"{args.gpus} devices"
        given = "".join(f" {_flag(k)} {v:g}" for k, v in {**links, "gpus_per_node": per_node}.items() if v is not None)
        given += f" --global-batch {batch}" if batch is not None else ""
        filters = [f for f, on in (("--measured", args.measured), (f"--headroom {args.headroom}", args.headroom))
                   if on]
        unfiltered = best_at_batch(store, model.signature(), args.gpus, args.gpu_type, batch,
                                   **cluster) if filters else []
        if unfiltered:
            free = [((store.get_study(t.study).gpu_memory_bytes or 0) - (t.peak_memory_bytes or 0),
                     store.get_study(t.study).gpu_memory_bytes or 0) for t in unfiltered if t.peak_memory_bytes]
            most = (f"; the most a stored trial leaves free is {max(free)[0] / 2**30:.1f} GiB of "
                    f"{max(free)[1] / 2**30:.1f} GiB a device" if args.headroom and free else
                    "; trials that do not are stored")
            raise AutoslapoError(
                f"no complete trial of {model.preset} on {where}{' with' + given if given else ''} passes "
                f"{' and '.join(filters)} in {store.url}{most}; relax it"
                + (", or tune with a measuring backend (--backend local or ray)" if args.measured else "")
            )
        if batch is not None:
            _other_batches(args, store, model, cluster, where, given)
        raise AutoslapoError(
            f"no complete trial of {model.preset} on {where}{' with' + given if given else ''} in {store.url}; "
            f"run `autoslapo tune {args.model} --gpus {args.gpus}{given}` first"
        )
    t = found[0]
    study = store.get_study(t.study)
    node = ClusterSpec.from_dict(study.cluster).gpus_per_node  # a schedule's tp and links hold for this node size
    doc = {
        "model": study.model_name, "gpus": study.gpus, "gpu_type": study.gpu_type, "study": t.study,
        "trial": t.number, "backend": study.backend, "measured": t.measured, "config": t.config,
        "global_batch": config_global_batch(t.config),
        "samples_per_s": t.samples_per_s, "tokens_per_s": t.tokens_per_s,
        "tflops_per_device": t.tflops_per_device, "hw_tflops_per_device": t.hw_tflops_per_device,
        "peak_memory_bytes": t.peak_memory_bytes,
        "step_time_s": t.step_time_s, "gpus_per_node": node,
        **measurement_noise(t.result),
    }
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    from autoslapo.config import describe
    from autoslapo.storage import study_label

    kind = f"{'measured' if t.measured else 'estimated'} at global batch {doc['global_batch']}"
    noise = doc.get("repeats_samples_per_s")
    if noise:
        kind += f", median of {len(noise)} runs, IQR {doc.get('samples_per_s_spread', 0.0):,.1f}"
    sys.stdout.write(f"{study_label(study)} on {study.gpus}x {study.gpu_type} ({node} a node): "
                     f"{_value(args.metric, doc)} ({kind}, study {t.study} trial {t.number})\n"
                     f"  {describe(t.config, model.family)}\n")
    if t.measured and not noise and study.status != "complete":  # its finalists were not measured again
        sys.stdout.write(f"  one measurement: study {t.study} is {study.status}, so its best were not re-measured yet "
                         f"(`autoslapo tune ... --study {t.study} --resume`, with the flags it was tuned with, does)\n")
    return 0


def _other_batches(args: argparse.Namespace, store: Store, model: ModelSpec, cluster: dict[str, Any],
                   where: str, given: str) -> None:
    """Raise the error of a ``--global-batch`` none of whose trials are stored when the model and
    cluster (``cluster``: ``best_trials``'s filters of it) were tuned at other global batches, naming
    them; return when they were not tuned at all. ``where``, ``given``: the cluster and flags as asked."""
    from autoslapo.best_batch import batch_list, stored_global_batches, that_one

    batches = stored_global_batches(store, model.signature(), args.gpus, args.gpu_type, **cluster)
    if batches:
        raise AutoslapoError(
            f"no complete trial of {model.preset} on {where} with{given} in {store.url}: its trials ran at global "
            f"batch {batch_list(batches)}; give --global-batch {that_one(batches)}, or run "
            f"`autoslapo tune {args.model} --gpus {args.gpus}{given}` first"
        )


def _value(metric: str, doc: dict[str, Any]) -> str:
    """The ranked metric first, then samples/s when it is another."""
    units = {"samples_per_s": ("samples/s", ",.1f"), "tokens_per_s": ("tokens/s", ",.0f"),
             "tflops_per_device": ("model TFLOP/s a device", ".1f"), "hw_tflops_per_device": ("TFLOP/s a device with recompute", ".1f")}
    unit, spec = units.get(metric, units["samples_per_s"])
    text = f"{format(doc.get(metric) or 0.0, spec)} {unit}"
    return text if metric == "samples_per_s" else f"{text}, {doc.get('samples_per_s') or 0.0:,.1f} samples/s"


def _remote(args: argparse.Namespace) -> int:
    """``best --server``: the same answer from the service's ``GET /v1/best``."""
    from autoslapo.config import describe
    from autoslapo.remote import Client, model_query
    from autoslapo.storage import config_global_batch

    if args.headroom or args.storage or shape_overrides(args):
        raise UsageError("--server asks the service by preset, config.json or model file: --headroom, --storage "
                         "and shape flags are not sent; drop them or ask the store directly")
    from autoslapo.models.resolve import is_model_file, resolve_model

    spec = resolve_model(args.model) if is_model_file(args.model) else None  # asked for by its signature
    query = spec.signature() if spec is not None else model_query(args.model)
    client = Client(args.server)
    try:
        doc = client.get("/v1/best", model=query, gpus=args.gpus, gpu_type=args.gpu_type, metric=args.metric,
                         measured_only=args.measured or None, gpus_per_node=args.gpus_per_node,
                         global_batch=args.global_batch, **link_args(args))
    except UsageError as err:
        if spec is None or "answered 404" not in str(err) or query not in str(err):
            raise
        raise UsageError(_file_missing(args, spec.preset, query, str(err), client.url)) from None
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    batch = doc.get("global_batch") or config_global_batch(doc["config"])  # a server before it sent one
    kind = f"{'measured' if doc['measured'] else 'estimated'} at global batch {batch}"
    sys.stdout.write(f"{doc['model']} on {doc['gpus']}x {doc['gpu_type']}: {_value(args.metric, doc)} "
                     f"({kind}, study {doc['study']} trial {doc['trial']})\n"
                     f"  {doc.get('schedule') or describe(doc['config'])}\n")  # the server's, for the study's family
    return 0


def _file_missing(args: argparse.Namespace, label: str, signature: str, answer: str, url: str) -> str:
    """The server's 404 for a config.json or model file, asked for by its ``signature``, in the
    words of what the user gave: the model (``label``) and its file, and the command that submits it."""
    if "passes the filters" in answer or "its trials ran at" in answer:  # studies of it exist: only its name changes
        return answer.replace(f"the model of signature {signature!r}", f"{label} ({args.model})").replace(
            signature, f"{label} ({args.model})").replace("`autoslapo tune CONFIG.json ", f"`autoslapo tune {args.model} ")
    where = f"{args.gpus}x {args.gpu_type}" if args.gpu_type else f"{args.gpus} devices"
    given = {**link_args(args), "gpus_per_node": args.gpus_per_node}
    flags = (f" --gpu-type {args.gpu_type}" if args.gpu_type else "") + "".join(
        f" {_flag(k)} {v:g}" for k, v in given.items() if v is not None)
    flags += f" --global-batch {args.global_batch}" if args.global_batch is not None else ""
    return (f"the server at {url} has no recorded schedule for {label} ({args.model}) on {where}: no study there "
            f"tuned this model on this cluster; submit one: `autoslapo tune {args.model} --gpus {args.gpus}{flags} "
            f"--server {url}` (or POST /v1/studies with this model and cluster)")
