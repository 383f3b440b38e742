"""Resolving what the user asked for (options, base.yaml) into search inputs.

Library, not CLI: ``search``, ``capacity`` and ``sweep`` resolve a model,
cluster, workload and software stack the same way.
"""

from dataclasses import dataclass
from pathlib import Path

from autoconfig.base.hyperparams import default_global_batch_size
from autoconfig.core import catalog
from autoconfig.core.catalog import resolve_model
from autoconfig.core.hardware import GPU, Cluster, cluster_from_gpus
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Workload
from autoconfig.errors import InputError
from autoconfig.training.fp8 import check_fp8_recipe
from autoconfig.training.space import AxisChoices
from autoconfig.training.stack import SoftwareFeatures, Stack, load_stack

DEFAULT_GPU = "a100-80gb"


def gpus_per_node_for(gpu: GPU, gpus_per_node: int | None) -> int:
    if gpus_per_node is None:
        return gpu.gpus_per_node
    if gpus_per_node < 1:
        raise InputError(f"invalid --gpus-per-node {gpus_per_node}: must be at least 1")
    return gpus_per_node


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
    stack: Stack
    software: SoftwareFeatures
    constants: object = None
    """Calibrated PerfConstants (``--calibration``, set by the caller that read the
    file: ``autoconfig.profiling.calibrate.calibrated``); None: heuristics/perf.yaml."""
    calibration_note: str = ""


def inputs_from_options(*, stack: Stack | None = None,
                        software: SoftwareFeatures | None = None, base: str | None, model: str | None, size: str | None,
                        layers, hidden, heads, kv_heads, ffn, vocab, swiglu: bool,
                        gpu: str | None, nodes: int | None, gpus_per_node: int | None,
                        gpus: int | None = None,
                        gbs: int | None, seq_len: int | None, precision: str | None,
                        tp, pp, vp, cp, mbs, recompute, sp: str, distributed_optimizer: str,
                        max_tp_per_node: int | None, objective: str, top: int,
                        output_dir: str | None, ep=None, etp=None,
                        layer_fields: dict | None = None) -> SearchInputs:
    """Resolve the options (and base.yaml) into SearchInputs; ``layer_fields``
    (ModelSpec field -> value) changes the MoE/MLA fields of the model."""
    base_cfg = read_base(base) if base else None
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         seq_len)
    if spec is not None and layer_fields:
        spec = catalog.with_layers(spec, **layer_fields)
    if spec is None:
        if base_cfg is None:
            raise InputError("no model: give --model (and --size), --base base.yaml, or an "
                             "inline shape (--layers --hidden --heads --vocab)")
        spec = base_cfg.model
    gpu_name = gpu or (base_cfg.gpu_name if base_cfg and base_cfg.gpu_name else DEFAULT_GPU)
    gpu_spec = catalog.get_gpu(gpu_name)
    if gpus is not None and nodes is not None:
        raise InputError("give either --nodes or --gpus, not both")
    if gpus_per_node is None and base_cfg and base_cfg.gpus_per_node and not gpu:
        gpus_per_node = base_cfg.gpus_per_node
    if gpus is not None:
        cluster = cluster_from_gpus(gpu_spec, gpus, gpus_per_node_for(gpu_spec, gpus_per_node))
        nodes = cluster.nodes
    else:
        if nodes is None:
            nodes = base_cfg.nodes if base_cfg and base_cfg.nodes else None
        if nodes is None:
            raise InputError("no cluster size: give --nodes N or --gpus N (or --base base.yaml "
                             "with nodes)")
        if nodes < 1:
            raise InputError(f"invalid --nodes {nodes}: must be at least 1")
        cluster = Cluster(gpu=gpu_spec, nodes=nodes,
                          gpus_per_node=gpus_per_node_for(gpu_spec, gpus_per_node))
    seq = seq_len or (base_cfg.seq_len if base_cfg else spec.seq_len)
    if gbs is None:
        gbs = base_cfg.global_batch_size if base_cfg else default_global_batch_size(spec, seq)
    workload = Workload(global_batch_size=gbs, seq_len=seq,
                        precision=precision or (base_cfg.precision if base_cfg else "bf16"))
    choices = AxisChoices(tp=tp, pp=pp, vp=vp, cp=cp, mbs=mbs, recompute=recompute, sp=sp,
                          distributed_optimizer=distributed_optimizer, max_tp=max_tp_per_node,
                          ep=ep, etp=etp)
    if top < 1:
        raise InputError(f"invalid --top {top}: must be at least 1")
    out = Path(output_dir) if output_dir else (
        Path("autoconfig-out") / f"{spec.name}-{gpu_spec.name}-{nodes}n")
    stack = stack or load_stack(None)
    check_fp8_recipe(software or stack.features, stack.features, workload, gpu_spec)
    return SearchInputs(model=spec, workload=workload, cluster=cluster, choices=choices,
                        objective=objective, top=top, output_dir=out, stack=stack,
                        software=software or stack.features)


def read_base(path: str):
    from autoconfig.base.config import read_base_yaml
    return read_base_yaml(Path(path))
