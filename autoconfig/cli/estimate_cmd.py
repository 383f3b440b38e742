"""``autoconfig estimate``: memory and step time of one plan the user gives.

The command that checks the model against measured runs: one plan in,
predictions with their breakdowns out (a table, or JSON with --format json).
"""

import json

import click
from tabulate import tabulate

from autoconfig.core import catalog
from autoconfig.cli.search_cmd import (DEFAULT_GPU, gpus_per_node_for, model_options,
                                       resolve_model)
from autoconfig.errors import InputError
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.training.memory import usable_bytes
from autoconfig.core.plan import (PRECISIONS, RECOMPUTE_KINDS, RECOMPUTE_METHODS, Plan, PlanTable,
                             Workload, describe_plan)
from autoconfig.training.search import GIB, MEMORY_FIELDS, TIME_FIELDS, evaluate
from autoconfig.training.space import check_plan, dp_for


def estimate_plan(model, workload, cluster, plan) -> dict:
    """Predictions for one plan as a JSON-ready dict."""
    check_plan(model, workload, cluster, plan)
    table, fit = evaluate(model, workload, cluster, PlanTable.from_plans([plan]))
    row = table.iloc[0]
    return {
        "model": model.name, "gpu": cluster.gpu.name, "gpus": cluster.num_gpus,
        "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
        "global_batch_size": workload.global_batch_size, "seq_len": workload.seq_len,
        "precision": workload.precision,
        "plan": plan.to_dict(),
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


def render_table(result: dict) -> str:
    plan = Plan(**result["plan"])
    head = (f"{result['model']} on {result['gpus']} x {result['gpu']}, gbs "
            f"{result['global_batch_size']}, seq {result['seq_len']}, {result['precision']}: "
            f"{describe_plan(plan)}")
    rows = [("step time (s)", f"{result['step_time_s']:.4f}"),
            ("tokens/s/GPU", f"{result['tokens_per_s_per_gpu']:.1f}"),
            ("TFLOP/s/GPU (model)", f"{result['tflops_per_gpu']:.1f}"),
            ("MFU", f"{100 * result['mfu']:.1f}%"),
            ("memory (GiB/GPU)", f"{result['memory_gib']:.2f} of "
                                 f"{result['gpu_memory_gib']:.1f}"),
            ("fits", "yes" if result["fits"] else "NO")]
    rows += [(f"  memory: {k}", f"{v:.2f}") for k, v in result["memory_breakdown_gib"].items()]
    rows += [(f"  time: {k}", f"{v:.4f}") for k, v in result["time_breakdown_s"].items()]
    return head + "\n\n" + tabulate(rows, tablefmt="plain")


@click.command()
@model_options
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU type.")
@click.option("--gpus", type=int, required=True, help="Total GPUs (a whole number of nodes).")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: the GPU's usual node).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size.")
@click.option("--vp", type=int, default=1, show_default=True,
              help="Virtual pipeline stages per rank (interleaved 1F1B when > 1).")
@click.option("--cp", type=int, default=1, show_default=True, help="Context-parallel size.")
@click.option("--mbs", type=int, default=1, show_default=True, help="Micro-batch size.")
@click.option("--gbs", type=int, required=True, help="Global batch size in sequences.")
@click.option("--seq-len", type=int, help="Sequence length (default: the model's).")
@click.option("--recompute", type=click.Choice(RECOMPUTE_KINDS), default="none",
              show_default=True, help="Activation recompute granularity.")
@click.option("--recompute-method", type=click.Choice(RECOMPUTE_METHODS), default="uniform",
              show_default=True, help="For full recompute: uniform or block.")
@click.option("--recompute-num-layers", type=int, default=1, show_default=True,
              help="For full recompute: layers per group (uniform) or per chunk (block).")
@click.option("--sp/--no-sp", default=False, help="Sequence parallelism (needs tp > 1).")
@click.option("--distributed-optimizer/--no-distributed-optimizer", default=False,
              help="Shard optimizer state across data-parallel ranks.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def estimate(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu, gpu, gpus,
             gpus_per_node, tp, pp, vp, cp, mbs, gbs, seq_len, recompute, recompute_method,
             recompute_num_layers, sp, distributed_optimizer, precision, fmt) -> None:
    """Predict memory per GPU and step time of one plan."""
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         seq_len)
    if spec is None:
        raise InputError("no model: give --model (and --size) or an inline shape "
                         "(--layers --hidden --heads --vocab)")
    gpu_spec = catalog.get_gpu(gpu)
    cluster = cluster_from_gpus(gpu_spec, gpus, gpus_per_node_for(gpu_spec, gpus_per_node))
    workload = Workload(global_batch_size=gbs, seq_len=seq_len or spec.seq_len,
                        precision=precision)
    gpu_spec.peak_tflops(precision)  # fp8 on a GPU without it is an InputError
    for name, value in (("tp", tp), ("pp", pp), ("vp", vp), ("cp", cp), ("mbs", mbs)):
        if value < 1:
            raise InputError(f"invalid --{name} {value}: must be a positive integer")
    if tp > spec.num_heads:
        raise InputError(f"invalid --tp {tp}: larger than the {spec.num_heads} attention heads "
                         f"of {spec.name}")
    if sp and tp == 1:
        raise InputError("invalid --sp with --tp 1: sequence parallelism needs tp > 1")
    full = recompute == "full"
    plan = Plan(tp=tp, pp=pp, dp=dp_for(cluster.num_gpus, tp, pp, cp), cp=cp, vp=vp, sp=sp,
                mbs=mbs, recompute=recompute,
                recompute_method=recompute_method if full else "uniform",
                recompute_num_layers=recompute_num_layers if full else 0,
                distributed_optimizer=distributed_optimizer)
    result = estimate_plan(spec, workload, cluster, plan)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(render_table(result))
