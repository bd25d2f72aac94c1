"""``ScheduleConfig``: the knobs of one training schedule, as a frozen, validated dataclass.

Pure: checked before any device or process is touched (torchtitan's ``ParallelDims`` idea).
``__post_init__`` checks what a config means on its own; ``validate(model, cluster)`` checks it
against a model shape and a cluster, with messages that name the rule, the values and the fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from autoslapo.errors import ConfigError

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.models.spec import ModelSpec

AttnKernel = Literal["eager", "sdpa", "flash"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]
CkptPlacement = Literal["front", "back", "spread"]
Precision = Literal["fp32", "bf16", "fp16"]

ATTN_KERNELS: tuple[str, ...] = ("eager", "sdpa", "flash")
PIPELINE_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved")
CKPT_PLACEMENTS: tuple[str, ...] = ("front", "back", "spread")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class ScheduleConfig:
    """One point in the search space.

    Degrees: ``tp`` (tensor), ``pp`` (pipeline stages), ``dp`` (data replicas); world = tp*pp*dp.
    Batch: each data replica runs ``grad_accum`` micro-batches of ``micro_batch`` sequences per
    optimizer step (with ``pp > 1`` those are the pipeline's micro-batches), so the global batch is
    ``micro_batch * grad_accum * dp``.
    Memory: ``ckpt_ratio`` of the layers are activation-checkpointed, chosen by ``ckpt_placement``
    (``front``: the first layers, which hold activations longest under 1F1B; ``back``; ``spread``:
    evenly spaced); ``zero_stage`` 0-3 partitions optimizer state / gradients / parameters over dp.
    Kernels: ``attn_kernel``; ``fuse_bias_gelu`` fuses the MLP's bias + activation;
    ``compile_layers`` runs each layer as a ``torch.compile`` region.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    grad_accum: int = 1
    ckpt_ratio: float = 0.0
    ckpt_placement: CkptPlacement = "front"
    zero_stage: int = 0
    attn_kernel: AttnKernel = "sdpa"
    fuse_bias_gelu: bool = False
    compile_layers: bool = False
    sequence_parallel: bool = False
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: int = 1
    precision: Precision = "bf16"

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batch", "grad_accum", "virtual_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be a positive integer: got {v!r}")
        if not isinstance(self.ckpt_ratio, (int, float)) or not 0.0 <= float(self.ckpt_ratio) <= 1.0:
            raise ConfigError(f"ckpt_ratio must be between 0 and 1: got {self.ckpt_ratio!r}")
        object.__setattr__(self, "ckpt_ratio", float(self.ckpt_ratio))
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3: got {self.zero_stage!r}")
        for name, allowed in (
            ("attn_kernel", ATTN_KERNELS),
            ("pipeline_schedule", PIPELINE_SCHEDULES),
            ("ckpt_placement", CKPT_PLACEMENTS),
            ("precision", PRECISIONS),
        ):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}: got {getattr(self, name)!r}")
        for name in ("fuse_bias_gelu", "compile_layers", "sequence_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false: got {getattr(self, name)!r}")
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
        if self.pp > 1 and self.zero_stage >= 2:
            # DeepSpeed's pipeline engine (and Megatron) partition gradients per stage themselves;
            # ZeRO-2/3 would shard what the pipeline's schedule accumulates across micro-batches.
            raise ConfigError(
                f"zero_stage {self.zero_stage} cannot run with pipeline parallelism (pp={self.pp}): "
                "pipelines support ZeRO 0-1; use zero_stage <= 1 or pp=1"
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

        Raises:
            ConfigError: naming the rule, the values and the fix.
        """
        if cluster is not None and self.world_size != cluster.gpus:
            raise ConfigError(
                f"tp*pp*dp must equal --gpus: got tp={self.tp}, pp={self.pp}, dp={self.dp} "
                f"({self.world_size}) for --gpus {cluster.gpus}; pick degrees whose product is {cluster.gpus}"
            )
        if model.heads % self.tp or model.kv_heads % self.tp:
            raise ConfigError(
                f"tp must divide the attention heads: got tp={self.tp} for {model.heads} heads and "
                f"{model.kv_heads} key/value heads ({model.preset}); use a tp that divides {model.kv_heads}"
            )
        if model.ffn % self.tp:
            raise ConfigError(
                f"tp must divide the MLP width: got tp={self.tp} for ffn={model.ffn}; use a divisor of it"
            )
        chunks = self.pp * self.virtual_stages
        if model.layers % chunks:
            raise ConfigError(
                f"pipeline stages must split the layers evenly: got {model.layers} layers for "
                f"pp={self.pp} x virtual_stages={self.virtual_stages}; use a divisor of {model.layers}"
            )
        if self.sequence_parallel and model.seq_len % self.tp:
            raise ConfigError(
                f"sequence_parallel needs seq_len divisible by tp: got seq_len={model.seq_len}, tp={self.tp}"
            )
        if cluster is not None:
            dev = cluster.device
            if self.tp > cluster.devices_per_node and not cluster.allow_cross_node_tp:
                raise ConfigError(
                    f"tp must stay within a node: got tp={self.tp} with {cluster.devices_per_node} "
                    "devices per node; lower tp or allow cross-node tensor parallelism"
                )
            if self.attn_kernel == "flash" and not dev.flash_attention:
                raise ConfigError(
                    f"attn_kernel flash needs a device with FlashAttention: {dev.name} has none; use sdpa"
                )
            if self.precision == "bf16" and not dev.bf16:
                raise ConfigError(f"precision bf16 is not supported on {dev.name}; use fp16 or fp32")
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
        """Stable hash of every knob; two configs are the same trial iff their hashes match."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_(self, **changes: Any) -> ScheduleConfig:
        """A validated copy with some knobs changed."""
        return replace(self, **changes)
