"""``autoconfig capacity``: a capacity-planning report over GPU types and
cluster sizes (CSV and markdown), one search per cell."""

import sys
from pathlib import Path

import click

from autoconfig.atomic import write_atomic
from autoconfig.base.hyperparams import default_global_batch_size
from autoconfig.cli.options import (BATCH, OUTPUT_DIR, SEQ_LEN, ListOrAuto,
                                    model_options, moe_shape_options, pop_layers,
                                    pop_software, positive_int, stack_options)
from autoconfig.core import catalog
from autoconfig.core.catalog import resolve_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import PRECISIONS, Workload
from autoconfig.errors import MAX_COUNT, InputError
from autoconfig.reports.capacity_report import CSV_NAME, MARKDOWN_NAME, capacity_table, markdown
from autoconfig.units import format_count

DEFAULT_GPUS = "a100-80gb,h100-80gb,h200,b200"
_NodeList = ListOrAuto("N[,N...]", positive_int, f"positive node counts up to {MAX_COUNT}",
                       allow_auto=False)
_GpuList = ListOrAuto("N[,N...]", positive_int, f"positive GPU counts up to {MAX_COUNT}",
                      allow_auto=False)

EXIT_NOTHING_FEASIBLE = 1
"""Exit status when no cell of the grid trains the model (the report is written)."""


@click.command()
@model_options
@moe_shape_options
@click.option("--gpu", "gpu_types", default=DEFAULT_GPUS, show_default=True,
              help="GPU types to compare, comma-separated (catalog names or aliases).")
@click.option("--nodes", "node_counts", type=_NodeList, default=None,
              help="Cluster sizes in nodes, comma-separated, e.g. 16,32,64.")
@click.option("--gpus", "gpu_counts", type=_GpuList, default=None,
              help="Cluster sizes in GPUs instead of --nodes, e.g. 128,512 (whole nodes).")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: each GPU's usual node).")
@click.option("--tokens", default="chinchilla", show_default=True,
              help="Training tokens (e.g. 300b, 15t) or 'chinchilla' (~20 per parameter).")
@click.option("--gbs", type=BATCH,
              help="Global batch size in sequences (default: base heuristic).")
@click.option("--seq-len", type=SEQ_LEN, help="Sequence length (default: the model's).")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@stack_options
@click.option("--price",
              help="USD per GPU-hour by GPU type, e.g. h100=2.5,a100=1.5 (no built-in prices; "
                   "cells without one get no cost).")
@click.option("--gpu-power-fraction", type=float,
              help="Average GPU board power as a fraction of TDP (default 1.0: TDP, as Meta's "
                   "model cards count; heuristics/energy.yaml).")
@click.option("--node-overhead-w", type=float,
              help="Non-GPU watts per node (default: system datasheet max power - GPUs x TDP).")
@click.option("--pue", type=float, help="Facility power usage effectiveness (default 1.58, "
              "Uptime Institute 2023 average).")
@click.option("--grid-kg-per-kwh", type=float,
              help="Grid carbon intensity in kg CO2 per kWh (no default: no CO2 without it).")
@click.option("--no-plots", is_flag=True, help="Do not write PNG plots (matplotlib not loaded).")
@click.option("-o", "--output-dir", type=OUTPUT_DIR,
              help="Report folder (default ./autoconfig-out/capacity-<model>).")
def capacity(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu, gpu_types,
             node_counts, gpu_counts, gpus_per_node, tokens, gbs, seq_len, precision, output_dir,
             price, gpu_power_fraction, node_overhead_w, pue, grid_kg_per_kwh, no_plots,
             **stack_opts) -> None:
    """Capacity planning: the best predicted plan, tokens/s, days, GPU-hours, cost,
    energy and CO2 to train the token budget, for every GPU type and cluster size
    given; marks the fastest and the cheapest cell. Writes capacity.csv,
    capacity.md and PNG plots."""
    from autoconfig.training.cost import default_assumptions, parse_prices, price_cells
    from autoconfig.base.config import CHINCHILLA, parse_tokens
    from autoconfig.training.capacity import capacity_grid
    from autoconfig.heuristics import heuristic
    from autoconfig.core.model import total_params
    from autoconfig.reports.plots import capacity_plots, safe_plots

    stack, software = pop_software(stack_opts)
    layer_fields = pop_layers(stack_opts)
    calibration = stack_opts.pop("calibration")
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         seq_len)
    if spec is None:
        raise InputError("no model: give --model (and --size) or an inline shape "
                         "(--layers --hidden --heads --vocab)")
    spec = catalog.with_layers(spec, **layer_fields)
    names = [name.strip() for name in gpu_types.split(",")]
    if not all(names):
        raise InputError(f"invalid --gpu {gpu_types!r}: expected GPU types separated by "
                         "commas, e.g. a100-80gb,h100 (see `autoconfig catalog`)")
    gpu_specs = [catalog.get_gpu(name) for name in names]
    _once("--gpu", gpu_types, [g.name for g in gpu_specs])
    for flag, counts in (("--nodes", node_counts), ("--gpus", gpu_counts)):
        _once(flag, ",".join(map(str, counts or ())), list(counts or ()))
    node_counts = _node_counts(node_counts, gpu_counts, gpu_specs, gpus_per_node)
    for gpu_spec in gpu_specs:  # a cluster beyond the bound is an error, not an infeasible cell
        for nodes in node_counts:
            Cluster(gpu=gpu_spec, nodes=nodes,
                    gpus_per_node=gpus_per_node or gpu_spec.gpus_per_node)
    prices = parse_prices(price, catalog.get_gpu)
    unasked = sorted(set(prices) - {g.name for g in gpu_specs})
    if unasked:
        raise InputError(f"invalid --price: {', '.join(unasked)} is not among --gpu "
                         f"({', '.join(g.name for g in gpu_specs)})")
    assumed = default_assumptions(gpu_power_fraction=gpu_power_fraction,
                                  node_overhead_w=node_overhead_w, pue=pue,
                                  grid_kg_per_kwh=grid_kg_per_kwh)
    budget = parse_tokens(tokens)
    params = total_params(spec)
    if budget == CHINCHILLA:
        budget = float(heuristic("scaling", "chinchilla_tokens_per_param").value) * params
    seq = seq_len or spec.seq_len
    workload = Workload(global_batch_size=gbs or default_global_batch_size(spec, seq),
                        seq_len=seq, precision=precision)
    calibrated = _calibrated(calibration, gpu_specs)
    cells = capacity_grid(spec, workload, gpu_specs, node_counts, budget, gpus_per_node,
                          software=software, stack=stack.name,
                          constants={name: c for name, (c, _) in calibrated.items()})
    costs = price_cells(cells, {g.name: g for g in gpu_specs}, assumed, prices)
    df = capacity_table(cells, costs, tokens=budget, tdp_w={g.name: g.tdp_w for g in gpu_specs})
    out = Path(output_dir) if output_dir else Path("autoconfig-out") / f"capacity-{spec.name}"
    title = f"Capacity plan: {spec.name} ({format_count(params)} params), {format_count(budget)} tokens"
    notes = [f"global batch {workload.global_batch_size} sequences of {seq} tokens, {precision}, "
             f"stack {stack.name}", *(note for _, note in calibrated.values()),
             "days = tokens / (predicted tokens/s of the best plan); predictions, not measurements: "
             "prove the chosen cell with `autoconfig search ... --profile`",
             f"cost = GPU-hours x price ({_prices_note(prices)}); energy = (GPUs x TDP x "
             f"{assumed.gpu_power_fraction:g} + nodes x node overhead) x hours x PUE "
             f"{assumed.pue:g}; CO2 = energy x "
             + (f"{assumed.grid_kg_per_kwh:g} kg/kWh" if assumed.grid_kg_per_kwh is not None
                else "grid intensity (not given: --grid-kg-per-kwh)")
             + "; sources: heuristics/energy.yaml, configs/gpus/*.yaml tdp_w"]
    csv_path = write_atomic(out / CSV_NAME, df.to_csv(index=False))
    plots = [] if no_plots else safe_plots(capacity_plots, df, out, title)
    text = markdown(cells, title, notes, costs, plots)
    md_path = write_atomic(out / MARKDOWN_NAME, text)
    click.echo(text)
    click.echo("wrote:\n" + "\n".join(f"  {p}" for p in [csv_path, md_path, *plots]))
    if not any(c.status == "ok" for c in cells):
        # A report that trains nothing is written, but a nightly job must see it fail.
        click.echo("error: no cell of the grid can train the model (reasons in "
                   f"{md_path.name}): give more nodes, another GPU, or a smaller model",
                   err=True)
        sys.exit(EXIT_NOTHING_FEASIBLE)


def _prices_note(prices: dict[str, float]) -> str:
    if not prices:
        return "no --price given"
    return ", ".join(f"{gpu} ${usd:g}/GPU-hour" for gpu, usd in prices.items())


def _once(flag: str, given: str, items: list) -> None:
    """InputError when a list option names one item twice (an alias and its name
    alike): each would be a row of its own."""
    twice = sorted({str(item) for item in items if items.count(item) > 1})
    if twice:
        raise InputError(f"invalid {flag} {given!r}: {', '.join(twice)} given twice")


def _node_counts(node_counts, gpu_counts, gpu_specs, gpus_per_node):
    """The node counts from --nodes, or from --gpus over the GPUs per node."""
    if (node_counts is None) == (gpu_counts is None):
        raise InputError("give the cluster sizes as --nodes N[,N...] or --gpus N[,N...] "
                         "(one of them)")
    if node_counts is not None:
        return node_counts
    per_node = {gpus_per_node or g.gpus_per_node for g in gpu_specs}
    if len(per_node) > 1:
        raise InputError("--gpus needs one node size for every --gpu type: give "
                         "--gpus-per-node, or --nodes instead")
    (size,) = per_node
    bad = [n for n in gpu_counts if n % size]
    if bad:
        raise InputError(f"invalid --gpus {bad[0]}: must be a whole number of {size}-GPU nodes")
    return tuple(n // size for n in gpu_counts)



def _calibrated(path, gpu_specs) -> dict:
    """GPU name -> (constants, note) of --calibration: it applies to the GPU it was
    fitted on (InputError when that GPU is not in the plan); the others run on the
    shipped constants."""
    if path is None:
        return {}
    from autoconfig.profiling.calibrate import constants_for, read_calibration
    gpu = read_calibration(path).gpu
    if gpu not in {g.name for g in gpu_specs}:
        raise InputError(f"calibration {path} was fitted on {gpu}, which is not among --gpu "
                         f"{', '.join(g.name for g in gpu_specs)}")
    constants, note = constants_for(path, gpu)
    return {gpu: (constants, note + " (other GPUs: shipped constants)")}
