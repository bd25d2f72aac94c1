"""``autoslapo estimate``: predict throughput and memory of a schedule with the cost model (no devices).

Knobs given on the command line are fixed; the rest are chosen as the best the cost model finds.
A measured profile (``autoslapo profile``) calibrates the device: ``--profile PATH``, else
``$AUTOSLAPO_PROFILE``, else ``~/.cache/autoslapo/profiles/<gpu-type>.json`` if it exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from autoslapo.cli._knobs import add_knob_arguments, knob_values
from autoslapo.cli._shape import add_shape_arguments, shape_overrides
from autoslapo.config import KNOBS
from autoslapo.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo estimate``."""
    parser.add_argument("model", help="model preset (bert, gpt2-xl, llama-7b, ...; see `autoslapo models`)")
    parser.add_argument("--gpus", type=int, required=True, help="number of devices")
    parser.add_argument("--gpu-type", default="a100-80gb", help="device preset (default a100-80gb)")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="devices a node (default 8; cpu: --gpus)")
    parser.add_argument("--allow-cross-node-tp", action="store_true", help="let TP span nodes")
    parser.add_argument("--global-batch", type=int, help="sequences an optimizer step (fixes grad accumulation)")
    add_knob_arguments(parser, "estimate")
    add_shape_arguments(parser)
    parser.add_argument("--profile", type=Path, help="measured device profile JSON (see autoslapo profile)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")


def _profile(args: argparse.Namespace) -> tuple[dict[str, Any] | None, str]:
    from autoslapo.cost.profile import default_profile_path, load_profile

    if args.profile is not None:
        return load_profile(args.profile), str(args.profile)
    env = os.environ.get("AUTOSLAPO_PROFILE")
    if env:
        return load_profile(Path(env)), env
    path = default_profile_path(args.gpu_type)
    if path.exists():
        return load_profile(path), str(path)
    return None, ""


def run(args: argparse.Namespace) -> int:
    """Estimate the given (or best) schedule; prints a summary or JSON. Returns 0."""
    from autoslapo.cluster import ClusterSpec
    from autoslapo.cost import best_config
    from autoslapo.models.spec import ModelSpec

    overrides = shape_overrides(args)
    model = ModelSpec.from_name(args.model, **overrides)
    per_node = args.gpus_per_node or (args.gpus if args.gpu_type == "cpu" else min(8, args.gpus))
    cluster = ClusterSpec(gpus=args.gpus, gpu_type=args.gpu_type, gpus_per_node=per_node,
                          allow_cross_node_tp=args.allow_cross_node_tp)
    profile, source = _profile(args)
    if profile is not None:
        if profile.get("gpu_type") != args.gpu_type:
            raise UsageError(
                f"the profile is for {profile.get('gpu_type')!r}, not --gpu-type {args.gpu_type}: "
                f"{source}; pass a matching --profile"
            )
        cluster = cluster.with_profile(profile)
    fixed = knob_values(args, "estimate")
    if args.global_batch is not None and "grad_accum" in fixed:
        raise UsageError("--global-batch and --grad-accum both fix the batch: give one of them")
    est = best_config(model, cluster, global_batch=args.global_batch, profile=profile, **fixed)
    d = est.to_dict()
    d.update(model=model.to_dict(), cluster=cluster.to_dict(), profile=source or None,
             searched=est.breakdown.get("searched"))
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, sort_keys=True) + "\n")
        return 0
    c = est.config
    shape = ""
    if overrides:  # the preset's name alone would hide the shape estimated
        keys = [*overrides, *(["ffn"] if "hidden" in overrides else []), *(["kv_heads"] if "heads" in overrides else [])]
        shape = " with " + " ".join(f"{k}={getattr(model, k)}" for k in dict.fromkeys(keys))
    print(f"{model.preset}{shape} on {cluster.gpus} x {cluster.gpu_type}" + (f" (profile {source})" if source else ""))
    print(f"  schedule: {' '.join(k.show(getattr(c, k.name)) for k in KNOBS)}")
    print(f"  {est.samples_per_s:,.1f} samples/s, {est.tokens_per_s:,.0f} tokens/s, step {est.step_time_s:.3f} s")
    print(f"  {est.tflops_per_device:.1f} model TFLOP/s a device ({est.hw_tflops_per_device:.1f} with recompute)")
    print(f"  memory {est.memory_per_device_bytes / 2**30:.2f} GiB of {cluster.memory_bytes / 2**30:.1f} GiB a "
          f"device ({'fits' if est.fits else 'does NOT fit'})")
    return 0
