"""``autoconfig capacity``: a capacity-planning report over GPU types and
cluster sizes (CSV and markdown), one search per cell."""

from pathlib import Path

import click
import pandas as pd
from tabulate import tabulate

from autoconfig.core import catalog
from autoconfig.atomic import write_atomic
from autoconfig.cli.search_cmd import (ListOrAuto, positive_int, default_global_batch_size,
                                       model_options, resolve_model)
from autoconfig.errors import InputError
from autoconfig.core.plan import PRECISIONS, Workload, plan_label
from autoconfig.units import format_count

DEFAULT_GPUS = "a100-80gb,h100-80gb,h200,b200"
_NodeList = ListOrAuto("N[,N...]", positive_int, "positive node counts", allow_auto=False)
_COLUMNS = ("gpu", "nodes", "gpus", "status", "tp", "pp", "vp", "cp", "dp", "sp", "mbs",
            "recompute", "distributed_optimizer", "step_time_s", "tokens_per_s_per_gpu",
            "tokens_per_s", "mfu", "memory_gib", "train_days", "gpu_hours", "reason")


def capacity_table(cells) -> pd.DataFrame:
    return pd.DataFrame([c.to_row() for c in cells], columns=list(_COLUMNS))


def _shown(cells) -> list[list]:
    rows = []
    for c in cells:
        if c.status != "ok":
            rows.append([c.gpu, c.nodes, c.gpus, c.status, "", "", "", "", "", "",
                         c.reason.split(":")[0][:60]])
            continue
        rows.append([c.gpu, c.nodes, c.gpus, "ok", plan_label(c.plan), f"{c.step_time_s:.4g}",
                     f"{c.tokens_per_s:,.0f}", f"{100 * c.mfu:.1f}", f"{c.memory_gib:.1f}",
                     f"{c.train_days:,.1f}", f"{c.gpu_hours:,.0f}"])
    return rows


_HEADERS = ("gpu", "nodes", "GPUs", "status", "best plan", "step s", "tokens/s", "MFU %",
            "GiB/GPU", "days", "GPU-hours")


def markdown(cells, title: str, notes: list[str]) -> str:
    body = tabulate(_shown(cells), headers=_HEADERS, tablefmt="github")
    return "\n".join([f"# {title}", "", *[f"- {n}" for n in notes], "", body, ""])


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
@click.option("-o", "--output-dir", type=click.Path(file_okay=False),
              help="Report folder (default ./autoconfig-out/capacity-<model>).")
def capacity(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu, gpus,
             node_counts, gpus_per_node, tokens, gbs, seq_len, precision, output_dir) -> None:
    """Capacity planning: the best predicted plan, tokens/s, days and GPU-hours to
    train the token budget, for every GPU type and cluster size given. Writes
    capacity.csv and capacity.md."""
    from autoconfig.base.config import CHINCHILLA, parse_tokens
    from autoconfig.training.capacity import capacity_grid
    from autoconfig.heuristics import heuristic
    from autoconfig.core.model import total_params

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
    cells = capacity_grid(spec, workload, gpu_specs, node_counts, budget, gpus_per_node)
    df = capacity_table(cells)
    out = Path(output_dir) if output_dir else Path("autoconfig-out") / f"capacity-{spec.name}"
    title = f"Capacity plan: {spec.name} ({format_count(params)} params), {format_count(budget)} tokens"
    notes = [f"global batch {workload.global_batch_size} sequences of {seq} tokens, {precision}",
             "days = tokens / (predicted tokens/s of the best plan); predictions, not measurements: "
             "prove the chosen cell with `autoconfig search ... --profile`"]
    text = markdown(cells, title, notes)
    write_atomic(out / "capacity.csv", df.to_csv(index=False))
    write_atomic(out / "capacity.md", text)
    click.echo(text)
    click.echo(f"wrote:\n  {out / 'capacity.csv'}\n  {out / 'capacity.md'}")
