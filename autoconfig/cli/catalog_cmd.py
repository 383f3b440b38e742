"""``autoconfig catalog gpus|models``: list the built-in catalogs."""

import click
from tabulate import tabulate

from autoconfig.core import catalog as cat
from autoconfig.errors import InputError
from autoconfig.core.model import active_params, total_params
from autoconfig.training.memory import usable_bytes
from autoconfig.units import GIB, format_count

KINDS = ("gpus", "models")


def _experts(m) -> str:
    """'256 top 8 + shared' style, '-' for a dense model."""
    if not m.is_moe:
        return "-"
    shared = " + shared" if m.moe_shared_expert_ffn_hidden_size else ""
    return f"{m.num_experts} top {m.moe_topk}{shared}"


@click.command()
@click.argument("kind", metavar="gpus|models", required=False)
def catalog(kind: str | None) -> None:
    """List the GPUs or models autoconfig knows (configs/)."""
    if kind not in KINDS:
        what = "missing catalog kind" if kind is None else f"invalid catalog kind {kind!r}"
        raise InputError(f"{what}: use `autoconfig catalog {'|'.join(KINDS)}`")
    if kind == "gpus":
        rows = [(g.name, ", ".join(g.aliases), g.peak_bf16_tflops, g.peak_fp8_tflops or "-",
                 f"{g.peak_nvfp4_tflops:g}" if g.peak_nvfp4_tflops else "-", g.hbm_capacity_gb,
                 f"{usable_bytes(g) / GIB:.1f}", g.hbm_bandwidth_gb_per_s,
                 g.nvlink_bandwidth_gb_per_s, g.gpus_per_node, g.internode_bandwidth_gb_per_s)
                for g in cat.all_gpus()]
        # usable: what a process can fill (ECC on GDDR6 and the driver keep the rest)
        headers = ("gpu", "aliases", "bf16 TFLOP/s", "fp8 TFLOP/s", "nvfp4 TFLOP/s", "HBM GB",
                   "usable GiB", "HBM GB/s", "NVLink GB/s", "GPUs/node", "IB GB/s/GPU")
    else:
        rows = [(m.name, m.family, m.size_label, format_count(total_params(m)),
                 format_count(active_params(m)), _experts(m), m.num_layers,
                 m.hidden_size, m.num_heads, m.num_kv_heads, m.ffn_hidden_size, m.vocab_size,
                 m.seq_len, m.mlp_kind, m.attention_kind) for m in cat.all_models()]
        headers = ("model", "family", "size", "params", "active", "experts", "layers", "hidden",
                   "heads", "kv heads", "ffn", "vocab", "seq", "mlp", "attention")
    click.echo(tabulate(rows, headers=headers))
