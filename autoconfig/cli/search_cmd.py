"""``autoconfig search``: rank every parallel layout of a model on a cluster.

Thin: parse options into SearchInputs, ``run_search`` (one library call),
render and write. ``run_search`` is separate from rendering so profiling of
the top plans can be added after it. The model/cluster options are shared
with ``autoconfig estimate``.
"""

from dataclasses import dataclass
from pathlib import Path

import click
from tabulate import tabulate

from autoconfig.core import catalog
from autoconfig.cli.profile_opts import pop_profile_options, profile_options
from autoconfig.errors import InputError
from autoconfig.core.hardware import GPU, Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import PRECISIONS, RECOMPUTE_KINDS, Workload
from autoconfig.training.space import SWITCH_MODES, AxisChoices

DEFAULT_GPU = "a100-80gb"
DEFAULT_SEQ_LEN = 2048


class ListOrAuto(click.ParamType):
    """A comma-separated list (``4,8`` -> (4, 8)) or ``auto`` -> None; each item
    goes through ``parse_item``, which returns None for a bad item."""

    def __init__(self, name: str, parse_item, allowed: str, allow_auto: bool = True) -> None:
        self.name = name
        self._parse_item = parse_item
        self._allowed = allowed
        self._allow_auto = allow_auto

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, tuple):
            return value
        text = str(value).strip().lower()
        if self._allow_auto and text == "auto":
            return None
        values = tuple(self._parse_item(v.strip()) for v in text.split(","))
        if any(v is None for v in values):
            flag = param.opts[0] if param is not None and param.opts else "value"
            auto = ", or auto" if self._allow_auto else ""
            raise InputError(f"invalid {flag} {value!r}: expected {self._allowed} separated "
                             f"by commas{auto}")
        return values


def positive_int(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def _recompute_kind(text: str) -> str | None:
    return text if text in RECOMPUTE_KINDS else None


IntListOrAuto = ListOrAuto("N[,N...]|auto", positive_int, "positive integers")
KindListOrAuto = ListOrAuto("KIND[,KIND...]|auto", _recompute_kind,
                            f"recompute kinds ({', '.join(RECOMPUTE_KINDS)})")


def model_options(func):
    """--model/--size, or the shape inline (--layers --hidden --heads ...)."""
    options = [
        click.option("--model", help="Catalog model (gpt3, llama3-8b...) or a model YAML path."),
        click.option("--size", help="Model size within the family, e.g. 175b."),
        click.option("--layers", type=int, help="Inline shape: transformer layers."),
        click.option("--hidden", type=int, help="Inline shape: hidden size."),
        click.option("--heads", type=int, help="Inline shape: attention heads."),
        click.option("--kv-heads", type=int, help="Inline shape: kv heads (GQA; default heads)."),
        click.option("--ffn", type=int, help="Inline shape: MLP hidden size (default 4h, or "
                     "Megatron's 8h/3 rounded to 64 with --swiglu)."),
        click.option("--vocab", type=int, help="Inline shape: vocabulary size."),
        click.option("--swiglu", is_flag=True, help="Inline shape: Llama-style layer (SwiGLU, "
                     "RMSNorm, RoPE, no biases, untied output layer)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def resolve_model(model: str | None, size: str | None, layers: int | None, hidden: int | None,
                  heads: int | None, kv_heads: int | None, ffn: int | None, vocab: int | None,
                  swiglu: bool, seq_len: int | None) -> ModelSpec | None:
    """The catalog model, the inline shape, or None when neither was given."""
    inline = {"--layers": layers, "--hidden": hidden, "--heads": heads, "--vocab": vocab}
    if model is not None:
        if any(v is not None for v in inline.values()) or kv_heads or ffn:
            raise InputError("give either --model or an inline shape (--layers --hidden "
                             "--heads --vocab ...), not both")
        return catalog.get_model(model, size)
    if all(v is None for v in inline.values()):
        return None
    missing = [flag for flag, v in inline.items() if v is None]
    if missing:
        raise InputError(f"inline model shape needs {', '.join(missing)} "
                         "(with --layers --hidden --heads --vocab, optional --kv-heads --ffn)")
    if ffn is None:
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
    data = {"name": f"custom-{layers}l-{hidden}h", "num_layers": layers, "hidden_size": hidden,
            "num_heads": heads, "num_kv_heads": kv_heads or heads, "ffn_hidden_size": ffn,
            "vocab_size": vocab, "seq_len": seq_len or DEFAULT_SEQ_LEN,
            "mlp_kind": "swiglu" if swiglu else "gelu",
            "norm_kind": "rmsnorm" if swiglu else "layernorm",
            "position_embedding": "rope" if swiglu else "learned",
            "tied_embeddings": not swiglu, "has_bias": not swiglu}
    for flag, value in (("--layers", layers), ("--hidden", hidden), ("--heads", heads),
                        ("--kv-heads", kv_heads), ("--ffn", ffn), ("--vocab", vocab)):
        if value is not None and value < 1:
            raise InputError(f"invalid {flag} {value}: must be a positive integer")
    return catalog.model_from_mapping(data, default_name=data["name"], where="inline shape")


def gpus_per_node_for(gpu: GPU, gpus_per_node: int | None) -> int:
    if gpus_per_node is None:
        return gpu.gpus_per_node
    if gpus_per_node < 1:
        raise InputError(f"invalid --gpus-per-node {gpus_per_node}: must be at least 1")
    return gpus_per_node


def default_global_batch_size(model: ModelSpec, seq_len: int) -> int:
    """The batch `autoconfig base` chooses: the model's published batch where its
    catalog file states one, else the GPT-3 paper's batch tokens by model size
    in sequences of seq_len."""
    from autoconfig.base.hyperparams import heuristic_global_batch_size, published_batch
    from autoconfig.core.model import total_params
    published = published_batch(model, seq_len)
    if published is not None:
        return published
    return heuristic_global_batch_size(total_params(model), seq_len)


@dataclass(frozen=True)
class SearchInputs:
    """Everything a search needs, resolved from the options."""

    model: ModelSpec
    workload: Workload
    cluster: Cluster
    choices: AxisChoices
    objective: str
    top: int
    output_dir: Path


def inputs_from_options(*, base: str | None, model: str | None, size: str | None,
                        layers, hidden, heads, kv_heads, ffn, vocab, swiglu: bool,
                        gpu: str | None, nodes: int | None, gpus_per_node: int | None,
                        gbs: int | None, seq_len: int | None, precision: str | None,
                        tp, pp, vp, cp, mbs, recompute, sp: str, distributed_optimizer: str,
                        max_tp_per_node: int | None, objective: str, top: int,
                        output_dir: str | None) -> SearchInputs:
    """Resolve the options (and base.yaml) into SearchInputs."""
    base_cfg = _read_base(base) if base else None
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         seq_len)
    if spec is None:
        if base_cfg is None:
            raise InputError("no model: give --model (and --size), --base base.yaml, or an "
                             "inline shape (--layers --hidden --heads --vocab)")
        spec = base_cfg.model
    gpu_name = gpu or (base_cfg.gpu_name if base_cfg and base_cfg.gpu_name else DEFAULT_GPU)
    gpu_spec = catalog.get_gpu(gpu_name)
    if nodes is None:
        nodes = base_cfg.nodes if base_cfg and base_cfg.nodes else None
    if nodes is None:
        raise InputError("no cluster size: give --nodes N (or --base base.yaml with nodes)")
    if nodes < 1:
        raise InputError(f"invalid --nodes {nodes}: must be at least 1")
    if gpus_per_node is None and base_cfg and base_cfg.gpus_per_node and not gpu:
        gpus_per_node = base_cfg.gpus_per_node
    cluster = Cluster(gpu=gpu_spec, nodes=nodes,
                      gpus_per_node=gpus_per_node_for(gpu_spec, gpus_per_node))
    seq = seq_len or (base_cfg.seq_len if base_cfg else spec.seq_len)
    if gbs is None:
        gbs = base_cfg.global_batch_size if base_cfg else default_global_batch_size(spec, seq)
    workload = Workload(global_batch_size=gbs, seq_len=seq,
                        precision=precision or (base_cfg.precision if base_cfg else "bf16"))
    choices = AxisChoices(tp=tp, pp=pp, vp=vp, cp=cp, mbs=mbs, recompute=recompute, sp=sp,
                          distributed_optimizer=distributed_optimizer, max_tp=max_tp_per_node)
    if top < 1:
        raise InputError(f"invalid --top {top}: must be at least 1")
    out = Path(output_dir) if output_dir else (
        Path("autoconfig-out") / f"{spec.name}-{gpu_spec.name}-{nodes}n")
    return SearchInputs(model=spec, workload=workload, cluster=cluster, choices=choices,
                        objective=objective, top=top, output_dir=out)


def _read_base(path: str):
    from autoconfig.base.config import read_base_yaml
    return read_base_yaml(Path(path))


def run_search(inputs: SearchInputs):
    """The search itself (no printing, no files): returns a SearchResult."""
    from autoconfig.training.search import search
    return search(inputs.model, inputs.workload, inputs.cluster, inputs.choices,
                  inputs.objective)


def render_search(result, top: int, files: dict | None = None) -> str:
    """The text the command prints: top plans, counts by reason, files."""
    from autoconfig.reports.search_report import TOP_HEADERS, rejection_lines, top_rows
    from autoconfig.units import format_count
    from autoconfig.core.model import total_params
    m, c, w = result.model, result.cluster, result.workload
    lines = [f"{m.name} ({format_count(total_params(m))} params) on {c.nodes} x "
             f"{c.gpus_per_node} {c.gpu.name}, gbs {w.global_batch_size}, seq {w.seq_len}, "
             f"{w.precision}, objective {result.objective}", "",
             tabulate(top_rows(result, top), headers=TOP_HEADERS), ""]
    lines += rejection_lines(result)
    if files:
        lines += ["", "wrote:"] + [f"  {path}" for path in files.values()]
    return "\n".join(lines)


def narrowing_options(func):
    """--tp --pp --vp --cp --mbs --recompute --sp --distributed-optimizer ..."""
    options = [
        click.option("--tp", type=IntListOrAuto, default=None,
                     help="Tensor-parallel sizes to try, e.g. 4,8 (default auto)."),
        click.option("--pp", type=IntListOrAuto, default=None,
                     help="Pipeline-parallel sizes (default auto: divisors of the layers)."),
        click.option("--vp", type=IntListOrAuto, default=None,
                     help="Virtual pipeline stages per rank (default auto)."),
        click.option("--cp", type=IntListOrAuto, default=None,
                     help="Context-parallel sizes (default auto: only for seq >= 4096)."),
        click.option("--mbs", type=IntListOrAuto, default=None,
                     help="Micro-batch sizes (default auto: divisors of the global batch)."),
        click.option("--recompute", type=KindListOrAuto, default=None,
                     help="Recompute kinds: none, selective, full (default auto: all)."),
        click.option("--sp", type=click.Choice(SWITCH_MODES), default="auto",
                     show_default=True, help="Sequence parallelism."),
        click.option("--distributed-optimizer", type=click.Choice(SWITCH_MODES),
                     default="auto", show_default=True, help="Distributed optimizer."),
        click.option("--max-tp-per-node", "--max-tp", "max_tp_per_node", type=int,
                     default=None, help="Largest TP tried (default: GPUs per NVLink domain)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command()
@click.option("--base", type=click.Path(dir_okay=False),
              help="base.yaml from `autoconfig base` (model, batch, sequence, cluster).")
@model_options
@click.option("--gpu", help=f"GPU type (default {DEFAULT_GPU}).")
@click.option("--nodes", type=int, help="Number of nodes.")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: the GPU's usual node).")
@click.option("--gbs", type=int, help="Global batch size in sequences (default: base heuristic).")
@click.option("--seq-len", type=int, help="Sequence length (default: the model's).")
@click.option("--precision", type=click.Choice(PRECISIONS), default=None,
              help="bf16 (default) or fp8 (GPUs with FP8 only).")
@narrowing_options
@click.option("--objective", type=click.Choice(["throughput", "memory"]), default="throughput",
              show_default=True, help="Rank by step time or by memory per GPU.")
@click.option("--top", type=int, default=10, show_default=True, help="Plans to print.")
@profile_options
@click.option("-o", "--output-dir", type=click.Path(file_okay=False),
              help="Report folder (default ./autoconfig-out/<model>-<gpu>-<nodes>n).")
def search(**options) -> None:
    """Rank every valid parallel layout (TP/PP/VP/CP/DP/SP, micro-batch,
    recompute, distributed optimizer) by predicted step time; plans that do
    not fit in GPU memory are pruned. Writes plans.csv, report.md, best.yaml,
    megatron_args.sh and nemo_overrides.txt. With --profile, runs short real
    training jobs for the top plans and ranks them by what they measured."""
    from autoconfig.profiling.sweep import check_options, ranked_from_search, run_profiling
    from autoconfig.reports.search_report import write_report
    profiling = pop_profile_options(options)
    if profiling.profile:
        check_options(profiling)
    inputs = inputs_from_options(**options)
    result = run_search(inputs)
    files = write_report(result, inputs.output_dir, top=inputs.top)
    click.echo(render_search(result, inputs.top, files))
    run_profiling(ranked_from_search(result), result.model, result.workload, result.cluster,
                  profiling, inputs.output_dir)

