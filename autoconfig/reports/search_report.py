"""Writers for a search: ranked CSV, markdown report, best.yaml, and the
winner as a Megatron-LM command line and NeMo overrides.

Every file is written atomically (a temporary file in the same folder, then
``os.replace``), so an interrupted run never leaves half a report. Nothing
here carries a timestamp: the same search gives the same bytes.

Flag names: Megatron-LM ``megatron/training/arguments.py``; NeMo 1.x
``megatron_gpt_config.yaml`` (``model.activations_checkpoint_*``,
``model.optim.name=distributed_fused_adam``).
"""

from pathlib import Path

import yaml
from tabulate import tabulate

from autoconfig.atomic import write_atomic
from autoconfig.core.model import ModelSpec, total_params
from autoconfig.core.plan import Plan, Workload, describe_plan, recompute_label
from autoconfig.training.search import SearchResult
from autoconfig.training.space import R_MEMORY
from autoconfig.units import format_count

CSV_NAME = "plans.csv"
MARKDOWN_NAME = "report.md"
BEST_NAME = "best.yaml"
MEGATRON_NAME = "megatron_args.sh"
NEMO_NAME = "nemo_overrides.txt"

TOP_HEADERS = ("#", "TP", "PP", "VP", "CP", "DP", "SP", "MBS", "recompute", "dist-opt",
               "step s", "tok/s/GPU", "TFLOP/s/GPU", "MFU %", "mem GiB/GPU")


def top_rows(result: SearchResult, n: int) -> list[tuple]:
    """The rows of the top-plans table (as printed and in the markdown)."""
    rows = []
    for row in result.table.head(n).itertuples(index=False):
        recompute = recompute_label(row.recompute, row.recompute_method,
                                    row.recompute_num_layers)
        rows.append((row.rank, row.tp, row.pp, row.vp, row.cp, row.dp,
                     "on" if row.sp else "off", row.mbs, recompute,
                     "on" if row.distributed_optimizer else "off",
                     f"{row.step_time_s:.4g}", f"{row.tokens_per_s_per_gpu:.0f}",
                     f"{row.tflops_per_gpu:.1f}", f"{100 * row.mfu:.1f}",
                     f"{row.memory_gib:.1f}"))
    return rows


MEMORY_REASONS = (R_MEMORY,)
"""Rejections of a layout that is valid but does not fit; every other reason
is a structural rule of ``training/space.py``: the layout can never run."""


def rejection_lines(result: SearchResult) -> list[str]:
    """'considered N: M fit, X never valid, Y do not fit in memory', then one
    line per reason under its kind."""
    never = {r: n for r, n in result.rejected.items() if r not in MEMORY_REASONS}
    memory = {r: n for r, n in result.rejected.items() if r in MEMORY_REASONS}
    lines = [f"considered {result.considered} plans: {result.feasible} fit, "
             f"{sum(never.values())} never valid (layout rules), "
             f"{sum(memory.values())} rejected for memory"]
    lines += [f"  never valid: {reason}: {count}" for reason, count in never.items()]
    lines += [f"  rejected for memory: {reason}: {count}" for reason, count in memory.items()]
    return lines


def ranked_csv(result: SearchResult) -> str:
    return result.table.to_csv(index=False, float_format="%.6g", lineterminator="\n")


def megatron_args(model: ModelSpec, workload: Workload, plan: Plan) -> list[str]:
    """Megatron-LM ``pretrain_gpt.py`` arguments for the model and plan."""
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(model.num_heads),
            "--ffn-hidden-size", str(model.ffn_hidden_size),
            "--seq-length", str(workload.seq_len),
            "--max-position-embeddings", str(max(workload.seq_len, model.seq_len))]
    if model.num_kv_heads != model.num_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
    if model.mlp_kind == "swiglu":
        args.append("--swiglu")
    if model.norm_kind == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if model.position_embedding == "rope":
        args += ["--position-embedding-type", "rope"]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not model.has_bias:
        args.append("--disable-bias-linear")
    args += ["--tensor-model-parallel-size", str(plan.tp),
             "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.vp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage",
                 str(model.num_layers // (plan.pp * plan.vp))]
    if plan.cp > 1:
        args += ["--context-parallel-size", str(plan.cp)]
    if plan.sp:
        args.append("--sequence-parallel")
    args += ["--micro-batch-size", str(plan.mbs),
             "--global-batch-size", str(workload.global_batch_size)]
    if plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", plan.recompute_method,
                 "--recompute-num-layers", str(plan.recompute_num_layers)]
    if plan.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    args.append("--bf16")
    if workload.precision == "fp8":
        args += ["--fp8-format", "hybrid"]
    return args


def megatron_command(result: SearchResult) -> str:
    """A ready shell snippet: torchrun over the nodes with the winner's flags."""
    plan, cluster = result.best, result.cluster
    args = megatron_args(result.model, result.workload, plan)
    pairs, i = [], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            pairs.append(args[i])
            i += 1
    head = [f"# autoconfig: best plan for {result.model.name} on {cluster.nodes} x "
            f"{cluster.gpus_per_node} {cluster.gpu.name} ({describe_plan(plan)})",
            "# add your data, tokenizer, optimizer and checkpoint arguments",
            "export CUDA_DEVICE_MAX_CONNECTIONS=1",
            f"torchrun --nnodes {cluster.nodes} --nproc-per-node {cluster.gpus_per_node} "
            "\\\n    --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:$MASTER_PORT\" \\",
            "  pretrain_gpt.py \\"]
    body = [f"    {p} \\" for p in pairs[:-1]] + [f"    {pairs[-1]}"]
    return "\n".join(head + body) + "\n"


def nemo_overrides(result: SearchResult) -> list[str]:
    """NeMo (megatron_gpt_pretraining.py, Hydra) overrides for the winner."""
    plan, cluster, w = result.best, result.cluster, result.workload
    out = [f"trainer.num_nodes={cluster.nodes}", f"trainer.devices={cluster.gpus_per_node}",
           "trainer.precision=bf16",
           f"model.tensor_model_parallel_size={plan.tp}",
           f"model.pipeline_model_parallel_size={plan.pp}",
           f"model.virtual_pipeline_model_parallel_size="
           f"{plan.vp if plan.vp > 1 else 'null'}",
           f"model.context_parallel_size={plan.cp}",
           f"model.sequence_parallel={str(plan.sp).lower()}",
           f"model.micro_batch_size={plan.mbs}",
           f"model.global_batch_size={w.global_batch_size}",
           f"model.encoder_seq_length={w.seq_len}"]
    if plan.recompute == "none":
        out.append("model.activations_checkpoint_granularity=null")
    elif plan.recompute == "selective":
        out.append("model.activations_checkpoint_granularity=selective")
    else:
        out += ["model.activations_checkpoint_granularity=full",
                f"model.activations_checkpoint_method={plan.recompute_method}",
                f"model.activations_checkpoint_num_layers={plan.recompute_num_layers}"]
    out.append(f"model.optim.name="
               f"{'distributed_fused_adam' if plan.distributed_optimizer else 'fused_adam'}")
    if w.precision == "fp8":
        out += ["model.fp8=true", "model.fp8_hybrid=true"]
    return out


def plan_document(plan: Plan) -> dict:
    """The plan's fields that apply: vp only with an interleaved schedule (> 1),
    recompute method and layers only with full recompute (Megatron-LM ignores
    them otherwise). ``Plan(**doc)`` gives the plan back (omitted = default)."""
    fields = plan.to_dict()
    if plan.vp == 1:
        fields.pop("vp")
    if plan.recompute != "full":
        fields.pop("recompute_method")
        fields.pop("recompute_num_layers")
    return fields


def best_document(result: SearchResult) -> dict:
    """best.yaml: inputs, the winning plan, its predictions and both commands."""
    row = result.table.iloc[0]
    m, c, w = result.model, result.cluster, result.workload
    return {
        "model": {"name": m.name, "params": int(total_params(m)), "num_layers": m.num_layers,
                  "hidden_size": m.hidden_size, "num_heads": m.num_heads,
                  "num_kv_heads": m.num_kv_heads, "ffn_hidden_size": m.ffn_hidden_size,
                  "vocab_size": m.vocab_size, "mlp_kind": m.mlp_kind},
        "cluster": {"gpu": c.gpu.name, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
                    "gpus": c.num_gpus},
        "workload": {"global_batch_size": w.global_batch_size, "seq_len": w.seq_len,
                     "precision": w.precision},
        "objective": result.objective,
        "plan": plan_document(result.best),
        "predicted": {
            "step_time_s": _r(row.step_time_s),
            "tokens_per_s_per_gpu": _r(row.tokens_per_s_per_gpu),
            "tflops_per_gpu": _r(row.tflops_per_gpu), "mfu": _r(row.mfu),
            "memory_gib": _r(row.memory_gib),
            "memory_breakdown_gib": {k[:-4]: _r(row[k]) for k in result.table.columns
                                     if k.endswith("_gib") and k != "memory_gib"},
            "time_breakdown_s": {k: _r(row[k]) for k in (
                "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_bubble_s",
                "pp_p2p_s", "dp_comm_s", "optimizer_s")}},
        "megatron_args": " ".join(megatron_args(m, w, result.best)),
        "nemo_overrides": nemo_overrides(result),
    }


def markdown_report(result: SearchResult, top: int) -> str:
    """The human report: inputs, top plans, rejections, the winner's breakdown."""
    m, c, w = result.model, result.cluster, result.workload
    best = best_document(result)
    lines = [f"# autoconfig search: {m.name} on {c.nodes} x {c.gpus_per_node} {c.gpu.name}", "",
             f"- model: {m.name}, {format_count(total_params(m))} parameters ({m.num_layers} "
             f"layers, hidden {m.hidden_size}, {m.num_heads} heads, {m.num_kv_heads} kv heads, "
             f"ffn {m.ffn_hidden_size}, vocab {m.vocab_size}, {m.mlp_kind})",
             f"- cluster: {c.num_gpus} x {c.gpu.display_name} ({c.nodes} nodes of "
             f"{c.gpus_per_node})",
             f"- workload: global batch {w.global_batch_size} sequences of {w.seq_len} tokens, "
             f"{w.precision}",
             f"- objective: {result.objective}", "",
             f"## Top {min(top, result.feasible)} plans", "",
             tabulate(top_rows(result, top), headers=TOP_HEADERS, tablefmt="github"), "",
             "## Plans considered", ""]
    lines += [f"- {line.strip()}" for line in rejection_lines(result)]
    lines += ["", "## Best plan", "", f"{describe_plan(result.best)}", "",
              "| memory (GiB/GPU) | |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in best["predicted"]["memory_breakdown_gib"].items()]
    lines += [f"| **total** | **{best['predicted']['memory_gib']:.2f}** |", "",
              "| step time (s) | |", "|---|---|"]
    lines += [f"| {k[:-2]} | {v:.4f} |" for k, v in best["predicted"]["time_breakdown_s"].items()]
    lines += [f"| **step** | **{best['predicted']['step_time_s']:.4f}** |", "",
              "## Run it", "", "Megatron-LM (`" + MEGATRON_NAME + "`):", "", "```bash",
              megatron_command(result).rstrip(), "```", "", "NeMo overrides:", "", "```",
              " ".join(nemo_overrides(result)), "```", ""]
    return "\n".join(lines)


def write_report(result: SearchResult, out_dir: Path, top: int = 10,
                 plots: bool = False) -> dict[str, Path]:
    """Write every report file (and, with ``plots``, the PNG plots linked from
    the markdown); returns name -> path."""
    out_dir = Path(out_dir)
    drawn = []
    if plots:
        from autoconfig.reports.plots import safe_plots, search_plots
        drawn = safe_plots(search_plots, result.table, out_dir,
                           f"{result.model.name} on {result.cluster.num_gpus} x "
                           f"{result.cluster.gpu.name}", top)
    links = "".join(f"![{p.stem}]({p.name})\n" for p in drawn)
    files = {
        "csv": (CSV_NAME, ranked_csv(result)),
        "markdown": (MARKDOWN_NAME, markdown_report(result, top) + links),
        "best": (BEST_NAME, yaml.safe_dump(best_document(result), sort_keys=False)),
        "megatron": (MEGATRON_NAME, megatron_command(result)),
        "nemo": (NEMO_NAME, "\n".join(nemo_overrides(result)) + "\n"),
    }
    written = {key: write_atomic(out_dir / name, text) for key, (name, text) in files.items()}
    return {**written, **{p.stem: p for p in drawn}}


def _r(value) -> float:
    """Round for YAML: 4 significant digits keep golden files stable."""
    return float(f"{float(value):.4g}")
