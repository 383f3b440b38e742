"""``autoconfig base``: a base training config from a model size or a budget."""

import json
from pathlib import Path

import click
from tabulate import tabulate

from autoconfig.base import config as b
from autoconfig.bounds import COUNT, check_optional
from autoconfig.core.catalog import get_gpu
from autoconfig.errors import InputError
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.units import format_count, parse_count


def build_request(model: str, size: str | None, gpu: str | None, nodes: int | None,
                  gpus: int | None, gpus_per_node: int | None, days: float | None,
                  tokens: str | None, mfu: float | None, tflops_per_gpu: float | None,
                  full_recompute: bool, seq_len: int | None,
                  precision: str | None) -> b.BaseRequest:
    """Flags to a BaseRequest: resolve the GPU, node count and tokens."""
    if size is not None:
        parse_count(size, what="size")  # '17x' fails here, before anything else
    gpu_spec = get_gpu(gpu) if gpu is not None else None
    # the request's own check (config._validate), needed here before --gpus is split
    check_optional("--gpus-per-node", gpus_per_node, COUNT)
    if gpu_spec is not None and gpus_per_node is None:
        gpus_per_node = gpu_spec.gpus_per_node
    if gpus is not None:
        if nodes is not None:
            raise InputError("give either --nodes or --gpus, not both")
        if gpu_spec is None:
            raise InputError("--gpus needs --gpu")
        cluster = cluster_from_gpus(gpu_spec, gpus, gpus_per_node)
        nodes, gpus_per_node = cluster.nodes, cluster.gpus_per_node
    return b.BaseRequest(model=model, size=size, gpu=gpu_spec, nodes=nodes,
                         gpus_per_node=gpus_per_node, days=days, tokens=b.parse_tokens(tokens),
                         mfu=mfu, tflops_per_gpu=tflops_per_gpu, full_recompute=full_recompute,
                         seq_len=seq_len, precision=precision)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _shape(m) -> str:
    """Depth and widths; an encoder-decoder's two stacks and its head width."""
    if m.is_encoder_decoder:
        return (f"{m.encoder_layers} encoder + {m.decoder_layers} decoder layers, hidden "
                f"{m.hidden_size}, {m.num_heads} heads x {m.head_dim}, ffn {m.ffn_hidden_size}, "
                f"vocab {m.vocab_size}")
    return (f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads "
            f"({m.num_kv_heads} kv), ffn {m.ffn_hidden_size}, vocab {m.vocab_size}")


def _length_rows(cfg: b.BaseConfig) -> list[tuple[str, str, str]]:
    """Sequence length and batch; an encoder-decoder's in samples and encoder
    tokens (the tokens counted), with its decoder length."""
    m = cfg.model
    if not m.is_encoder_decoder:
        return [("seq_len", str(cfg.seq_len), cfg.why("seq_len")),
                ("global_batch_size", f"{cfg.global_batch_size} seq "
                                      f"({format_count(cfg.batch_tokens)} tokens)",
                 cfg.why("global_batch_size"))]
    return [("seq_len", f"{cfg.seq_len} (encoder)", cfg.why("seq_len")),
            ("decoder_seq_len", str(m.decoder_seq_len), cfg.why("decoder_seq_len")),
            ("global_batch_size", f"{cfg.global_batch_size} samples "
                                  f"({format_count(cfg.batch_tokens)} encoder tokens)",
             cfg.why("global_batch_size"))]


def table_rows(cfg: b.BaseConfig) -> list[tuple[str, str, str]]:
    """(setting, value, why) for the readable table."""
    m = cfg.model
    tokens = format_count(cfg.tokens) + (" encoder tokens" if m.is_encoder_decoder else "")
    rows = [("model", m.name, cfg.why("model")),
            ("shape", _shape(m), f"{m.mlp_kind}, {m.norm_kind}, {m.position_embedding} positions"),
            ("params", f"{format_count(cfg.params)} ({cfg.params:,})", cfg.why("params")),
            ("tokens", tokens, cfg.why("tokens")),
            ("compute", f"{cfg.total_flops:.3e} FLOPs ({cfg.flops_formula})",
             cfg.why("flops_formula"))]
    if cfg.gpu_name is not None:
        rows.append(("cluster", f"{cfg.nodes} x {cfg.gpus_per_node} {cfg.gpu_name}", "given"))
        rows.append((cfg.utilisation_kind, f"{cfg.utilisation:.3f}", cfg.why("utilisation")))
        if cfg.budget_days is not None:
            rows.append(("budget days", _fmt(cfg.budget_days), cfg.why("budget_days")))
        rows.append(("training days", f"{cfg.days:.2f}", cfg.why("days")))
    rows += _length_rows(cfg)
    for key in ("train_steps", "lr", "min_lr", "lr_decay_style", "lr_warmup_steps",
                "lr_decay_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps",
                "clip_grad", "init_method_std", "hidden_dropout", "attention_dropout", "precision"):
        rows.append((key, _fmt(getattr(cfg, key)), cfg.why(key)))
    return rows


def render(cfg: b.BaseConfig, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(b.base_to_dict(cfg), indent=2)
    if fmt == "yaml":
        return b.base_yaml_text(cfg).rstrip("\n")
    rows = [(key, value, one_line(why)) for key, value, why in table_rows(cfg)]
    return tabulate(rows, headers=("setting", "value", "why (full sources in --format yaml/json)"),
                    maxcolwidths=[None, 44, None])


def one_line(text: str, width: int = 100) -> str:
    """The table's rationale: one line; the YAML/JSON keep the whole source."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


@click.command()
@click.option("--model", default="gpt3", show_default=True,
              help="Model family (gpt3, llama2, llama3, t5, mt5...), catalog name or model "
                   "YAML path.")
@click.option("--size", help="Model size, e.g. 175b (size mode). Omit to solve for the size.")
@click.option("--gpu", help="GPU type (a100-80gb, h100, h200, b200, gb200) or GPU YAML path.")
@click.option("--nodes", type=int, help="Number of nodes.")
@click.option("--gpus", type=int,
              help="Number of GPUs (a whole number of nodes), instead of --nodes.")
@click.option("--gpus-per-node", type=int, help="GPUs per node [default: the GPU's usual node].")
@click.option("--days", type=float, help="Training days of the budget (budget mode).")
@click.option("--tokens", help="Training tokens, e.g. 300b, or 'chinchilla' (~20 per parameter).")
@click.option("--mfu", type=float,
              help="Model FLOPs utilisation, e.g. 0.4 [default: heuristics/efficiency.yaml].")
@click.option("--tflops-per-gpu", type=float, help="Achieved TFLOP/s per GPU instead of --mfu.")
@click.option("--full-recompute", is_flag=True,
              help="Count 8NT (full activation recompute) against hardware FLOPs utilisation.")
@click.option("--seq-len", type=int, help="Sequence length [default: the model family's].")
@click.option("--precision", type=click.Choice(["bf16", "fp8"]),
              help="Training precision [default: bf16].")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "yaml"]), default="table",
              show_default=True)
@click.option("--stack", default=None,
              help="Software stack the run will use (heuristics/stacks/), kept in base.yaml "
                   "for `search --base`.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the config as YAML (input of 'autoconfig search --base').")
def base(model, size, gpu, nodes, gpus, gpus_per_node, days, tokens, mfu, tflops_per_gpu,
         full_recompute, seq_len, precision, stack, fmt, output) -> None:
    """Base config: model size and shape, tokens, days, LR, batch and the other
    pre-training hyper-parameters, each with its source.

    Size mode: --model gpt3 --size 175b [--gpu --nodes] [--tokens].
    Budget mode: --gpu --nodes|--gpus --days --tokens N|chinchilla gives the
    largest model that trains in time (C = 6NT at MFU, or 8NT at HFU with
    --full-recompute; T5/mT5: C = F T, F their own FLOPs per encoder token).
    """
    request = build_request(model, size, gpu, nodes, gpus, gpus_per_node, days, tokens, mfu,
                            tflops_per_gpu, full_recompute, seq_len, precision)
    cfg = b.make_base(request)
    if stack is not None:
        from dataclasses import replace

        from autoconfig.training.stack import load_stack
        cfg = replace(cfg, stack=load_stack(stack).name)
    if output is not None:
        b.write_base_yaml(cfg, output)
    click.echo(render(cfg, fmt))
    if output is not None and fmt == "table":
        click.echo(f"\nwrote {output}")
