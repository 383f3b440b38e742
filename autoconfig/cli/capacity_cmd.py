"""``autoconfig capacity``: a capacity-planning report over GPU types and
cluster sizes (CSV and markdown), one search per cell."""

from pathlib import Path

import click

from autoconfig.atomic import write_atomic
from autoconfig.base.hyperparams import default_global_batch_size
from autoconfig.cli.options import (ListOrAuto, model_options, pop_software, positive_int,
                                    stack_options)
from autoconfig.core import catalog
from autoconfig.core.catalog import resolve_model
from autoconfig.core.plan import PRECISIONS, Workload
from autoconfig.errors import InputError
from autoconfig.reports.capacity_report import capacity_table, markdown
from autoconfig.units import format_count

DEFAULT_GPUS = "a100-80gb,h100-80gb,h200,b200"
_NodeList = ListOrAuto("N[,N...]", positive_int, "positive node counts", allow_auto=False)


@click.command()
@model_options
@click.option("--gpu", "gpus", default=DEFAULT_GPUS, show_default=True,
              help="GPU types to compare, comma-separated (catalog names or aliases).")
@click.option("--nodes", "node_counts", type=_NodeList, required=True,
              help="Cluster sizes in nodes, comma-separated, e.g. 16,32,64.")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: each GPU's usual node).")
@click.option("--tokens", default="chinchilla", show_default=True,
              help="Training tokens (e.g. 300b, 15t) or 'chinchilla' (~20 per parameter).")
@click.option("--gbs", type=int, help="Global batch size in sequences (default: base heuristic).")
@click.option("--seq-len", type=int, help="Sequence length (default: the model's).")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@stack_options
@click.option("-o", "--output-dir", type=click.Path(file_okay=False),
              help="Report folder (default ./autoconfig-out/capacity-<model>).")
def capacity(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu, gpus,
             node_counts, gpus_per_node, tokens, gbs, seq_len, precision, output_dir,
             **stack_opts) -> None:
    """Capacity planning: the best predicted plan, tokens/s, days and GPU-hours to
    train the token budget, for every GPU type and cluster size given. Writes
    capacity.csv and capacity.md."""
    from autoconfig.base.config import CHINCHILLA, parse_tokens
    from autoconfig.training.capacity import capacity_grid
    from autoconfig.heuristics import heuristic
    from autoconfig.core.model import total_params

    stack, software = pop_software(stack_opts)
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         seq_len)
    if spec is None:
        raise InputError("no model: give --model (and --size) or an inline shape "
                         "(--layers --hidden --heads --vocab)")
    gpu_specs = [catalog.get_gpu(name) for name in gpus.split(",") if name.strip()]
    budget = parse_tokens(tokens)
    params = total_params(spec)
    if budget == CHINCHILLA:
        budget = float(heuristic("scaling", "chinchilla_tokens_per_param").value) * params
    seq = seq_len or spec.seq_len
    workload = Workload(global_batch_size=gbs or default_global_batch_size(spec, seq),
                        seq_len=seq, precision=precision)
    cells = capacity_grid(spec, workload, gpu_specs, node_counts, budget, gpus_per_node,
                          software=software, stack=stack.name)
    df = capacity_table(cells)
    out = Path(output_dir) if output_dir else Path("autoconfig-out") / f"capacity-{spec.name}"
    title = f"Capacity plan: {spec.name} ({format_count(params)} params), {format_count(budget)} tokens"
    notes = [f"global batch {workload.global_batch_size} sequences of {seq} tokens, {precision}, "
             f"stack {stack.name}",
             "days = tokens / (predicted tokens/s of the best plan); predictions, not measurements: "
             "prove the chosen cell with `autoconfig search ... --profile`"]
    text = markdown(cells, title, notes)
    write_atomic(out / "capacity.csv", df.to_csv(index=False))
    write_atomic(out / "capacity.md", text)
    click.echo(text)
    click.echo(f"wrote:\n  {out / 'capacity.csv'}\n  {out / 'capacity.md'}")
