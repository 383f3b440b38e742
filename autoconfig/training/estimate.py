"""Predictions for one plan the user gives (``autoconfig estimate``), the same
computation ``autoconfig validate`` scores against published runs."""

from autoconfig.core.plan import PlanTable
from autoconfig.training.memory import usable_bytes
from autoconfig.training.search import GIB, MEMORY_FIELDS, TIME_FIELDS, evaluate
from autoconfig.training.space import check_plan
from autoconfig.training.stack import SoftwareFeatures, grad_reduce_dtype


def estimate_plan(model, workload, cluster, plan, software: SoftwareFeatures,
                  stack: str = "") -> dict:
    """Predictions for one plan as a JSON-ready dict."""
    check_plan(model, workload, cluster, plan)
    table, fit = evaluate(model, workload, cluster, PlanTable.from_plans([plan]), software)
    row = table.iloc[0]
    return {
        "model": model.name, "gpu": cluster.gpu.name, "gpus": cluster.num_gpus,
        "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
        "global_batch_size": workload.global_batch_size, "seq_len": workload.seq_len,
        "precision": workload.precision,
        "plan": plan.to_dict(),
        "stack": stack,
        "software": {"tp_comm_overlap": software.tp_comm_overlap,
                     "overlap_grad_reduce": software.overlap_grad_reduce,
                     "overlap_param_gather": software.overlap_param_gather,
                     "grad_reduce_dtype": grad_reduce_dtype(software),
                     "fused_attention": software.flash_attention,
                     "framework": software.framework},
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
    }


