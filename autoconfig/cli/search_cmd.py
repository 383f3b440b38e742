"""``autoconfig search``: rank every parallel layout of a model on a cluster.

Thin: parse options into SearchInputs, ``run_search`` (one library call),
render and write. ``run_search`` is separate from rendering so profiling of
the top plans can be added after it. The model/cluster options are shared
with ``autoconfig estimate``.
"""

import json
from pathlib import Path

import click
from tabulate import tabulate

from autoconfig.cli.options import (BATCH, OUTPUT_DIR, SEQ_LEN, model_options, moe_shape_options,
                                    narrowing_options, pop_layers, pop_software, stack_options)
from autoconfig.cli.profile_opts import pop_profile_options, profile_options
from autoconfig.core.plan import PRECISIONS
from autoconfig.training.fp8 import precision_label
from autoconfig.training.inputs import DEFAULT_GPU, inputs_from_options
from autoconfig.training.stack import check_profilable


def render_search(result, top: int, files: dict | None = None, spec=None) -> str:
    """The text the command prints: top plans, counts by reason, files."""
    from autoconfig.reports.search_report import rejection_lines, top_headers, top_rows
    from autoconfig.units import format_count
    from autoconfig.core.model import active_params, total_params
    m, c, w = result.model, result.cluster, result.workload
    active = f", {format_count(active_params(m))} active" if m.is_moe else ""
    if m.is_encoder_decoder:
        active = (f"; encoder {m.encoder_layers} layers x {w.seq_len} tokens, decoder "
                  f"{m.decoder_layers} layers x {m.decoder_seq_len} tokens, one pipeline stage")
    lines = [f"{m.name} ({format_count(total_params(m))} params{active}) on {c.nodes} x "
             f"{c.gpus_per_node} {c.gpu.name}, gbs {w.global_batch_size}, seq {w.seq_len}, "
             f"{precision_label(w, result.software, c.gpu)}, stack {result.stack}, "
             f"objective {result.objective}", "",
             tabulate(top_rows(result, top), headers=top_headers(result, top)), ""]
    lines += rejection_lines(result)
    if result.model.unmodelled:
        lines += ["", f"not modelled: {', '.join(result.model.unmodelled)} (priced as a plain "
                  "softmax)"]
    if spec is not None:
        lines += ["", f"launch files: hyper-parameters from {spec.base_source}"
                  if spec.launchable else spec.not_launchable_reason]
        if spec.launchable:
            from autoconfig.launch.files import not_written
            lines += [f"  {reason}" for reason in not_written(spec).values()]
    if files:
        lines += ["", "wrote:"] + [f"  {path}" for path in files.values()]
    return "\n".join(lines)


@click.command()
@click.option("--base", type=click.Path(dir_okay=False),
              help="base.yaml from `autoconfig base` (model, batch, sequence, cluster).")
@model_options
@moe_shape_options
@click.option("--gpu", help=f"GPU type (default {DEFAULT_GPU}).")
@click.option("--nodes", type=int, help="Number of nodes.")
@click.option("--gpus", type=int, help="Total GPUs instead of --nodes (a whole number of nodes).")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: the GPU's usual node).")
@click.option("--gbs", type=BATCH,
              help="Global batch size in sequences (default: base heuristic).")
@click.option("--seq-len", type=SEQ_LEN, help="Sequence length (default: the model's).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="bf16 (default) or fp8 (GPUs with FP8 only).")
@narrowing_options
@click.option("--objective", type=click.Choice(["throughput", "memory"]), default="throughput",
              show_default=True, help="Rank by step time or by memory per GPU.")
@click.option("--top", type=int, default=10, show_default=True, help="Plans to print.")
@stack_options
@profile_options
@click.option("--no-plots", is_flag=True, help="Do not write PNG plots (matplotlib not loaded).")
@click.option("--container-image", help="pyxis/enroot image for launch.sbatch (default: none).")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="text: tables; json: machine-readable (also best.json).")
@click.option("-o", "--output-dir", type=OUTPUT_DIR,
              help="Report folder (default ./autoconfig-out/<model>-<gpu>-<nodes>n).")
def search(**options) -> None:
    """Rank every valid parallel layout (TP/PP/VP/CP/DP/SP, micro-batch,
    recompute, distributed optimizer) by predicted step time; plans that do
    not fit in GPU memory are pruned. Writes plans.csv, report.md, best.yaml,
    best.json and the winner's launch files: launch.sbatch and megatron_args.sh
    (Megatron-LM), bridge_recipe.py and launch_bridge.sbatch (Megatron-Bridge /
    NeMo 2), nemo_overrides.txt (NeMo 1), with the LR, schedule, init and token
    budget of --base (default: `autoconfig base`'s for the model). With --profile,
    runs short real training jobs for the top plans and ranks them by what they
    measured."""
    from autoconfig.profiling.sweep import check_options, ranked_from_search, run_profiling
    from autoconfig.launch.spec import SlurmSettings, spec_from_result
    from autoconfig.reports.search_report import search_json, write_report
    from autoconfig.training.search import search_inputs
    output_format, container_image = options.pop("output_format"), options.pop("container_image")
    plots = not options.pop("no_plots")
    # The launch script takes the same SLURM settings as profiling jobs, whichever
    # executor profiles.
    slurm = SlurmSettings(partition=options.get("partition"), account=options.get("account"),
                          qos=options.get("qos"), time_limit_min=options.get("time_limit"),
                          container_image=container_image)
    profiling = pop_profile_options(options)
    if profiling.profile:
        check_options(profiling)
    stack, software = pop_software(options, _base_stack(options.get("base")))
    if profiling.profile:
        check_profilable(software, stack.name, "use --stack megatron-lm or nemo, or drop --profile")
    calibration = options.pop("calibration")
    inputs = inputs_from_options(stack=stack, software=software, layer_fields=pop_layers(options),
                                 **options)
    if calibration:
        from autoconfig.profiling.calibrate import calibrated
        inputs = calibrated(inputs, calibration)
    result = search_inputs(inputs)
    # the launch files' hyper-parameters and SLURM settings (base.yaml read once)
    launch_kw = dict(base=_base_config(options.get("base")), base_path=options.get("base"),
                     slurm=slurm)
    spec = spec_from_result(result, **launch_kw)
    files = write_report(result, inputs.output_dir, top=inputs.top, plots=plots, spec=spec)
    if output_format == "json":
        data = search_json(result, inputs.top, files, spec)
        if inputs.calibration_note:
            data["calibration"] = inputs.calibration_note
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo(render_search(result, inputs.top, files, spec))
        if inputs.calibration_note:
            click.echo(inputs.calibration_note)
    if profiling.profile:  # a Plan per candidate costs seconds on a 200,000-plan MoE grid
        results_dir = run_profiling(ranked_from_search(result), result.model, result.workload,
                                    result.cluster, profiling, inputs.output_dir,
                                    software=result.software, stack=result.stack, plots=plots)
        if results_dir is not None:
            _launch_measured_winner(result, results_dir, profiling, inputs.output_dir,
                                    launch_kw)


def _launch_measured_winner(result, results_dir, profiling, out_dir, launch_kw) -> None:
    """Rewrite best.yaml/best.json and the launch files for the fastest plan measured
    on GPUs (the CPU proxy ranks plans but does not measure GPUs)."""
    from autoconfig.launch.files import launch_texts
    from autoconfig.launch.spec import launch_spec
    from autoconfig.atomic import write_atomic
    from autoconfig.profiling import store
    from autoconfig.profiling.report import build_table
    from autoconfig.reports.search_report import best_files
    import pandas as pd
    table = build_table(results_dir, profiling.profile_objective)
    ok = table[(table["status"] == "ok") & (table["device"] != "cpu")] if len(table) else table
    if not len(ok):
        return
    top = ok.iloc[0]
    winner = store.plan_from_record(top.to_dict())
    index = int(top["predicted_rank"]) - 1 if pd.notna(top["predicted_rank"]) else -1
    if not 0 <= index < len(result.plans) or result.plans.plan(index) != winner:
        return  # measured outside this search's grid: nothing of ours to describe it
    spec = launch_spec(result.model, result.workload, winner, result.cluster,
                       software=result.software, stack=result.stack, **launch_kw)
    measured = {"step_time_s": float(f"{float(top['step_time_s']):.4g}"),
                "tokens_per_s_per_gpu": float(f"{float(top['tokens_per_s_per_gpu']):.4g}"),
                "device": str(top["device"]), "results": str(results_dir)}
    texts = best_files(result, spec, index, measured)
    if index:
        texts.update(launch_texts(spec))
    written = [write_atomic(Path(out_dir) / name, text) for name, text in texts.values()]
    click.echo(f"measured winner {top['plan']} (predicted rank {index + 1}): "
               + ", ".join(p.name for p in written) + " rewritten")


def _base_config(base: str | None):
    """The BaseConfig of --base (LR, schedule, init, tokens), or None."""
    if not base:
        return None
    from autoconfig.training.inputs import read_base
    return read_base(base)


def _base_stack(base: str | None) -> str | None:
    """The stack a base.yaml names, if any (the command line overrides it)."""
    if not base:
        return None
    from autoconfig.training.inputs import read_base
    return getattr(read_base(base), "stack", None)
