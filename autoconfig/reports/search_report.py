"""Writers for a search: ranked CSV, markdown report, best.yaml/best.json, and
the winner's launch files (autoconfig/launch/: megatron_args.sh, launch.sbatch,
bridge_recipe.py, launch_bridge.sbatch, nemo_overrides.txt), all rendered from
one LaunchSpec.

Every file is written atomically (a temporary file in the same folder, then
``os.replace``), so an interrupted run never leaves half a report. Nothing
here carries a timestamp: the same search gives the same bytes.
"""

import json
from pathlib import Path

import yaml
from tabulate import tabulate

from autoconfig.training.fp8 import precision_label, workload_recipe
from autoconfig.atomic import write_atomic
from autoconfig.core.model import active_params, total_params
from autoconfig.core.plan import Plan, describe_plan, recompute_label
from autoconfig.launch.files import (BRIDGE_NAME, MEGATRON_NAME, NEMO_NAME, SBATCH_NAME,
                                     launch_document, launch_texts, not_written)
from autoconfig.launch import megatron_lm, nemo1
from autoconfig.launch.spec import LaunchSpec, spec_from_result
from autoconfig.training.search import SearchResult
from autoconfig.training.space import R_MEMORY
from autoconfig.units import format_count

CSV_NAME = "plans.csv"
MARKDOWN_NAME = "report.md"
BEST_NAME = "best.yaml"
BEST_JSON_NAME = "best.json"

TOP_HEADERS = ("#", "TP", "PP", "VP", "CP", "DP", "SP", "MBS", "recompute", "dist-opt",
               "step s", "tok/s/GPU", "TFLOP/s/GPU", "MFU %", "mem GiB/GPU")


def _shows_split(result: SearchResult, n: int) -> bool:
    """Whether one of the top ``n`` plans splits its pipeline unevenly (else
    the column would be empty, and without it two such plans look alike)."""
    top = result.table.head(n)
    return bool(((top["first_stage_layers"] > 0) | (top["last_stage_layers"] > 0)).any())


def top_headers(result: SearchResult, n: int) -> tuple[str, ...]:
    """TOP_HEADERS, with EP and ETP after CP for an MoE model and the pipeline
    split (layers of the first/last stage) after PP where a top plan sets one."""
    headers = TOP_HEADERS[:3] + (("split",) if _shows_split(result, n) else ()) \
        + TOP_HEADERS[3:]
    if not result.model.is_moe:
        return headers
    at = headers.index("CP") + 1
    return headers[:at] + ("EP", "ETP") + headers[at:]


def top_rows(result: SearchResult, n: int) -> list[tuple]:
    """The rows of the top-plans table (as printed and in the markdown)."""
    rows = []
    moe = result.model.is_moe
    split = _shows_split(result, n)
    for row in result.table.head(n).itertuples(index=False):
        recompute = recompute_label(row.recompute, row.recompute_method,
                                    row.recompute_num_layers,
                                    row.recompute_modules if moe else "")
        experts = (row.ep, row.etp) if moe else ()
        uneven = (f"{row.first_stage_layers or '-'}/{row.last_stage_layers or '-'}"
                  if row.first_stage_layers or row.last_stage_layers else "")
        rows.append((row.rank, row.tp, row.pp, *((uneven,) if split else ()), row.vp, row.cp,
                     *experts, row.dp, "on" if row.sp else "off", row.mbs, recompute,
                     "on" if row.distributed_optimizer else "off",
                     f"{row.step_time_s:.4g}", f"{row.tokens_per_s_per_gpu:.0f}",
                     f"{row.tflops_per_gpu:.1f}", f"{100 * row.mfu:.1f}",
                     f"{row.memory_gib:.1f}"))
    return rows


DOMINATED_REASON = ("the same layout with another recompute setting is as fast in no more "
                    "memory")
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
             f"{sum(memory.values())} rejected for memory"
             + (f", {result.dominated} dominated" if result.dominated else "")]
    lines += [f"  never valid: {reason}: {count}" for reason, count in never.items()]
    lines += [f"  rejected for memory: {reason}: {count}" for reason, count in memory.items()]
    if result.dominated:
        lines.append(f"  dominated: {DOMINATED_REASON}: {result.dominated}")
    return lines + csv_note(result)


CSV_MAX_ROWS = 10_000
"""plans.csv holds the best this many plans: formatting a CSV costs about 15 us a
row on a 2-core machine, so an MoE grid's 200,000 fitting plans would take longer
than the search itself (the counts of all of them stay in the report)."""


def ranked_csv(result: SearchResult) -> str:
    return result.table.head(CSV_MAX_ROWS).to_csv(index=False, float_format="%.6g",
                                                  lineterminator="\n")


def csv_note(result: SearchResult) -> list[str]:
    """The line saying plans.csv holds only the best plans, when it does."""
    if result.feasible <= CSV_MAX_ROWS:
        return []
    return [f"plans.csv: the best {CSV_MAX_ROWS:,} of the {result.feasible:,} plans that fit"]


def plan_document(plan: Plan) -> dict:
    """The plan's fields that apply: vp only with an interleaved schedule (> 1),
    recompute method and layers only with full recompute (Megatron-LM ignores
    them otherwise), stage layers only for an uneven split, recompute modules
    only when not the default, ep and etp only above 1. ``Plan(**doc)``
    gives the plan back (omitted = default)."""
    fields = plan.to_dict()
    if plan.vp == 1:
        fields.pop("vp")
    if plan.recompute != "full":
        fields.pop("recompute_method")
        fields.pop("recompute_num_layers")
    for name in ("first_stage_layers", "last_stage_layers", "recompute_modules"):
        if not fields[name]:
            fields.pop(name)
    for name in ("ep", "etp"):
        if fields[name] == 1:
            fields.pop(name)
    return fields


def best_document(result: SearchResult, spec: LaunchSpec | None = None, index: int = 0,
                  measured: dict | None = None) -> dict:
    """best.yaml / best.json: inputs, the winning plan, its predictions, and the
    launch (hyper-parameters with their origin, schedule, every target's arguments).
    ``index`` is the winner's row in the search (0: the predicted best); ``measured``
    (what profiling measured for it) makes it the measured winner."""
    spec = spec or spec_from_result(result)
    row = result.table.iloc[index]
    m, c, w = result.model, result.cluster, result.workload
    return {
        "model": {"name": m.name, "params": int(total_params(m)), "num_layers": m.num_layers,
                  "hidden_size": m.hidden_size, "num_heads": m.num_heads,
                  "num_kv_heads": m.num_kv_heads, "ffn_hidden_size": m.ffn_hidden_size,
                  "vocab_size": m.vocab_size, "mlp_kind": m.mlp_kind},
        "cluster": {"gpu": c.gpu.name, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node,
                    "gpus": c.num_gpus},
        "workload": {"global_batch_size": w.global_batch_size, "seq_len": w.seq_len,
                     "precision": w.precision,
                     **({"fp8_recipe": recipe} if (recipe := workload_recipe(
                         w, result.software, c.gpu)) else {})},
        "objective": result.objective,
        "chosen_by": "measurement" if measured else "prediction",
        "plan": plan_document(result.plans.plan(index)),
        **({"measured": measured} if measured else {}),
        "predicted_rank": index + 1,
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
        "launch": launch_document(spec),
    }


def search_json(result: SearchResult, top: int, files: dict[str, Path],
                spec: LaunchSpec | None = None) -> dict:
    """What ``autoconfig search --format json`` prints: the top plans, the counts by
    rejection reason, best.json's document and the files written."""
    rows = result.table.head(top)
    return {"considered": result.considered, "feasible": result.feasible,
            "rejected": dict(result.rejected), "dominated": result.dominated,
            "top": json.loads(rows.to_json(orient="records", double_precision=6)),
            "best": best_document(result, spec),
            "files": {key: str(path) for key, path in files.items()}}


def _layers_text(m, w) -> str:
    """The stack's layers; an encoder-decoder's split and sequence lengths."""
    if not m.is_encoder_decoder:
        return f"{m.num_layers} layers"
    return (f"encoder {m.encoder_layers} layers over {w.seq_len} tokens and decoder "
            f"{m.decoder_layers} layers over {m.decoder_seq_len} tokens with cross-attention, "
            "both on one pipeline stage (megatron-core trains T5 without pipeline "
            "parallelism); tokens count encoder tokens")


def markdown_report(result: SearchResult, top: int, spec: LaunchSpec | None = None) -> str:
    """The human report: inputs, top plans, rejections, the winner's breakdown."""
    m, c, w = result.model, result.cluster, result.workload
    spec = spec or spec_from_result(result)
    best = best_document(result, spec)
    lines = [f"# autoconfig search: {m.name} on {c.nodes} x {c.gpus_per_node} {c.gpu.name}", "",
             f"- model: {m.name}, {format_count(total_params(m))} parameters"
             + (f", {format_count(active_params(m))} active ({m.num_experts} experts, top "
                f"{m.moe_topk})" if m.is_moe else "") + f" ({_layers_text(m, w)}, hidden {m.hidden_size}, {m.num_heads} heads, {m.num_kv_heads} kv heads, "
             f"ffn {m.ffn_hidden_size}, vocab {m.vocab_size}, {m.mlp_kind})",
             f"- cluster: {c.num_gpus} x {c.gpu.display_name} ({c.nodes} nodes of "
             f"{c.gpus_per_node})",
             f"- workload: global batch {w.global_batch_size} sequences of {w.seq_len} tokens, "
             f"{precision_label(w, result.software, c.gpu)}",
             f"- objective: {result.objective}", "",
             f"## Top {min(top, result.feasible)} plans", "",
             tabulate(top_rows(result, top), headers=top_headers(result, top),
                      tablefmt="github"), "",
             "## Plans considered", ""]
    lines += [f"- {line.strip()}" for line in rejection_lines(result)]
    lines += ["", "## Best plan", "", f"{describe_plan(result.best)}", "",
              "| memory (GiB/GPU) | |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in best["predicted"]["memory_breakdown_gib"].items()]
    lines += [f"| **total** | **{best['predicted']['memory_gib']:.2f}** |", "",
              "| step time (s) | |", "|---|---|"]
    lines += [f"| {k[:-2]} | {v:.4f} |" for k, v in best["predicted"]["time_breakdown_s"].items()]
    lines += [f"| **step** | **{best['predicted']['step_time_s']:.4f}** |", "",
              "## Run it", ""] + run_it_lines(spec)
    return "\n".join(lines)


def run_it_lines(spec: LaunchSpec) -> list[str]:
    """The three ways to launch the winner (markdown); a target that cannot run the
    model says why instead."""
    if not spec.launchable:
        return [f"Hyper-parameters: {spec.base_source}.", "", spec.not_launchable_reason + ".", ""]
    skip = not_written(spec)
    lines = [f"Hyper-parameters: {spec.base_source}.", ""]
    if "megatron" in skip:
        lines += [f"Megatron-LM: {skip['megatron']}.", ""]
    elif spec.model.is_encoder_decoder:
        # pretrain_t5.py has no synthetic data: a real tokenised dataset and its vocabulary.
        lines += [f"Megatron-LM `{megatron_lm.pretrain_script(spec)}` on SLURM "
                  f"(`{SBATCH_NAME}`; the arguments alone: `{MEGATRON_NAME}`):", "", "```bash",
                  "DATA_PATH=/data/my_t5_text_document VOCAB_FILE=/data/vocab.txt "
                  "TOKENIZER_MODEL=/data/spm.model MEGATRON_LM=/opt/megatron-lm sbatch "
                  + SBATCH_NAME, "```", ""]
    else:
        lines += [f"Megatron-LM on SLURM (`{SBATCH_NAME}`; the arguments alone: "
                  f"`{MEGATRON_NAME}`):", "", "```bash",
                  "DATA_PATH=/data/my_text_document MEGATRON_LM=/opt/megatron-lm sbatch "
                  + SBATCH_NAME, "MOCK_DATA=1 sbatch " + SBATCH_NAME
                  + "   # smoke test on synthetic data", "```", ""]
    if "bridge" in skip:
        lines += [f"Megatron-Bridge / NeMo 2: {skip['bridge']}.", ""]
    else:
        lines += [f"Megatron-Bridge / NeMo 2 (`{BRIDGE_NAME}`, from "
                  f"`{spec.family.bridge_recipe.replace(':', '.')}`):", "", "```bash",
                  f"torchrun --nproc-per-node {spec.cluster.gpus_per_node} {BRIDGE_NAME}   "
                  "# or: sbatch launch_bridge.sbatch", "```", ""]
    if "nemo" in skip:
        lines += [f"NeMo 1: {skip['nemo']}.", ""]
    else:
        script, config = nemo1.entry_point(spec)
        lines += [f"NeMo 1 (`{NEMO_NAME}`, against {config}):", "", "```bash",
                  f"mapfile -t O < <(grep -v '^#' {NEMO_NAME}) && python "
                  f"examples/nlp/language_modeling/{script} \"${{O[@]}}\"",
                  "```", ""]
    return lines


def best_files(result: SearchResult, spec: LaunchSpec | None = None, index: int = 0,
               measured: dict | None = None) -> dict[str, tuple[str, str]]:
    """best.yaml and best.json (key -> (file name, text)) for the plan at ``index``."""
    best = best_document(result, spec, index, measured)
    return {"best": (BEST_NAME, yaml.safe_dump(best, sort_keys=False, width=100)),
            "best_json": (BEST_JSON_NAME, json.dumps(best, indent=1) + "\n")}


def write_report(result: SearchResult, out_dir: Path, top: int = 10, plots: bool = False,
                 spec: LaunchSpec | None = None) -> dict[str, Path]:
    """Write every report and launch file (and, with ``plots``, the PNG plots linked
    from the markdown); returns key -> path. ``spec`` (default: the best plan with
    ``autoconfig base``'s defaults) is what every launch target renders."""
    out_dir = Path(out_dir)
    spec = spec or spec_from_result(result)
    drawn = []
    if plots:
        from autoconfig.reports.plots import safe_plots, search_plots
        drawn = safe_plots(search_plots, result.table, out_dir,
                           f"{result.model.name} on {result.cluster.num_gpus} x "
                           f"{result.cluster.gpu.name}", top)
    links = "".join(f"![{p.stem}]({p.name})\n" for p in drawn)
    files = {
        "csv": (CSV_NAME, ranked_csv(result)),
        "markdown": (MARKDOWN_NAME, markdown_report(result, top, spec) + links),
        **best_files(result, spec),
        **launch_texts(spec),
    }
    written = {key: write_atomic(out_dir / name, text) for key, (name, text) in files.items()}
    return {**written, **{p.stem: p for p in drawn}}


def _r(value) -> float:
    """Round for YAML: 4 significant digits keep golden files stable."""
    return float(f"{float(value):.4g}")
