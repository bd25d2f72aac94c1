"""The step time of a user's own module (family ``user``) from its traced shape: ``estimate_user_time``.

Split from ``autoslapo.cost.time`` (whose rates, collectives and breakdown it uses);
``autoslapo.cost.time.estimate_time`` calls it for a model file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoslapo.cost.comm import collective_s, gradient_sync_s, group_bandwidth, group_nodes
from autoslapo.cost.epilogue import accumulation_s, loss_scaler_s, optimizer_s
from autoslapo.cost.memory import checkpointed_layer_ids, state_bytes_per_param
from autoslapo.cost.p2p import pipeline_p2p_s
from autoslapo.cost.time import TimeBreakdown, _Rates, bubble_slots
from autoslapo.layout import rank_layers

if TYPE_CHECKING:
    from autoslapo.cluster import ClusterSpec
    from autoslapo.config import ScheduleConfig
    from autoslapo.cost.device import DevicePerf
    from autoslapo.models.spec import ModelSpec


def estimate_user_time(model: ModelSpec, config: ScheduleConfig, cluster: ClusterSpec,
                       perf: DevicePerf) -> TimeBreakdown:
    """Seconds of one optimizer step of a user's own module (family ``user``), from its trace: the
    traced FLOPs at the achievable rate, a memory pass over each block's saved activations and a
    latency per traced op (backward twice forward); TP divides the blocks' FLOPs and adds four
    all-reduces of a block's input per block; DP/ZeRO as for the families; checkpointed blocks (or
    their attention cores) run again. Pipeline stages split the blocks; the last runs all outside them;
    the busiest rank (the last, unless an uneven split gives another more blocks) sets every slot; a
    block's input passes between stages; outside gradients are summed over pp."""
    r = _Rates(perf, cluster, config)
    x = model.extra
    t, dp, m, b, z, pp, v = (config.tp, config.dp, config.grad_accum, config.micro_batch, config.zero_stage,
                             config.pp, config.virtual_stages)
    scale = r.e / 4
    blocks = model.layers if x.get("layers") else 0
    # each rank's blocks and checkpointed ones (chunks as even as they can be: ``layout.chunk_sizes``)
    ranks = rank_layers(blocks, pp, v) if blocks else [[] for _ in range(pp)]
    ckpt = set(checkpointed_layer_ids(model, config)) if blocks else set()
    layer_f = r.mem(float(x["layer_act_bytes"]) * scale * b / t, int(x["layer_ops"]))
    layer_f += float(x["layer_fwd_flops"]) * b / t / r.flops_s
    rest_flops = float(x["fwd_flops"]) - blocks * float(x["layer_fwd_flops"])
    rest_ops = int(x["ops"]) - blocks * int(x["layer_ops"])
    rest_f = rest_flops * b / r.flops_s + r.mem(float(x["act_bytes"]) * scale * b, max(rest_ops, 1))
    hidden_bytes = float(x["layer_input_bytes"]) * scale * b
    tp_one = collective_s("allreduce", hidden_bytes, t, group_bandwidth(cluster, 1, t), perf)
    # the slot is the busiest rank's: the last runs all outside the blocks
    slot = max(range(pp), key=lambda i: len(ranks[i]) * layer_f + (rest_f if i == pp - 1 else 0.0))
    per_stage, n_ckpt = len(ranks[slot]), sum(1 for i in ranks[slot] if i in ckpt)
    n_params = max(len(r) for r in ranks) * model.layer_params() / t + model.embedding_params()
    weight_e, grad_e, _ = state_bytes_per_param(config, perf.runtime)  # fp32 in autoslapo's runtime
    # the fp16 loss scaler hooks each parameter tensor of the busiest rank (a trace from before they
    # were counted gives none: the hooks' bytes only)
    lt = int(x.get("layer_tensors", 0))
    tensors = per_stage * lt + int(x.get("tensors", 0)) - blocks * lt
    accum = accumulation_s(r.mem, n_params, grad_e, m) + loss_scaler_s(r.mem, config, perf.runtime, n_params, tensors)
    fwd_mb = per_stage * layer_f + rest_f
    bwd_mb = 2 * fwd_mb + accum
    dp_bw, pp_bw = group_bandwidth(cluster, t, dp), group_bandwidth(cluster, t * dp, pp)
    g_bytes, w_bytes = n_params * grad_e, n_params * weight_e
    if z <= 1:
        dp_comm = gradient_sync_s(g_bytes, cluster, t, dp, perf, z)
    elif z == 2:
        dp_comm = m * collective_s("reduce_scatter", g_bytes, dp, dp_bw, perf) + collective_s("all_gather", w_bytes, dp, dp_bw, perf)
    else:
        dp_comm = m * (2 * collective_s("all_gather", w_bytes, dp, dp_bw, perf) + collective_s("reduce_scatter", g_bytes, dp, dp_bw, perf))
    # recomputed: a block and its collectives, or (selective) its attention core's traced ops and FLOPs
    core = max(float(x["attn_act_bytes"]) - float(x["attn_kept_bytes"]), 0.0) * scale * b / t
    again = (r.mem(core, int(x["attn_core_ops"])) + float(x["attn_core_flops"]) * b / t / r.flops_s
             if config.ckpt_granularity == "selective" else layer_f + 2 * tp_one)
    rec_mb, tp_mb = n_ckpt * again, per_stage * 4 * tp_one
    slots = bubble_slots(config, blocks, per_stage)
    transfer = hidden_bytes / (pp_bw * 1e9 * perf.comm_eff) + perf.coll_latency_s if pp > 1 else 0.0
    tied = (collective_s("allreduce", model.embedding_params() * 4, pp, pp_bw, perf, group_nodes(cluster, t * dp, pp))
            if pp > 1 else 0.0)
    opt_params = n_params / (dp if z >= 1 else 1)
    return TimeBreakdown(
        compute=m * (fwd_mb + bwd_mb),
        recompute=m * rec_mb,
        tp_comm=m * tp_mb,
        pp_comm=pipeline_p2p_s(perf.pipeline_engine, m, pp, slots, v, transfer, fwd_mb / v) + tied,
        bubble=slots * (fwd_mb + bwd_mb + rec_mb + tp_mb),
        dp_comm=dp_comm,
        optimizer=optimizer_s(r.mem, config, opt_params),
        overhead=perf.step_overhead_s + m * perf.microbatch_overhead_s,
    )
