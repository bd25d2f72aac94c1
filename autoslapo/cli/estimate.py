"""``autoslapo estimate``: predict throughput and memory of a schedule with the cost model (no devices).

Knobs given on the command line are fixed; the rest are chosen as the best the cost model finds.
A measured profile (``autoslapo profile``) calibrates the device: ``--profile PATH``, else
``$AUTOSLAPO_PROFILE`` when it profiles the same ``--gpu-type``, else
``~/.cache/autoslapo/profiles/<gpu-type>.json`` if it exists.
``--cluster-from STUDY`` estimates on the study's cluster with its calibration and, for the model the
study tuned, at the global batch its trials ran at (``--global-batch`` overrides it).
``--server URL`` asks a running ``autoslapo serve`` (``POST /v1/estimate``) with the same model, pins
and shape: the same answer, and ``--cluster-from`` then names a study in the server's store.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoslapo.cli._knobs import add_knob_arguments, knob_values
from autoslapo.cli._links import add_link_arguments, link_args
from autoslapo.cli._shape import add_shape_arguments, shape_overrides
from autoslapo.cli.studies import figure
from autoslapo.config import KNOBS
from autoslapo.cost.device import AUTOSLAPO_GPU
from autoslapo.errors import UsageError
from autoslapo.layout import inapplicable_knobs, user_unvaried_knobs
from autoslapo.models.spec import ModelSpec, is_convolutional

if TYPE_CHECKING:
    from autoslapo.storage import StudyCluster


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo estimate``."""
    parser.add_argument("model", help="model preset (bert, gpt2-xl, llama-7b, ...; see `autoslapo models`), a Hugging Face config.json or a model file (.py)")
    parser.add_argument("--gpus", type=int, default=None, help="number of devices (required unless --cluster-from)")
    parser.add_argument("--gpu-type", default=None, help="device preset (default a100-80gb; with --cluster-from the study's)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="devices a node (default 8; cpu: --gpus)")
    parser.add_argument("--allow-cross-node-tp", action="store_true", help="let TP span nodes")
    add_link_arguments(parser)
    parser.add_argument("--global-batch", type=int, help="sequences an optimizer step (fixes grad accumulation; "
                                                         "with --cluster-from, default the study's)")
    add_knob_arguments(parser, "estimate")
    add_shape_arguments(parser)
    parser.add_argument("--profile", type=Path, help="measured device profile JSON (see autoslapo profile)")
    parser.add_argument("--cluster-from", metavar="STUDY", default=None,
                        help="estimate on STUDY's cluster with that cluster's calibration (the correction "
                             "its measured trials fitted; see --storage) and, for the model STUDY tuned, at "
                             "its trials' global batch")
    parser.add_argument("--storage", metavar="URL", default=None,
                        help="store URL for --cluster-from (default: $AUTOSLAPO_STORAGE, else sqlite:///autoslapo.db)")
    parser.add_argument("--server", metavar="URL", default=None,
                        help="ask a running `autoslapo serve` at URL (token from $AUTOSLAPO_TOKEN) instead of "
                             "estimating here; --cluster-from then names a study in its store")
    parser.add_argument("--top", type=int, default=1, metavar="N",
                        help="also list the N fastest schedules that fit (1-100; default 1: the best alone)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")


def _profile(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str]:
    from autoslapo.cost.profile import default_profile_path, load_profile

    if args.profile is not None:
        return load_profile(args.profile), str(args.profile)
    env = os.environ.get("AUTOSLAPO_PROFILE")
    if env:
        try:
            profile = load_profile(Path(env))
        except UsageError as err:  # say where the path came from: no --profile was given
            raise UsageError(f"$AUTOSLAPO_PROFILE: {err}; fix it or unset it") from None
        if profile.get("gpu_type") == args.gpu_type:  # a profile of another device is not this estimate's
            return profile, env
    path = default_profile_path(args.gpu_type)
    if path.exists():
        return load_profile(path), str(path)
    return None, ""


def _study_cluster(args: argparse.Namespace, model: ModelSpec) -> tuple[StudyCluster, int | None]:
    """``--cluster-from STUDY``: the study's cluster, its stored calibration (None if none yet) and
    whether its trials were real; and the global batch its trials ran at when it tuned ``model``
    (``trials_global_batch``; None for another model's study, or one without trials)."""
    from autoslapo.storage import require_store, study_cluster, study_global_batch

    given = {"gpus": args.gpus, "gpu_type": args.gpu_type, "gpus_per_node": args.gpus_per_node,
             "allow_cross_node_tp": args.allow_cross_node_tp or None, **link_args(args)}
    with require_store(args.storage, read_only=True) as store:
        found = study_cluster(store, args.cluster_from, given, lambda key: "--" + key.replace("_", "-"))
        return found, study_global_batch(store, args.cluster_from, model)


def run(args: argparse.Namespace) -> int:
    """Estimate the given (or best) schedule; prints a summary or JSON. Returns 0."""
    if args.server:
        return _show(_remote(args), args)
    from autoslapo.cluster import ClusterSpec
    from autoslapo.cost.answer import calibrated_ranking, estimate_batch, estimate_document, study_batch_named
    from autoslapo.models.resolve import resolve_model

    model = resolve_model(args.model, **shape_overrides(args))
    pins = _pins(args)
    calibration: dict[str, Any] | None = None
    limits: dict[str, Any] = {}
    real_trials = False
    batch, batch_from = args.global_batch, None
    if args.cluster_from is not None:
        study, study_batch = _study_cluster(args, model)
        cluster, calibration, real_trials = study
        limits = study.runtime_limits(model)
        args.gpu_type = cluster.gpu_type
        batch, batch_from = estimate_batch(batch, study_batch, pins)  # the batch it tuned at
    else:
        from autoslapo.cluster import DEFAULT_GPU_TYPE

        args.gpu_type = args.gpu_type or DEFAULT_GPU_TYPE
        if args.gpus is None:
            raise UsageError("estimate needs --gpus N (or --cluster-from STUDY to use a study's cluster)")
        cluster = ClusterSpec.described(args.gpus, args.gpu_type, args.gpus_per_node,
                                        allow_cross_node_tp=args.allow_cross_node_tp, links=link_args(args))
    profile, source = _profile(args)
    if profile is not None:
        if profile.get("gpu_type") != args.gpu_type:
            raise UsageError(
                f"the profile is for {profile.get('gpu_type')!r}, not --gpu-type {args.gpu_type}: "
                f"{source}; pass a matching --profile (or none)"
            )
        cluster = cluster.with_profile(profile)
    with study_batch_named(batch, batch_from, args.cluster_from):
        ranked = calibrated_ranking(model, cluster, calibration["params"] if calibration else None, top=args.top,
                                    global_batch=batch, profile=profile, **limits, **pins)
    return _show(estimate_document(model, cluster, ranked, profile=source, calibration=calibration,
                                   study=args.cluster_from, pinned=pins, real_trials=real_trials,
                                   global_batch_from=batch_from), args)


def _pins(args: argparse.Namespace) -> dict[str, Any]:
    fixed = knob_values(args, "estimate")
    if args.global_batch is not None and "grad_accum" in fixed:
        raise UsageError("--global-batch and --grad-accum both fix the batch: give one of them")
    return fixed


def _remote(args: argparse.Namespace) -> dict[str, Any]:
    """``estimate --server``: the server's answer to ``POST /v1/estimate`` with this command's model,
    cluster, pins and shape, as the document a local estimate prints."""
    from autoslapo.remote import Client, model_field

    if args.profile is not None or args.storage is not None:
        given = [f for f, v in (("--profile", args.profile), ("--storage", args.storage)) if v is not None]
        raise UsageError(f"--server estimates with the server's device presets and store: {' and '.join(given)} "
                         f"cannot be sent; drop {'them' if len(given) > 1 else 'it'}, or estimate here without --server")
    overrides = shape_overrides(args)
    if overrides and args.model.lower().endswith(".py"):
        flags = " ".join("--" + k.replace("_", "-") for k in overrides)
        raise UsageError(f"shape flags do not apply to a model file (its shape is its own): got {flags} with "
                         f"{args.model}; change the file instead")
    body = {"model": model_field(args.model), "gpus": args.gpus, "gpu_type": args.gpu_type,
            "gpus_per_node": args.gpus_per_node, "global_batch": args.global_batch, "knobs": _pins(args) or None,
            "shape": overrides or None, "cluster_from": args.cluster_from,
            "allow_cross_node_tp": args.allow_cross_node_tp or None, "top": args.top if args.top != 1 else None,
            **link_args(args)}
    doc = Client(args.server).post("/v1/estimate", {k: v for k, v in body.items() if v is not None})
    spec = doc.pop("model_spec")
    for key in ("gpus", "gpu_type"):  # the cluster's, also under "cluster"
        doc.pop(key, None)
    return {**doc, "model": spec}


#: A schedule predicted to fit with less free than this share of a device is called tight: the model
#: counts allocations, and PyTorch's caching allocator reserves more than it allocates (fragmentation).
TIGHT_FRACTION = 0.05


def _show(d: dict[str, Any], args: argparse.Namespace) -> int:
    """Print an estimate's document (``autoslapo.cost.answer``): JSON, or a summary. Returns 0."""
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, sort_keys=True) + "\n")
        return 0
    model, cluster, c, calibration = d["model"], d["cluster"], d["config"], d["calibration"]
    overrides = shape_overrides(args)
    shape = ""
    if overrides:  # the preset's name alone would hide the shape estimated
        keys = [*overrides, *(["ffn"] if "hidden" in overrides else []), *(["kv_heads"] if "heads" in overrides else [])]
        shape = " with " + " ".join(f"{k}={model[k]}" for k in dict.fromkeys(keys))
    where = f" (profile {d['profile']})" if d.get("profile") else f" (server {args.server})" if args.server else ""
    from autoslapo.cluster import ClusterSpec

    print(f"{model['preset']}{shape} on {ClusterSpec.from_dict(cluster).described_as()}{where}")
    if args.cluster_from is not None:
        print(f"  calibration of {args.cluster_from}'s cluster: " + (
            ", ".join(f"{k} x{v:.2f}" for k, v in calibration["params"].items()) + f" ({calibration['n_trials']} trials)"
            if calibration else "none stored yet (the uncalibrated model)") + (
            "; autoslapo's runtime, which its trials ran" if d.get("runtime") == AUTOSLAPO_GPU else ""))
    if d.get("runtime") == "megatron":  # what the GPU presets describe, not the runtime `run` and real trials use
        if is_convolutional(d["model"]["family"]):
            print("  stack: the published runs' (NVIDIA's DeepLearningExamples, PyTorch); --cluster-from STUDY "
                  "of a measured study prices autoslapo's own trials")
        else:
            print("  stack: the published runs' Megatron-LM / DeepSpeed (16-bit weights and gradients); autoslapo's "
                  "own trials keep fp32 ones and need more memory: --cluster-from STUDY of a measured study prices those")
    spec = ModelSpec.from_dict(model)
    # the family cannot use them, or a model file never varies them: not shown
    na = {*inapplicable_knobs(spec, KNOBS), *user_unvaried_knobs(spec, KNOBS)}
    print(f"  schedule: {' '.join(k.show(c[k.name]) for k in KNOBS if k.name not in na)}")
    free = [k for k in KNOBS if k.name not in d["pinned"] and not k.derived and k.name not in na]
    print(f"  pinned: {' '.join(k.show(c[k.name]) for k in KNOBS if k.name in d['pinned']) or 'none'}; searched "
          f"(fastest that fits): {' '.join(k.label for k in free if k.sweep is not None or k.auto) or 'none'}; "
          f"defaults: {' '.join(k.label for k in free if k.sweep is None and not k.auto) or 'none'}")
    inert = [k.show(c[k.name]) for k in KNOBS if k.name in d["pinned"] and k.inert is not None
             and c[k.name] != k.default and k.inert(c, model["layers"])]
    if inert:  # found nowhere it acts (``best_configs``): say so rather than imply an effect
        print(f"  note: pinned, but changes nothing in this schedule: {' '.join(inert)}")
    if d.get("stage_layers"):
        sizes = d["stage_layers"]
        runs = [(n, len(list(group))) for n, group in itertools.groupby(sizes)]
        family = d["model"]["family"]  # an encoder-decoder's, a conv net's and a model file's stages hold blocks
        unit = "blocks" if family in ("t5", "user") or is_convolutional(family) else "layers"
        print(f"  pipeline: {sum(sizes)} {unit} over {len(sizes)} ranks: "
              + ", ".join(f"{n} x {k}" if k > 1 else str(n) for n, k in runs) + ("" if len(runs) == 1 else " (uneven)"))
    tokens = "" if is_convolutional(d["model"]["family"]) else f", {d['tokens_per_s']:,.0f} tokens/s"  # images
    print(f"  {figure(d['samples_per_s'])} samples/s{tokens}, step {d['step_time_s']:.3f} s")
    if d.get("global_batch_from") == "study":  # what its trials ran at: the estimate answers the study's question
        print(f"  global batch {c['micro_batch'] * c['dp'] * c['grad_accum']:,}, the study's (its trials ran at it; "
              "--global-batch overrides)")
    elif args.global_batch is None and "grad_accum" not in d["pinned"]:  # tune fixes it (its space's global batch)
        why = "" if "micro_batch" in d["pinned"] else ", so the largest micro-batch that fits is fastest"
        print(f"  global batch {c['micro_batch'] * c['dp'] * c['grad_accum']:,}: not fixed{why}; --global-batch "
              "fixes it, as tune does"
              + ("; unfixed, a pipeline accumulates 4 x pp micro-batches a step and a layout without one 1, "
                 "so they were compared at different batches: pass yours" if c["pp"] > 1 else ""))
    print(f"  {figure(d['tflops_per_device'])} model TFLOP/s a device ({figure(d['hw_tflops_per_device'])} with "
          "recompute)")
    used, capacity = d["memory_per_device_bytes"], d["memory_capacity_bytes"]
    tight = d["fits"] and capacity - used < TIGHT_FRACTION * capacity
    print(f"  memory {used / 2**30:.2f} GiB of {capacity / 2**30:.1f} GiB a device ({'fits' if d['fits'] else 'does NOT fit'}"
          + (f"; {(capacity - used) / 2**30:.2f} GiB free, under {TIGHT_FRACTION:.0%}: the caching allocator's "
             "fragmentation may not fit there; --top 5 shows roomier schedules" if tight else "") + ")")
    if d.get("top"):
        print(f"  the {len(d['top'])} fastest schedules that fit:")
        for row in d["top"]:
            print(f"  {row['rank']:>4}. {row['samples_per_s']:>12,.1f} samples/s  "
                  f"{row['memory_per_device_bytes'] / 2**30:6.2f} GiB  {row['schedule']}")
    return 0
