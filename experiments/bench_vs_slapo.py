"""Side by side: applying a TP-8 + full-checkpointing schedule to BERT-large with autoslapo and with Slapo.

What is measured. A fake 8-rank process group in one process (rank 3; collectives are no-ops, nothing
runs forward), a fresh ``build_model("bert-large")`` (transformers' BertForMaskedLM, 24 layers) on the
meta device for every repetition (not timed), and for each side the wall time of

  (a) schedule creation: ``create_schedule(model, group=WORLD)``;
  (b) applying the schedule: tensor parallelism of degree 8 in every layer (q/k/v and the MLP's first
      linear column-parallel with weight and bias sharded on the output features, the attention output
      and MLP output linears row-parallel with the weight sharded on the input features and the bias
      kept whole; the input gradient of each column-parallel region all-reduced in backward, the output
      of each row-parallel linear all-reduced in forward; the attention's head counts divided by 8),
      then activation checkpointing of every layer.

The sides, run interleaved (one of each per repetition, in this order) after one warm-up each:

  autoslapo        ``apply_schedule(sch, spec, ScheduleConfig(tp=8, ckpt_ratio=1.0))``, the call users
                   make. It also does what Slapo cannot do here: the embedding and the tied LM head
                   vocabulary-parallel (30522 rows padded to 30528; Slapo's ``shard`` needs the size
                   to divide by 8) and selects the sdpa attention kernel.
  autoslapo-layers the per-layer schedule only, written with autoslapo's public primitives (``shard``,
                   ``shrink_attr``, ``sync``, ``checkpoint``): the same work as the Slapo side.
  slapo            Slapo 0.0.3's ``create_schedule`` and its public primitives (``shard``, ``sync``,
                   ``checkpoint``), written here (Slapo has no primitive for module attributes, so the
                   head counts are set on ``.mod`` directly). Slapo's own BERT schedule
                   (``slapo/model_schedule/bert.py``) is not usable here: it swaps in its fused-QKV
                   FlashAttention (the default op needs xFormers: "xformers is not installed"), and
                   with ``attn_op_name="native_xformers"`` it stops at the word embedding (30522 rows
                   "cannot be sharded along axis 0 ... by 8").

Printed: median and min over ``--reps`` repetitions of (a), (b) and (a)+(b) per side, the ratios
slapo / autoslapo of the medians, and a cross-check that every encoder layer's linear weights and biases
have the same local shapes on all sides, the collectives and checkpoints each side put on the layers,
and the modules' size attributes (in/out_features, head counts). ``gc.collect()`` runs (untimed) before
each timed pair. The machines here are shared and noisy: compare the sides, not the absolute times.

Slapo is never a dependency of autoslapo; install it outside the project:

    .venv/bin/pip download slapo==0.0.3 --no-deps -d /tmp/slapo-wheel
    .venv/bin/pip install --no-deps --target /tmp/slapo-pkg /tmp/slapo-wheel/*.whl
    HF_HUB_OFFLINE=1 .venv/bin/python experiments/bench_vs_slapo.py | tee experiments/results/bench_vs_slapo.txt

``--slapo-path DIR`` imports Slapo from ``DIR`` (default: a plain ``import slapo``, then /tmp/slapo-pkg).
Exit status 2 when Slapo cannot be imported. Slapo 0.0.3 imports ``Conv1D`` from
``transformers.modeling_utils``, which transformers 5 lacks; the script puts it back before the import.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch import nn

DEFAULT_SLAPO_PATH = "/tmp/slapo-pkg"
GET_SLAPO = (
    ".venv/bin/pip download slapo==0.0.3 --no-deps -d /tmp/slapo-wheel && "
    ".venv/bin/pip install --no-deps --target /tmp/slapo-pkg /tmp/slapo-wheel/*.whl"
)
MODEL = "bert-large"
TP = 8
RANK = 3
LAYERS = "bert.encoder.layer"
QKV = ("attention.self.query", "attention.self.key", "attention.self.value")
ATTN_OUT = "attention.output.dense"
MLP_IN = "intermediate.dense"
MLP_OUT = "output.dense"
HEAD_ATTRS = ("num_attention_heads", "all_head_size")

# (schedule creation, schedule application) for one side; each returns the schedule root.
Creator = Callable[[nn.Module], Any]
Applier = Callable[[Any], None]


def import_slapo(path: str | None) -> tuple[ModuleType | None, str]:
    """Import Slapo 0.0.3 on transformers 5; return (module or None, where it came from or why not).

    ``path``: a directory holding the ``slapo`` package, or None for a plain import, then
    :data:`DEFAULT_SLAPO_PATH`.
    """
    import transformers
    import transformers.modeling_utils
    import transformers.pytorch_utils

    # Slapo 0.0.3 imports Conv1D from transformers.modeling_utils, which transformers 5 no longer has.
    transformers.modeling_utils.Conv1D = transformers.pytorch_utils.Conv1D  # type: ignore[attr-defined]
    errors: list[str] = []
    for where in [path] if path is not None else [None, DEFAULT_SLAPO_PATH]:
        if where is not None:
            sys.path.insert(0, where)
        try:
            slapo = importlib.import_module("slapo")
        except Exception as exc:  # ImportError, or anything Slapo's own imports raise
            errors.append(f"{where or 'sys.path'}: {type(exc).__name__}: {exc}")
            if where is not None:
                sys.path.remove(where)
            for name in [m for m in sys.modules if m == "slapo" or m.startswith("slapo.")]:
                del sys.modules[name]
            continue
        return slapo, os.path.dirname(str(slapo.__file__))
    return None, "; ".join(errors)


# -- autoslapo ------------------------------------------------------------------------------------


def autoslapo_sides(spec: Any) -> dict[str, tuple[Creator, Applier]]:
    """The two autoslapo sides: ``apply_schedule`` and the same per-layer schedule as the Slapo side."""
    import torch.distributed as dist

    from autoslapo import create_schedule
    from autoslapo.config import ScheduleConfig
    from autoslapo.plan import apply_schedule

    config = ScheduleConfig(tp=TP, ckpt_ratio=1.0)

    def create(model: nn.Module) -> Any:
        return create_schedule(model, group=dist.group.WORLD)

    def apply_full(sch: Any) -> None:
        apply_schedule(sch, spec, config)

    def column(node: Any) -> None:
        node.shard("weight", 0)
        node.shard("bias", 0)
        node.mod.out_features //= node.group_size

    def row(node: Any) -> None:
        node.shard("weight", 1)  # the bias stays whole; the fwd_post all-reduce adds it once
        node.mod.in_features //= node.group_size

    def apply_layers(sch: Any) -> None:
        layers = [sch[f"{LAYERS}.{i}"] for i in range(spec.layers)]
        for layer in layers:
            for path in QKV:
                column(layer[path])
            layer["attention.self"].shrink_attr(*HEAD_ATTRS)
            row(layer[ATTN_OUT])
            column(layer[MLP_IN])
            row(layer[MLP_OUT])
        for layer in layers:
            layer["attention.self"].sync("bwd_post", "all_reduce")
            layer[ATTN_OUT].sync("fwd_post", "all_reduce")
            layer["intermediate"].sync("bwd_post", "all_reduce")
            layer[MLP_OUT].sync("fwd_post", "all_reduce")
        for layer in layers:
            layer.checkpoint()

    return {"autoslapo": (create, apply_full), "autoslapo-layers": (create, apply_layers)}


# -- Slapo ----------------------------------------------------------------------------------------


def slapo_side(slapo: ModuleType, layers: int) -> tuple[Creator, Applier]:
    """The Slapo side: its ``create_schedule`` and the per-layer schedule in its primitives."""
    import torch.distributed as dist

    def create(model: nn.Module) -> Any:
        return slapo.create_schedule(model, group=dist.group.WORLD)

    def apply(sch: Any) -> None:
        for i in range(layers):
            layer = sch[f"{LAYERS}.{i}"]
            for path in QKV:
                layer[path].shard("weight", axis=0)
                layer[path].shard("bias", axis=0)
            attn = layer["attention.self"].mod
            for name in HEAD_ATTRS:  # no Slapo primitive for this: set the attributes directly
                setattr(attn, name, getattr(attn, name) // sch.group_size)
            layer["attention.self"].sync(mode="bwd_post", sync_op_or_fn="all_reduce")
            layer[ATTN_OUT].shard("weight", axis=1)
            layer[ATTN_OUT].sync(mode="fwd_post", sync_op_or_fn="all_reduce")
            layer[MLP_IN].shard("weight", axis=0)
            layer[MLP_IN].shard("bias", axis=0)
            layer["intermediate"].sync(mode="bwd_post", sync_op_or_fn="all_reduce")
            layer[MLP_OUT].shard("weight", axis=1)
            layer[MLP_OUT].sync(mode="fwd_post", sync_op_or_fn="all_reduce")
        for i in range(layers):
            sch[f"{LAYERS}.{i}"].checkpoint()  # swaps the layer for Slapo's CheckPointWrapper(mod)

    return create, apply


# -- measurement ----------------------------------------------------------------------------------


def run_once(
    build: Callable[[], nn.Module], create: Creator, apply: Applier
) -> tuple[float, float, nn.Module]:
    """Build a fresh meta model (not timed), then time schedule creation and application."""
    model = build()
    gc.collect()
    t0 = time.perf_counter()
    sch = create(model)
    t1 = time.perf_counter()
    apply(sch)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, model


def encoder_layer(model: nn.Module, i: int) -> nn.Module:
    """Layer ``i`` of the encoder, unwrapped from Slapo's checkpoint wrapper if it has one."""
    layer = model.get_submodule(f"{LAYERS}.{i}")
    inner = layer._modules.get("mod") if type(layer).__name__ == "CheckPointWrapper" else None
    return inner if inner is not None else layer


def layer_layout(model: nn.Module, layers: int) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Local shapes of every encoder layer's linear weights and biases, and the size attributes."""
    shapes: dict[str, tuple[int, ...]] = {}
    attrs: dict[str, int] = {}
    for i in range(layers):
        layer = encoder_layer(model, i)
        for name, mod in layer.named_modules():
            if isinstance(mod, nn.Linear):
                for pname, param in mod.named_parameters(recurse=False):
                    shapes[f"{i}.{name}.{pname}"] = tuple(param.shape)
                attrs[f"{i}.{name}.in_features"] = mod.in_features
                attrs[f"{i}.{name}.out_features"] = mod.out_features
        attn = layer.get_submodule("attention.self")
        for attr in HEAD_ATTRS:
            attrs[f"{i}.attention.self.{attr}"] = getattr(attn, attr)
    return shapes, attrs


def shape_lines(ref: dict[str, Any], other_name: str, other: dict[str, Any], first: int = 8) -> list[str]:
    """'shapes agree: N tensors', or the first mismatching tensors (autoslapo's shapes are the reference)."""
    names = sorted(set(ref) | set(other), key=_natural)
    bad = [n for n in names if ref.get(n) != other.get(n)]
    if not bad:
        return [f"  {other_name}: shapes agree: {len(names)} tensors"]
    lines = [
        f"  {other_name}: {len(bad)} of {len(names)} tensors differ from autoslapo's, first {min(first, len(bad))}:"
    ]
    lines += [f"    layer {n}: autoslapo {ref.get(n)}, {other_name} {other.get(n)}" for n in bad[:first]]
    return lines


def attr_lines(ref: dict[str, Any], other_name: str, other: dict[str, Any], layers: int) -> list[str]:
    """The size attributes that differ from autoslapo's, grouped over layers ("all 24 layers")."""
    names = sorted(set(ref) | set(other), key=_natural)
    bad = [n for n in names if ref.get(n) != other.get(n)]
    if not bad:
        return [f"  {other_name}: size attributes agree: {len(names)} (in/out_features, head counts)"]
    groups: dict[tuple[str, Any, Any], list[str]] = {}
    for n in bad:
        layer, _, rest = n.partition(".")
        groups.setdefault((rest, ref.get(n), other.get(n)), []).append(layer)
    lines = [f"  {other_name}: {len(bad)} of {len(names)} size attributes differ from autoslapo's:"]
    for (rest, a, b), where in groups.items():
        span = f"all {len(where)} layers" if len(where) == layers else f"layers {', '.join(where)}"
        lines.append(f"    {rest}: autoslapo {a}, {other_name} {b} ({span})")
    return lines


def schedule_summary(model: nn.Module, layers: int) -> str:
    """Count the collectives and checkpoints each side put on the encoder layers."""
    pre = post = ckpt = 0
    for i in range(layers):
        outer = model.get_submodule(f"{LAYERS}.{i}")
        layer = encoder_layer(model, i)
        forward = getattr(layer.__dict__.get("forward"), "__func__", None)
        ckpt += outer is not layer or getattr(forward, "__name__", "") == "_checkpointed_forward"
        for path in ("attention.self", "intermediate"):
            pre += len(layer.get_submodule(path)._forward_pre_hooks)
        for path in (ATTN_OUT, MLP_OUT):
            mod = layer.get_submodule(path)
            post += len(mod._forward_hooks) + (getattr(mod, "sync_fn", None) is not None)
    return (
        f"{pre} input hooks with a backward all-reduce (attention.self, intermediate), {post} forward "
        f"all-reduces after row-parallel linears, {ckpt}/{layers} layers checkpointed"
    )


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in name.split("."))


def ms(values: list[float]) -> str:
    """Median and min of ``values`` (seconds) in ms, two 10-wide columns."""
    return f"{statistics.median(values) * 1e3:10.2f}{min(values) * 1e3:10.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per side (default 20)")
    parser.add_argument(
        "--slapo-path",
        default=None,
        help=f"directory holding the slapo package (default: plain import, then {DEFAULT_SLAPO_PATH})",
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1: got {args.reps}")

    load_start = os.getloadavg()
    slapo, where = import_slapo(args.slapo_path)
    if slapo is None:
        print(f"bench_vs_slapo: cannot import slapo ({where}); get it with: {GET_SLAPO}", file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist
    import transformers

    from autoslapo.dist import init_fake_world
    from autoslapo.models.build import build_model
    from autoslapo.models.spec import ModelSpec

    torch.set_num_threads(1)  # nothing here computes; keep the shared machine's load down
    init_fake_world(TP, rank=RANK)
    spec = ModelSpec.from_name(MODEL)

    def build() -> nn.Module:
        return build_model(spec, device="meta")

    sides = autoslapo_sides(spec)
    sides["slapo"] = slapo_side(slapo, spec.layers)

    print(
        f"TP-{TP} + checkpointing of every layer on {MODEL} (BertForMaskedLM, {spec.layers} layers, hidden "
        f"{spec.hidden}, {spec.heads} heads) on the meta device; fake {TP}-rank group, rank {RANK}"
    )
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, slapo {slapo.__version__} "
        f"({where}); {os.cpu_count()} cores, {torch.get_num_threads()} torch thread"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load_start)} (1, 5, 15 min)")

    models: dict[str, nn.Module] = {}
    for name, (create, apply) in sides.items():  # warm-up, and the models for the cross-check
        models[name] = run_once(build, create, apply)[2]
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in sides}
    for _ in range(args.reps):
        for name, (create, apply) in sides.items():
            t_create, t_apply, _model = run_once(build, create, apply)
            times[name][0].append(t_create)
            times[name][1].append(t_apply)
    load_end = os.getloadavg()

    print(f"\n{args.reps} repetitions, interleaved ({', '.join(sides)}), after 1 warm-up each; times in ms")
    print(f"{'':18}{'create_schedule':>20}{'apply schedule':>20}{'create + apply':>20}")
    print(f"{'side':18}" + f"{'median':>10}{'min':>10}" * 3)
    medians: dict[str, list[float]] = {}
    for name, (create_t, apply_t) in times.items():
        series = (create_t, apply_t, [a + b for a, b in zip(create_t, apply_t, strict=True)])
        medians[name] = [statistics.median(v) for v in series]
        print(f"{name:18}" + "".join(ms(v) for v in series))
    for ref in ("autoslapo", "autoslapo-layers"):
        create_r, apply_r, total_r = (s / r for s, r in zip(medians["slapo"], medians[ref], strict=True))
        print(
            f"ratio of medians slapo / {ref}: create {create_r:.2f}x, apply {apply_r:.2f}x, "
            f"create + apply {total_r:.2f}x"
        )

    print(f"\nCross-check after scheduling, all {spec.layers} encoder layers (autoslapo is the reference):")
    for name, model in models.items():
        print(f"  {name}: {schedule_summary(model, spec.layers)}")
    layouts = {name: layer_layout(model, spec.layers) for name, model in models.items()}
    ref_shapes, ref_attrs = layouts["autoslapo"]
    print("Local shapes of the linear weights and biases:")
    for other in ("autoslapo-layers", "slapo"):
        print("\n".join(shape_lines(ref_shapes, other, layouts[other][0])))
    row_biases = [f"{i}.{path}.bias" for i in range(spec.layers) for path in (ATTN_OUT, MLP_OUT)]
    if all(layouts[n][0].get(b) == (spec.hidden,) for n in layouts for b in row_biases):
        print(
            "  (row-parallel biases, attention.output.dense and output.dense, stay whole on every side: Slapo "
            "adds them after the all-reduce in its LinearWithSyncFunc, autoslapo's sync counts them once)"
        )
    print("Module size attributes (nn.Linear in/out_features, attention head counts):")
    for other in ("autoslapo-layers", "slapo"):
        print("\n".join(attr_lines(ref_attrs, other, layouts[other][1], spec.layers)))
    column = {*QKV, MLP_IN}
    slapo_bad = [n for n in ref_attrs if ref_attrs[n] != layouts["slapo"][1].get(n)]
    if slapo_bad and all(
        n.endswith(".in_features") and n.split(".", 1)[1][: -len(".in_features")] in column for n in slapo_bad
    ):
        print(
            "  (not a layout difference: Slapo 0.0.3's ShardLinear.postproc sets in_features to the shard size "
            "after sharding on axis 0 too, a missing `else`; nn.Linear's forward reads only its weight, so "
            "this is cosmetic, but code that reads in_features of a column-parallel linear gets a wrong value)"
        )
    dist.destroy_process_group()
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in load_end)} (1, 5, 15 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
