"""``autoslapo profile``: measure this machine's compute rate, memory bandwidth and gloo collectives.

Saves a device profile JSON (default ``~/.cache/autoslapo/profiles/cpu.json``) that ``autoslapo
estimate --gpu-type cpu`` then uses, so the cost model predicts what ``autoslapo run`` measures here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo profile``."""
    parser.add_argument("--ranks", type=int, default=2, help="CPU ranks measured at once (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads a rank (default cores/ranks)")
    parser.add_argument("--quick", action="store_true", help="fewer GEMM sizes")
    parser.add_argument("--skip-runtime", action="store_true",
                        help="skip the two tiny real trials that measure the runtime's fixed cost a step")
    parser.add_argument("--profile", type=Path, default=None,
                        help="where to save (default $AUTOSLAPO_PROFILE or ~/.cache/autoslapo/profiles/cpu.json)")
    parser.add_argument("--json", action="store_true", help="print the profile as JSON")


def run(args: argparse.Namespace) -> int:
    """Measure and save the profile; returns 0. Raises UsageError for bad flags."""
    from autoslapo.cost.profile import default_profile_path, save_profile
    from autoslapo.errors import UsageError
    from autoslapo.runtime.profile import measure_profile

    if args.ranks < 1 or args.ranks > 64:
        raise UsageError(f"--ranks must be between 1 and 64: got {args.ranks}")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be positive: got {args.threads}")
    env = os.environ.get("AUTOSLAPO_PROFILE")
    path = args.profile or (Path(env) if env else default_profile_path("cpu"))
    prof = measure_profile(args.ranks, args.threads, quick=args.quick, runtime=not args.skip_runtime)
    save_profile(prof, path)
    if args.json:
        sys.stdout.write(json.dumps(prof, indent=2, sort_keys=True) + "\n")
    else:
        print(f"saved {path}: {prof['peak_tflops_fp32'] * 1e3:.1f} GFLOP/s a rank, copy "
              f"{prof['hbm_gbps']:.1f} GB/s, allreduce {prof['intra_node_gbps']:.2f} GB/s + "
              f"{prof['coll_latency_s'] * 1e6:.0f} us a hop, op {prof['op_latency_s'] * 1e6:.0f} us, "
              f"step overhead {prof.get('step_overhead_s', 0) * 1e3:.0f} ms + "
              f"{prof.get('microbatch_overhead_s', 0) * 1e3:.0f} ms a micro-batch, "
              f"process {prof['fixed_overhead_bytes'] / 2**20:.0f} MiB, load {prof['load_avg']:.1f}")
    return 0
