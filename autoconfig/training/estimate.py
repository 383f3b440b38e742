"""Predictions for one plan the user gives (``autoconfig estimate``), the same
computation ``autoconfig validate`` scores against published runs."""

from dataclasses import replace

from autoconfig.training.dominance import dominated
from autoconfig.training.fp8 import workload_recipe
from autoconfig.core.plan import PlanTable
from autoconfig.training.offload import check_offload
from autoconfig.training.memory import (STAGE_RANKS, allocated_bytes, encoder_decoder_memory,
                                        memory_breakdown, stage_breakdown, usable_bytes)
from autoconfig.training.step_time import step_time
from autoconfig.training.search import (MEMORY_FIELDS, TIME_FIELDS, evaluate,
                                        megatron_fsdp_alternative)
from autoconfig.units import GIB
from autoconfig.training.space import check_plan
from autoconfig.training.stack import (SoftwareFeatures, check_runnable, fsdp_sharding,
                                      grad_reduce_dtype)


def estimate_plan(model, workload, cluster, plan, software: SoftwareFeatures,
                  stack: str = "", recipe: str | None = None, constants=None) -> dict:
    """Predictions for one plan as a JSON-ready dict: step time and rates, the
    memory of the most loaded stage and of each of the first, middle and last
    (tensors alone as torch's max_memory_allocated counts them, and on the
    device with allocator and context overhead, as nvidia-smi shows)."""
    check_plan(model, workload, cluster, plan, software.cp_comm_type)
    check_runnable(plan, software, stack or "given")
    check_offload(model, cluster.gpu, software, pp=plan.pp, recompute=plan.recompute)
    table, fit = evaluate(model, workload, cluster, PlanTable.from_plans([plan]), software,
                          recipe, constants)
    row = table.iloc[0]
    return {
        "model": model.name, "gpu": cluster.gpu.name, "gpus": cluster.num_gpus,
        "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
        "global_batch_size": workload.global_batch_size, "seq_len": workload.seq_len,
        "precision": workload.precision,
        **({"fp8_recipe": fp8} if (fp8 := workload_recipe(workload, software,
                                                          cluster.gpu)) else {}),
        "plan": plan.to_dict(),
        "stack": stack,
        "software": {"tp_comm_overlap": software.tp_comm_overlap,
                     "overlap_grad_reduce": software.overlap_grad_reduce,
                     "overlap_param_gather": software.overlap_param_gather,
                     "grad_reduce_dtype": grad_reduce_dtype(software),
                     "fused_attention": software.flash_attention,
                     "cross_entropy": software.cross_entropy,
                     "framework": software.framework,
                     "fsdp_sharding": fsdp_sharding(software),
                     "megatron_fsdp": software.megatron_fsdp},
        "micro_batches": int(row.micro_batches),
        "step_time_s": float(row.step_time_s),
        "tokens_per_s_per_gpu": float(row.tokens_per_s_per_gpu),
        "tflops_per_gpu": float(row.tflops_per_gpu),
        "mfu": float(row.mfu),
        "memory_gib": float(row.memory_gib),
        "memory_breakdown_gib": {name: float(row[f"{name}_gib"]) for name in MEMORY_FIELDS},
        "fits": bool(fit[0]),
        "gpu_memory_gib": float(usable_bytes(cluster.gpu)) / GIB,
        "time_breakdown_s": {name[:-2]: float(row[name]) for name in TIME_FIELDS},
        "memory_by_stage_gib": _stage_memory(model, workload, plan, software, recipe),
        "not_modelled": list(model.unmodelled),
        **_sharded_memory(model, workload, cluster, plan, software, recipe, bool(fit[0])),
        **_idle_recompute(model, workload, cluster, plan, row, software, recipe, constants),
        **_encoder_decoder_parts(model, workload, cluster, plan, software, recipe),
    }


def _sharded_memory(model, workload, cluster, plan, software, recipe, fits: bool) -> dict:
    """For a megatron-core plan that does not fit, with data parallelism and no
    expert parallelism: its memory per GPU under Megatron-FSDP, the fix a user
    may not know of (``--fsdp-sharding full-shard``); nothing otherwise."""
    sharded = megatron_fsdp_alternative(software)
    if fits or sharded is None or plan.dp * plan.cp < 2 or plan.ep > 1 \
            or model.is_encoder_decoder:
        return {}
    mem = memory_breakdown(model, workload, PlanTable.from_plans([plan]), software=sharded,
                           recipe=recipe)
    return {"megatron_fsdp_memory_gib": float(mem.total_bytes[0]) / GIB}


def _idle_recompute(model, workload, cluster, plan, row, software, recipe, constants) -> dict:
    """For a plan that recomputes (its predictions in ``row``): the same plan without
    recompute where that is as fast or faster in no more memory
    (``autoconfig.training.dominance``: the recompute spares nothing, e.g. selective
    recompute of the attention core under fused attention, which a search drops);
    nothing otherwise."""
    if plan.recompute == "none":
        return {}
    bare = replace(plan, recompute="none", recompute_method="uniform",
                   recompute_num_layers=0, recompute_modules="")
    table, _ = evaluate(model, workload, cluster, PlanTable.from_plans([bare]), software,
                        recipe, constants)
    both = [row, table.iloc[0]]
    if not dominated(PlanTable.from_plans([plan, bare]),
                     [r.step_time_s for r in both], [r.memory_gib * GIB for r in both],
                     [r.recompute_s for r in both])[0]:
        return {}
    return {"without_recompute": {"step_time_s": float(both[1].step_time_s),
                                  "memory_gib": float(both[1].memory_gib)}}


def _encoder_decoder_parts(model, workload, cluster, plan, software, recipe) -> dict:
    """For an encoder-decoder: the encoder's and the decoder's memory (allocated
    GiB, states and activations) and the cross-attention's share of compute."""
    if not model.is_encoder_decoder:
        return {}
    plans = PlanTable.from_plans([plan])
    parts = encoder_decoder_memory(model, workload, plans, software=software, recipe=recipe)
    times = step_time(model, workload, plans, cluster, software=software)
    return {
        "encoder_layers": model.encoder_layers, "decoder_layers": model.decoder_layers,
        "decoder_seq_len": model.decoder_seq_len,
        "memory_by_stack_gib": {part: {k: float(v[0]) / GIB for k, v in values.items()}
                                for part, values in parts.items()},
        "cross_attention_s": float(times.cross_attention_s[0]),
    }


def _stage_memory(model, workload, plan, software, recipe) -> dict:
    out = {}
    for stage in STAGE_RANKS:
        b = stage_breakdown(model, workload, PlanTable.from_plans([plan]), stage,
                            software=software, recipe=recipe)
        out[stage] = {"allocated": float(allocated_bytes(b)[0]) / GIB,
                      "device": float(b.total_bytes[0]) / GIB}
    return out


