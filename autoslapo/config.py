"""``ScheduleConfig``: the knobs of one training schedule, as a frozen, validated dataclass.

Pure: checked before any device or process is touched (torchtitan's ``ParallelDims`` idea).
``__post_init__`` checks what a config means on its own; ``validate(model, cluster)`` checks it
against a model shape and a cluster, with messages that name the rule, the values and the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from autoslapo.errors import ConfigError
from autoslapo.knobs import Knob, bind_knobs, knob
from autoslapo.layout import check_layout, knob_applies
from autoslapo.models.spec import FAMILIES

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec

AttnKernel = Literal["eager", "sdpa", "flash"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]
CkptPlacement = Literal["front", "back", "spread"]
Precision = Literal["fp32", "bf16", "fp16"]
CkptGranularity = Literal["full", "selective", "op"]
LossKernel = Literal["eager", "chunked"]
NormKernel = Literal["eager", "fused"]

ATTN_KERNELS: tuple[str, ...] = ("eager", "sdpa", "flash")
PIPELINE_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
CKPT_PLACEMENTS: tuple[str, ...] = ("front", "back", "spread")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
CKPT_GRANULARITIES: tuple[str, ...] = ("full", "selective", "op")
LOSS_KERNELS: tuple[str, ...] = ("eager", "chunked")
NORM_KERNELS: tuple[str, ...] = ("eager", "fused")
#: Families whose norms are RMSNorms as transformers writes them (a chain of ops), which the
#: ``norm_kernel`` knob runs as one op; the others' LayerNorm is one kernel already. Each family's
#: ``rms_norm`` flag (``autoslapo.models.spec.FAMILIES``) says it.
RMS_NORM_FAMILIES: tuple[str, ...] = tuple(f for f, flags in FAMILIES.items() if flags.get("rms_norm"))
#: Tokens per chunk of the chunked loss kernel (its schedule and its cost both read this): 1024 x a
#: 50k-vocabulary shard is 200 MB of fp32 logits.
LOSS_CHUNK_TOKENS = 1024


def _all_or_no_layers_checkpointed(knobs: Mapping[str, Any], layers: int) -> bool:
    n = round(float(knobs.get("ckpt_ratio", 0.0)) * layers) if layers else -1
    return n in (0, layers) or float(knobs.get("ckpt_ratio", 0.0)) in (0.0, 1.0)


@dataclass(frozen=True)
class ScheduleConfig:
    """One point in the search space: every knob of a training schedule.

    Degrees: ``tp`` (tensor), ``pp`` (pipeline stages), ``dp`` (data replicas); world = tp*pp*dp.
    Batch: each data replica runs ``grad_accum`` micro-batches of ``micro_batch`` sequences per
    optimizer step (with ``pp > 1`` those are the pipeline's micro-batches), so the global batch is
    ``micro_batch * grad_accum * dp``. The other knobs say how memory is saved and which kernels
    run. Each field's ``knob(...)`` metadata is that knob's one declaration (see ``autoslapo.knobs``).
    """

    tp: int = field(default=1, metadata=knob(
        "int", "tensor-parallel degree", "tp", ordered=True, auto=True, brief=True, verify=True, effect=True, user_file=True))
    pp: int = field(default=1, metadata=knob(
        "int", "pipeline stages", "pp", ordered=True, auto=True, brief=True, verify=True, effect=True, user_file=True))
    dp: int = field(default=1, metadata=knob(
        "int", "data-parallel replicas (derived: --gpus / (tp*pp))", "dp", ordered=True, derived=True, brief=True, user_file=True))
    micro_batch: int = field(default=1, metadata=knob(
        "int", "sequences per micro-batch", "mb", ordered=True, auto=True, brief=True, effect=True, user_file=True))
    grad_accum: int = field(default=1, metadata=knob(
        "int", "micro-batches per replica and optimizer step (the pipeline's micro-batches when pp > 1; "
        "derived from the global batch)", "accum", ordered=True, derived=True, brief=True, verify=True, user_file=True))
    ckpt_ratio: float = field(default=0.0, metadata=knob(
        "ratio", "share of the layers whose activations are checkpointed (recomputed), 0-1", "ckpt",
        ordered=True, sweep=(0.0, 0.25, 0.5, 0.75, 1.0), brief=True, verify=True, effect=True, user_file=True))
    ckpt_placement: CkptPlacement = field(default="front", metadata=knob(
        "choice", "which layers are checkpointed: front (held longest under 1F1B), back, or spread",
        "place", choices=CKPT_PLACEMENTS, verify=True, inert=_all_or_no_layers_checkpointed, user_file=True))
    zero_stage: int = field(default=0, metadata=knob(
        "int", "ZeRO stage: 1 partitions optimizer state, 2 also gradients, 3 also parameters over dp",
        "zero", choices=(0, 1, 2, 3), ordered=True, sweep=(0, 1, 2, 3), brief=True, effect=True,
        inert=lambda k, _: k.get("dp", 1) == 1, user_file=True))
    attn_kernel: AttnKernel = field(default="sdpa", metadata=knob(
        "choice", "attention kernel", "attn", choices=ATTN_KERNELS, flag="--attn", sweep=ATTN_KERNELS,
        brief=True, verify=True, effect=True, transformer_only=True, user_file=True))
    fuse_bias_gelu: bool = field(default=False, metadata=knob(
        "bool", "fuse the MLP's bias + GeLU", "fuse", verify=True, effect=True, transformer_only=True, user_file=True))
    compile_layers: bool = field(default=False, metadata=knob(
        "bool", "run each layer as a torch.compile region", "compile", verify=True))
    sequence_parallel: bool = field(default=False, metadata=knob(
        "bool", "sequence parallelism: norms and dropout split over the tp group (needs tp > 1)", "sp",
        sweep=(False, True), verify=True, effect=True, inert=lambda k, _: k.get("tp", 1) == 1,
        transformer_only=True))
    pipeline_schedule: PipelineSchedule = field(default="1f1b", metadata=knob(
        "choice", "pipeline schedule", "sched", choices=PIPELINE_SCHEDULES, effect=True,
        inert=lambda k, _: k.get("pp", 1) == 1, user_file=True))
    virtual_stages: int = field(default=1, metadata=knob(
        "int", "pipeline chunks per rank (the interleaved schedule)", "vs", ordered=True,
        inert=lambda k, _: k.get("pp", 1) == 1 or k.get("pipeline_schedule", "1f1b") != "interleaved", user_file=True))
    precision: Precision = field(default="bf16", metadata=knob(
        "choice", "parameter and compute precision (default: bf16 where the device has it)", "prec",
        choices=PRECISIONS, user_file=True))
    ckpt_granularity: CkptGranularity = field(default="full", metadata=knob(
        "choice", "what a checkpointed layer recomputes: full (the whole layer, keeping its input) or "
        "selective (only the attention core, keeping the linear layers' outputs; Korthikanti et al. 2022) or "
        "op (per-op: keep the fused attention kernel's output and every other linear layer's, recompute the "
        "rest; torchtitan's selective op policy); "
        "searched when free, but full when only --ckpt-ratio is pinned",
        "gran", choices=CKPT_GRANULARITIES, sweep=CKPT_GRANULARITIES, verify=True, since=2,
        inert=lambda k, _: float(k.get("ckpt_ratio", 0.0)) == 0.0, transformer_only=True, refines="ckpt_ratio", user_file=True))
    loss_kernel: LossKernel = field(default="eager", metadata=knob(
        "choice", "cross-entropy kernel: eager (whole tokens x vocabulary logits) or chunked (head matmul, "
        "log-softmax and loss chunk by chunk over tokens, logits recomputed in backward)", "loss",
        choices=LOSS_KERNELS, sweep=LOSS_KERNELS, verify=True, since=2, transformer_only=True))
    channels_last: bool = field(default=False, metadata=knob(
        "bool", "keep a convolutional network's feature maps channels-last (NHWC), the layout cuDNN's "
        "tensor-core convolutions read; in the default NCHW each convolution's input and output are "
        "transposed around it", "cl", sweep=(False, True), verify=True, since=3, conv_only=True))
    norm_kernel: NormKernel = field(default="eager", metadata=knob(
        "choice", "RMSNorm kernel (LLaMA, T5): eager (transformers' chain of ops, which keeps an fp32 copy of "
        "its input and the normalized tensor for backward) or fused (one op keeping its input and a "
        "reciprocal RMS a row; torch's one-kernel RMSNorm on CUDA)", "norm", choices=NORM_KERNELS,
        sweep=NORM_KERNELS, verify=True, since=4, families=RMS_NORM_FAMILIES))

    def __post_init__(self) -> None:
        for k in KNOBS:
            object.__setattr__(self, k.name, k.check(getattr(self, k.name)))
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("sequence_parallel needs tp > 1: got tp=1; set tp >= 2 or turn it off")
        if self.pipeline_schedule == "interleaved":
            if self.pp == 1 or self.virtual_stages < 2:
                raise ConfigError(
                    f"the interleaved pipeline schedule needs pp > 1 and virtual_stages >= 2: got "
                    f"pp={self.pp}, virtual_stages={self.virtual_stages}; use 1f1b or raise them"
                )
            if self.grad_accum % self.pp:
                raise ConfigError(
                    f"the interleaved schedule needs micro-batches divisible by pp: got grad_accum="
                    f"{self.grad_accum}, pp={self.pp}; use a multiple of {self.pp}"
                )
        elif self.virtual_stages != 1:
            raise ConfigError(
                f"virtual_stages > 1 needs the interleaved schedule: got virtual_stages="
                f"{self.virtual_stages} with pipeline_schedule={self.pipeline_schedule}"
            )
        if self.pp > 1 and self.zero_stage >= 3:
            # a stage's weights stay whole (ZeRO-3 would gather them every micro-batch and chunk); its
            # gradients may be sharded (ZeRO-2: ``autoslapo.runtime.engine.GradientOwners``)
            raise ConfigError(
                f"zero_stage {self.zero_stage} cannot run with pipeline parallelism (pp={self.pp}): "
                "pipelines support ZeRO 0-2; use zero_stage <= 2 or pp=1"
            )

    # --- derived -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    def checkpointed_layers(self, layers: int) -> list[int]:
        """Indices of the layers to checkpoint out of ``layers``, per ratio and placement."""
        n = round(self.ckpt_ratio * layers)
        if n <= 0:
            return []
        if self.ckpt_placement == "front":
            return list(range(n))
        if self.ckpt_placement == "back":
            return list(range(layers - n, layers))
        return sorted({min(layers - 1, int(i * layers / n)) for i in range(n)})

    # --- validation against a model and a cluster ------------------------------------------
    def validate(self, model: ModelSpec, cluster: ClusterSpec | None = None) -> ScheduleConfig:
        """Check the config against a model shape and (optionally) a cluster; returns self.

        The rules live in ``autoslapo.layout``. Raises ConfigError naming the rule, the values and the fix.
        """
        check_layout(self, model, cluster)
        return self

    # --- (de)serialization ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict (what the store saves and Ray ships)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScheduleConfig:
        """Inverse of ``to_dict``; unknown keys are an error, missing ones take defaults."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown schedule knobs {unknown}; valid knobs are {sorted(known)}")
        return cls(**d)

    def config_hash(self) -> str:
        """Stable digest of every knob (the store's duplicate-trial key): ``config_hash(self.to_dict())``."""
        return config_hash(self.to_dict())

    def with_(self, **changes: Any) -> ScheduleConfig:
        """A validated copy with some knobs changed."""
        return replace(self, **changes)


#: Every knob, in field order: the one list every consumer reads.
KNOBS: tuple[Knob, ...] = bind_knobs(ScheduleConfig)
KNOB: dict[str, Knob] = {k.name: k for k in KNOBS}


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 hex digest of a knob dict as canonical JSON (sorted keys, no spaces).

    Knobs added after the first knob set (``Knob.since > 1``) are left out while at their default,
    so trials stored before such a knob existed keep their digests. One function for the tuner and
    the store: equal configurations have equal digests everywhere.
    """
    kept = {k: v for k, v in config.items()
            if not (k in KNOB and KNOB[k].since > 1 and v == KNOB[k].default)}
    blob = json.dumps(kept, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def later_knob_defaults(pinned: Mapping[str, Any], keep: tuple[str, ...] = ()) -> dict[str, Any]:
    """The knobs newer than the first set (``since`` > 1) that ``pinned`` leaves free, at their defaults
    (but those in ``keep``): what a published run's stack had no choice of, so that a knob added later
    does not move the validation's rows (``cost.heldout``, ``cost.published``)."""
    return {k.name: k.default for k in KNOBS if k.since > 1 and k.name not in pinned and k.name not in keep}


def describe(config: Mapping[str, Any], family: str | None = None) -> str:
    """One line for tables: the brief knobs always, the others when they matter and are not at default.

    With ``family``, the knobs that do not act on it are left out (``attn=sdpa`` on a convolutional
    model, whose config keeps the default)."""
    parts = []
    for k in KNOBS:
        if k.name not in config or (family is not None and not knob_applies(k, family)):
            continue
        v = config[k.name]
        if k.brief or (v != k.default and not (k.inert and k.inert(config, 0))):
            parts.append(k.show(v))
    return " ".join(parts)
