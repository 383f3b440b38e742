"""``autoconfig estimate``: memory and step time of one plan the user gives.

The command that checks the model against measured runs: one plan in,
predictions with their breakdowns out (a table, or JSON with --format json).
"""

import json
from dataclasses import replace

import click
from tabulate import tabulate

from autoconfig.training.fp8 import check_fp8_recipe
from autoconfig.cli.options import (BATCH, SEQ_LEN, Count, architecture_options,
                                    model_options, moe_shape_options, pop_layers, pop_software,
                                    stack_options)
from autoconfig.core import catalog
from autoconfig.core.catalog import resolve_model, with_architecture, with_layers, with_network
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.core.plan import (PRECISIONS, RECOMPUTE_KINDS, RECOMPUTE_METHODS,
                                  RECOMPUTE_MODULES, Plan, Workload, describe_plan, module_list,
                                  module_mask)
from autoconfig.errors import InputError, shown
from autoconfig.training.estimate import estimate_plan
from autoconfig.training.inputs import DEFAULT_GPU, gpus_per_node_for
from autoconfig.training.space import default_split, dp_for


def _modules(recompute: str, modules: str) -> str:
    """The canonical module list (one-line error for an unknown module or for
    modules without selective recompute)."""
    if not modules:
        return ""
    if any(not name.strip() for name in modules.split(",")):
        raise InputError(f"invalid --recompute-modules {shown(modules)}: expected module names "
                         f"separated by commas ({', '.join(RECOMPUTE_MODULES)})")
    if recompute != "selective":
        raise InputError(f"invalid --recompute-modules {modules!r}: needs --recompute selective")
    return module_list(module_mask(modules))


def _sharding_label(software: dict) -> str:
    """', Megatron-FSDP full-shard' (or the PyTorch FSDP strategy) where the data
    parallel ranks shard the weights too; '' where they do not."""
    name = software.get("fsdp_sharding")
    if not name:
        return ""
    return f", {'Megatron-FSDP' if software.get('megatron_fsdp') else 'FSDP'} {name}"


def render_table(result: dict) -> str:
    plan = Plan(**result["plan"])
    head = (f"{result['model']} on {result['gpus']} x {result['gpu']}, gbs "
            f"{result['global_batch_size']}, seq {result['seq_len']}, {result['precision']}"
            + (f" ({result['fp8_recipe']})" if result.get("fp8_recipe") else "") + ": "
            f"{describe_plan(plan)}" + _sharding_label(result["software"]))
    rows = [("step time (s)", f"{result['step_time_s']:.4f}"),
            ("tokens/s/GPU", f"{result['tokens_per_s_per_gpu']:.1f}"),
            ("TFLOP/s/GPU (model)", f"{result['tflops_per_gpu']:.1f}"),
            ("MFU", f"{100 * result['mfu']:.1f}%"),
            ("memory (GiB/GPU)", f"{result['memory_gib']:.2f} of "
                                 f"{result['gpu_memory_gib']:.1f}"),
            ("fits", "yes" if result["fits"] else "NO")]
    rows += [(f"  memory: {k}", f"{v:.2f}") for k, v in result["memory_breakdown_gib"].items()]
    rows += [(f"  time: {k}", f"{v:.4f}") for k, v in result["time_breakdown_s"].items()]
    if "memory_by_stack_gib" in result:
        rows.insert(2, ("samples/s", f"{_samples_per_s(result):.1f}"))
        rows += [("  time: of compute, cross-attention", f"{result['cross_attention_s']:.4f}")]
        rows += [(f"  {part} (GiB/GPU)", f"{v['states']:.2f} weights+grads+optimizer, "
                  f"{v['activations']:.2f} activations")
                 for part, v in result["memory_by_stack_gib"].items()]
    note = ""
    if "megatron_fsdp_memory_gib" in result:
        sharded = result["megatron_fsdp_memory_gib"]
        verdict = "fits" if sharded <= result["gpu_memory_gib"] else "does not fit either"
        note += (f"\n\nwith --fsdp-sharding full-shard (Megatron-FSDP: the data-parallel ranks "
                 f"shard the weights and gradients too) this plan needs {sharded:.2f} GiB a "
                 f"GPU: {verdict}")
    if "without_recompute" in result:
        bare = result["without_recompute"]
        saved = 100 * (1 - bare["step_time_s"] / result["step_time_s"])
        note += (f"\n\nthis recompute spares no memory: with --recompute none the plan needs "
                 f"{bare['memory_gib']:.2f} GiB a GPU and steps in {bare['step_time_s']:.4f} s "
                 f"({saved:.1f}% less); a search drops it as dominated")
    if result.get("not_modelled"):
        note += (f"\n\nnot modelled: {', '.join(result['not_modelled'])} (priced as a plain "
                 "softmax)")
    if "memory_by_stack_gib" in result:
        head += (f"\nencoder {result['encoder_layers']} layers x {result['seq_len']} tokens, "
                 f"decoder {result['decoder_layers']} layers x {result['decoder_seq_len']} "
                 "tokens (with cross-attention to the encoder output), one pipeline stage "
                 "holds both; tokens/s counts encoder tokens")
    return head + "\n\n" + tabulate(rows, tablefmt="plain") + note


def _samples_per_s(result: dict) -> float:
    return result["global_batch_size"] / result["step_time_s"]


@click.command()
@model_options
@moe_shape_options
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU type.")
@click.option("--gpus", type=int, help="Total GPUs (a whole number of nodes).")
@click.option("--nodes", type=int, help="Nodes, instead of --gpus.")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: the GPU's usual node).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size.")
@click.option("--vp", type=int, default=1, show_default=True,
              help="Virtual pipeline stages per rank (interleaved 1F1B when > 1).")
@click.option("--cp", type=int, default=1, show_default=True, help="Context-parallel size.")
@click.option("--ep", type=Count(1), default=1, show_default=True,
              help="MoE: expert-parallel size (divides the experts).")
@click.option("--etp", type=Count(1), default=None,
              help="MoE: expert tensor-parallel size (default: tp, as Megatron).")
@click.option("--mbs", type=int, default=1, show_default=True, help="Micro-batch size.")
@click.option("--gbs", type=BATCH, required=True, help="Global batch size in sequences.")
@click.option("--seq-len", type=SEQ_LEN, help="Sequence length (default: the model's).")
@click.option("--recompute", type=click.Choice(RECOMPUTE_KINDS), default="none",
              show_default=True, help="Activation recompute granularity.")
@click.option("--recompute-modules", default="",
              help="With --recompute selective: modules recomputed, comma-separated "
                   "(core_attn, layernorm, mla_up_proj, moe_act, mlp, moe; default core_attn).")
@click.option("--recompute-method", type=click.Choice(RECOMPUTE_METHODS), default="uniform",
              show_default=True, help="For full recompute: uniform or block.")
@click.option("--recompute-num-layers", type=int, default=1, show_default=True,
              help="For full recompute: layers per group (uniform) or per chunk (block).")
@click.option("--sp/--no-sp", default=False, help="Sequence parallelism (needs tp > 1).")
@click.option("--distributed-optimizer/--no-distributed-optimizer", default=None,
              help="Shard optimizer state across data-parallel ranks (default: the stack's: "
                   "on for nemo and the FSDP stacks, off for megatron-lm).")
@click.option("--first-stage-layers", "--decoder-first-pipeline-num-layers", "first_stage_layers",
              type=int, default=0, show_default=True,
              help="Layers on the first pipeline stage (0: even split).")
@click.option("--last-stage-layers", "--decoder-last-pipeline-num-layers", "last_stage_layers",
              type=int, default=0, show_default=True,
              help="Layers on the last pipeline stage (0: even split).")
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--memory-recipe", type=click.Choice(("bf16", "fp16", "fp32", "bf16_fp32_accum")),
              default=None, help="Bytes-per-parameter recipe of heuristics/memory.yaml "
              "(default bf16; fp16 for fp16 mixed precision).")
@click.option("--internode-gb-per-s", type=float, default=None,
              help="Scale-out bandwidth per GPU, one direction, GB/s (default: the GPU "
                   "catalog's DGX/HGX figure).")
@architecture_options
@stack_options
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def estimate(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu, gpu, gpus, nodes,
             gpus_per_node, tp, pp, vp, cp, ep, etp, mbs, gbs, seq_len, recompute, recompute_modules, recompute_method,
             recompute_num_layers, sp, distributed_optimizer, first_stage_layers,
             last_stage_layers, precision, memory_recipe, internode_gb_per_s, fmt,
             **opts) -> None:
    """Predict memory per GPU and step time of one plan."""
    stack, software = pop_software(opts)
    layer_fields = pop_layers(opts)
    calibration = opts.pop("calibration")
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         seq_len)
    if spec is None:
        raise InputError("no model: give --model (and --size) or an inline shape "
                         "(--layers --hidden --heads --vocab)")
    spec = with_layers(with_architecture(spec, **opts), **layer_fields)
    gpu_spec = with_network(catalog.get_gpu(gpu), internode_gb_per_s)
    per_node = gpus_per_node_for(gpu_spec, gpus_per_node)
    if (gpus is None) == (nodes is None):
        raise InputError("give the cluster size as --gpus N or --nodes N (one of them)")
    if nodes is not None:
        if nodes < 1:
            raise InputError(f"invalid --nodes {nodes}: must be at least 1")
        gpus = nodes * per_node
    cluster = cluster_from_gpus(gpu_spec, gpus, per_node)
    workload = Workload(global_batch_size=gbs, seq_len=seq_len or spec.seq_len,
                        precision=precision)
    check_fp8_recipe(software, stack.features, workload, gpu_spec)
    if etp is None:
        etp = tp if spec.is_moe else 1
    for name, value in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep), ("etp", etp)):
        if value < 1:  # dp_for divides by these before Plan checks them
            raise InputError(f"invalid --{name} {value}: must be a positive integer")
    if recompute_num_layers < 0:
        raise InputError(f"invalid --recompute-num-layers {recompute_num_layers}: must be >= 0")
    full = recompute == "full"
    plan = Plan(tp=tp, pp=pp, dp=dp_for(cluster.num_gpus, tp, pp, cp), cp=cp, vp=vp, sp=sp,
                mbs=mbs, recompute=recompute,
                recompute_modules=_modules(recompute, recompute_modules),
                recompute_method=recompute_method if full else "uniform",
                recompute_num_layers=recompute_num_layers if full else 0,
                distributed_optimizer=(software.distributed_optimizer
                                       if distributed_optimizer is None
                                       else distributed_optimizer),
                first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                ep=ep, etp=etp)
    if pp > 1 and not (first_stage_layers or last_stage_layers) and spec.num_layers % pp:
        first_stage_layers, last_stage_layers = default_split(spec.num_layers, pp, spec.mtp_layers, vp)
        plan = replace(plan, first_stage_layers=first_stage_layers,
                       last_stage_layers=last_stage_layers)
    from autoconfig.profiling.calibrate import constants_for
    constants, note = constants_for(calibration, gpu_spec.name)
    result = estimate_plan(spec, workload, cluster, plan, software, stack.name, memory_recipe,
                           constants)
    if note:
        result["calibration"] = note
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(render_table(result) + (f"\n{note}" if note else ""))
