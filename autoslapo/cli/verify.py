"""``autoslapo verify MODEL --tp T --pp P``: apply a family's schedule on local ranks and check it.

Spawns ``tp * pp`` gloo ranks on this machine. Every rank builds the model from the same seed,
applies ``autoslapo.plan.apply_schedule`` inside ``autoslapo.verify.Verify`` (which compares the
outputs and every parameter's value and gradient with an unscheduled copy, sharded parameters
gathered over the tensor-parallel group). With ``pp > 1`` it then builds the pipeline from the
schedule's cuts, runs one pipelined step on micro-batches and compares the loss and every stage
parameter's gradient with the unscheduled model's (tied embedding/head gradients summed over the
stages that hold them).

The model keeps the preset's widths (hidden, heads, ffn, vocab) unless the shape flags change them;
``--layers`` shortens the layer stack,
by default to 2 layers per pipeline chunk: every layer gets the same primitives, so more layers
check nothing new and cost time. ``--layers 0`` keeps the preset's depth. The summary says which.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from autoslapo.cli._knobs import add_knob_arguments, check_refinements, knob_values
from autoslapo.cli._shape import add_shape_arguments, shape_overrides
from autoslapo.errors import TrialError, UsageError

DTYPES = ("float32", "float64")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the verify command's arguments."""
    parser.add_argument("model", help="a preset name, e.g. bert, gpt2, llama-tiny (see `autoslapo models`), a Hugging Face config.json or a model file (.py)")
    # The test batch is --batch sequences: with pp > 1, grad_accum (default max(2, pp)) pipeline micro-batches of it.
    add_knob_arguments(parser, "verify", defaults={"grad_accum": None})
    parser.add_argument("--device", choices=("cpu",), default="cpu", help="where the ranks run (cpu: gloo)")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size of the test batch (default 4, or the fewest whole micro-batches above it)")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="parameter dtype (default float32)"
    )
    parser.add_argument("--seed", type=int, default=0, help="weight and batch seed")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are stopped")
    add_shape_arguments(
        parser,
        defaults={"seq_len": 32},
        helps={
            "layers": "layers to verify (default: 2 per pipeline chunk; 0: the preset's full depth)",
            "seq_len": "sequence length of the test batch (default 32)",
        },
    )


def _plan(args: argparse.Namespace) -> tuple[Any, Any, int]:
    """Validate the input before any process starts; returns (spec, config, full depth)."""
    from autoslapo.config import ScheduleConfig
    from autoslapo.models.hf import check_hf_spec
    from autoslapo.models.resolve import resolve_model

    widths = {k: v for k, v in shape_overrides(args).items() if k not in ("layers", "seq_len")}
    spec = resolve_model(args.model, **widths)
    full_layers = spec.layers
    knobs = knob_values(args, "verify")
    check_refinements(knobs)
    grad_accum = knobs.pop("grad_accum", max(2, knobs["pp"])) if knobs["pp"] > 1 else knobs.pop("grad_accum", 1)
    if args.batch is None:  # 4 sequences, or the fewest whole micro-batches above that
        args.batch = grad_accum * -(-4 // grad_accum) if grad_accum > 0 else 4
    if args.seq_len < 1 or args.batch < 1 or grad_accum < 1:
        raise UsageError(
            f"--seq-len, --batch and --grad-accum must be >= 1: got {args.seq_len}, {args.batch}, {grad_accum}"
        )
    if args.batch % grad_accum:
        raise UsageError(
            f"--batch must split into --grad-accum micro-batches: got batch={args.batch}, grad_accum={grad_accum}"
        )
    if knobs["pp"] > 1 and grad_accum < knobs["pp"]:
        raise UsageError(f"a pipeline needs at least one micro-batch per stage: got --grad-accum {grad_accum} for "
                         f"--pp {knobs['pp']}; use --grad-accum >= {knobs['pp']}")
    if args.layers is not None and args.layers < 0:
        raise UsageError(f"--layers must be >= 0: got {args.layers}")
    pp = knobs["pp"]
    if spec.family == "user":
        # a model file is verified whole, on its own batch (its depth and sequence are its own)
        if args.layers:
            raise UsageError(f"--layers does not apply to a model file (its depth is its own): got --layers "
                             f"{args.layers} with {args.model}; drop it")
        config = ScheduleConfig(micro_batch=args.batch // grad_accum, grad_accum=grad_accum, precision="fp32", **knobs)
        config.validate(spec)
        return spec, config, spec.layers
    if args.layers:
        layers = args.layers
    elif args.layers == 0 or full_layers <= 2 * pp:
        layers = full_layers
    else:
        layers = 2 * pp
    # a --seq-len past a learned position table grows the table, as run and estimate do
    spec = spec.with_overrides(layers=layers, seq_len=args.seq_len)
    check_hf_spec(spec)  # a config's rules on the sequence (a sliding window covers it)
    config = ScheduleConfig(micro_batch=args.batch // grad_accum, grad_accum=grad_accum, precision="fp32", **knobs)
    config.validate(spec)
    return spec, config, full_layers


def run(args: argparse.Namespace) -> int:
    """Verify the schedule on ``tp * pp`` local ranks; prints one summary line, returns 0.

    Raises: UsageError (exit 2) for bad input, before any process starts; VerifyError (exit 1) naming
    the first mismatching output or gradient.
    """
    if not args.timeout > 0:  # (NaN too) the ranks would time out before they meet
        raise UsageError(f"--timeout must be positive seconds: got {args.timeout}; the default is 600")
    spec, config, full_layers = _plan(args)
    from autoslapo.runtime.check import check_fits_here

    check_fits_here(spec, config, device=args.device, fix="lower --seq-len or --batch, or verify fewer --layers")
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from autoslapo.dist import SpawnTimeout, spawn

    start = time.perf_counter()
    opts = {
        "batch": args.batch,
        "seq_len": spec.seq_len,
        "grad_accum": config.grad_accum,
        "dtype": args.dtype,
        "seed": args.seed,
    }
    # Imported once in the fork server rather than in every rank (the model module alone takes
    # seconds to import on a busy 2-core machine).
    model_module = (
        "autoslapo.models.wideresnet" if spec.family == "wideresnet"
        else f"transformers.models.{spec.family}.modeling_{spec.family}"
    )
    preload = (
        "torch",
        "torch.distributed",
        "transformers",
        *([model_module] if spec.family != "user" else []),
        "autoslapo.models.build",
        "autoslapo.plan",
        "autoslapo.verify",
    )
    try:
        results = spawn(
            _rank_main,
            config.world_size,
            spec.to_dict(),
            config.to_dict(),
            opts,
            timeout=args.timeout,
            preload=preload,
        )
    except SpawnTimeout as err:  # a shape too slow for --timeout reads as what it is, not as a hang
        raise TrialError(
            f"verify's ranks must finish within --timeout: {err.done} of {config.world_size} done after "
            f"{args.timeout:g} s, the others still computing or waiting on one that is; raise --timeout, or "
            f"lower --seq-len or --batch (got {args.batch}x{spec.seq_len})"
        ) from None
    elapsed = time.perf_counter() - start
    checked = sum(r["checked"] for r in results)
    max_diff = max(r["max_diff"] for r in results)
    depth = (
        f"{spec.layers} of {full_layers} layers" if spec.layers != full_layers else f"{spec.layers} layers"
    )
    pipe = f", pipeline {results[0]['pipeline']}" if config.pp > 1 else ""
    shape = f"{spec.num_params():,} parameters" if spec.family == "user" else f"hidden {spec.hidden}"
    from autoslapo.models.spec import is_convolutional

    if is_convolutional(spec.family):  # no attention, tokens or vocabulary; its layout knob
        kernels = "channels-last" if config.channels_last else "nchw"
    else:
        from autoslapo.layout import user_knob_ok  # a model file's own attention / MLP: as written

        attn = config.attn_kernel if user_knob_ok("attn_kernel", "eager", spec) else "as written"
        kernels = (f"attn={attn}{' sp' if config.sequence_parallel else ''}"
                   f"{' chunked-loss' if config.loss_kernel == 'chunked' else ''}"
                   f"{' fused-bias-gelu' if config.fuse_bias_gelu and user_knob_ok('fuse_bias_gelu', True, spec) else ''}"
                   f"{' fused-rmsnorm' if config.norm_kernel == 'fused' else ''}")
    print(
        f"verify {args.model}: ok - tp={config.tp} pp={config.pp} ckpt_ratio={config.ckpt_ratio:g}"
        f"{' ' + config.ckpt_granularity if config.ckpt_granularity != 'full' and config.ckpt_ratio > 0 else ''} "
        f"{kernels}; {shape}, {depth}, "
        f"batch {args.batch}x{spec.seq_len} {args.dtype}, dropout off; {checked} checks of outputs and "
        f"parameter values/gradients on {config.world_size} rank{'s' if config.world_size != 1 else ''}{pipe}; max abs diff "
        f"{max_diff:.2g}; {elapsed:.1f} s"
    )
    return 0


# -- what every rank runs ---------------------------------------------------------------------------


def _max_diff(a: Any, b: Any) -> float:
    import torch

    a, b = a.detach(), b.detach().to(a.device)
    if not a.numel() or (a.dtype == b.dtype and torch.equal(a, b)):
        return 0.0
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    return float((a.to(dtype) - b.to(dtype)).abs_().max())


def _measured_verify() -> type:
    from autoslapo.verify import Verify

    class MeasuredVerify(Verify):
        """Verify that also remembers the largest difference it saw (for the summary line)."""

        max_diff = 0.0

        def _compare(self, what: str, got: Any, want: Any) -> str | None:
            if got.shape == want.shape:
                self.max_diff = max(self.max_diff, _max_diff(got, want))
            return super()._compare(what, got, want)  # type: ignore[no-any-return]

    return MeasuredVerify


def _rank_main(spec_d: dict[str, Any], config_d: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
    import torch

    from autoslapo.config import ScheduleConfig
    from autoslapo.dist import build_groups
    from autoslapo.models.build import build_model, example_batch
    from autoslapo.models.spec import ModelSpec
    from autoslapo.models.user import user_loss
    from autoslapo.plan import apply_schedule
    from autoslapo.schedule import create_schedule

    _MeasuredVerify = _measured_verify()
    spec = ModelSpec.from_dict(spec_d)
    config = ScheduleConfig.from_dict(config_d)
    groups = build_groups(config.tp, config.pp, config.dp)
    dtype = getattr(torch, opts["dtype"])
    # Dropout off: under tensor parallelism no unscheduled model draws the same masks.
    model = build_model(spec, attn_kernel=config.attn_kernel, seed=opts["seed"], dtype=dtype, dropout=0.0)
    batch = example_batch(spec, opts["batch"], opts["seq_len"], seed=opts["seed"] + 1)
    sch = create_schedule(model, group=groups.tp_group)
    # The compiler is only needed for compile_layers/fuse regions; "eager" checks the rewrite itself.
    with _MeasuredVerify(sch, batch, loss_fn=user_loss) as v:
        apply_schedule(sch, spec, config, groups, compiler="eager")
    out: dict[str, Any] = {"checked": len(v.checked), "max_diff": v.max_diff, "pipeline": ""}
    if config.pp > 1:
        n, diff, what = _verify_pipeline(sch, spec, config, groups, batch, opts)
        out["checked"] += n
        out["max_diff"] = max(out["max_diff"], diff)
        out["pipeline"] = what
    return out


def _last_output(spec: Any, out: Any) -> Any:
    """What the last pipeline stage hands the loss, from the whole model's output: its logits, or for
    a model file (whose stages run its forward to the loss it computes) that loss."""
    from autoslapo.models.user import USER_FAMILY, user_loss

    return user_loss(out) if spec.family == USER_FAMILY else out.logits


def _verify_pipeline(
    sch: Any, spec: Any, config: Any, groups: Any, batch: dict[str, Any], opts: dict[str, Any]
) -> tuple[int, float, str]:
    """One pipelined step vs the unscheduled model: loss and every stage parameter's gradient.

    The stages are the pipeline's own choice (``autoslapo.pipeline.build_stage_modules``: a family's
    adapter, T5's two stacks as one layer list, a model file's shell); the reference takes the batch
    keys the first stage takes and is scored against the target the last stage's loss reads.
    """
    import torch
    import torch.distributed as dist

    from autoslapo.errors import VerifyError
    from autoslapo.models.build import build_model
    from autoslapo.pipeline import build_pipeline
    from autoslapo.primitives.tp import gather_shards, shard_spec
    from autoslapo.runtime.train import loss_function
    from autoslapo.verify import default_tolerance

    model = sch.mod
    model.eval()  # dropout is off anyway; eval keeps both runs deterministic
    # the schedule's check above trained BatchNorm's running statistics (WideResNet), which eval mode
    # reads; start them afresh, as the reference's are (a tp-split bn1 keeps its channels' slice)
    for mod in model.modules():
        if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
            mod.reset_running_stats()
    dtype = next(model.parameters()).dtype
    ref = build_model(spec, attn_kernel=config.attn_kernel, seed=opts["seed"], dtype=dtype, dropout=0.0)
    ref.eval()
    m = opts["grad_accum"]
    loss_fn = loss_function(spec)
    runtime = build_pipeline(
        sch,
        pp_group=groups.pp_group,
        grad_accum=m,
        schedule=config.pipeline_schedule,
        loss_fn=loss_fn,
    )

    # Reference: the mean of the micro-batch losses (torch's pipeline schedules scale by 1/m).
    micro = [{k: v.chunk(m)[i] for k, v in batch.items()} for i in range(m)]
    ref_losses = [
        loss_fn(_last_output(spec, ref(**{k: mb[k] for k in runtime.input_keys})), mb[runtime.target_key])
        for mb in micro
    ]
    ref_loss = torch.stack(ref_losses).mean()
    ref_loss.backward()

    loss = runtime.step(*[batch[k] for k in runtime.input_keys], target=batch[runtime.target_key])
    # build_pipeline's step already sums the gradients of weights tied across stages.
    mine = {id(p) for mod in runtime.modules for p in mod.parameters()}
    names = dict(model.named_parameters())
    ref_params = dict(ref.named_parameters())
    rtol, atol = default_tolerance(dtype)
    error: str | None = None
    checked, worst = 0, 0.0
    if runtime.has_last and loss is not None:
        worst = _max_diff(loss, ref_loss)
        if not torch.allclose(loss.double(), ref_loss.detach().double(), rtol=rtol, atol=atol):
            error = f"pipelined loss {float(loss):.6g} differs from the reference {float(ref_loss):.6g}"
        checked += 1
    for name, p in names.items():
        if id(p) not in mine or name not in ref_params:
            continue
        spec_ = shard_spec(p)
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        full = gather_shards(grad, spec_) if spec_ is not None else grad
        want = ref_params[name].grad
        if want is None:
            continue
        d = _max_diff(full, want)
        worst = max(worst, d)
        checked += 1
        if error is None and not torch.allclose(full.double(), want.double(), rtol=rtol, atol=atol):
            error = f"pipelined gradient of {name} differs from the reference: max abs diff {d:.3g}"
    verdicts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, error)
    for rank, err in enumerate(verdicts):
        if err is not None:
            raise VerifyError(f"{err} (rank {rank})")
    what = f"{runtime.num_stages} stages x {m} micro-batches"
    return checked, worst, what
