"""Capacity planning: the best predicted plan of one model on several GPU types
and cluster sizes, and what each costs to train a token budget.

For every (GPU, nodes) cell the full search runs (prune by memory, rank by
step time); the best plan's throughput gives the days and GPU-hours for the
tokens: days = tokens / (tokens/s/GPU x GPUs) / 86400. A cell where nothing
fits is kept with the search's reason, never dropped.
"""

from dataclasses import asdict, dataclass
from typing import Sequence

from autoconfig.base.budget import SECONDS_PER_DAY
from autoconfig.errors import AutoconfigError, InputError
from autoconfig.core.hardware import GPU, Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan, Workload
from autoconfig.training.fp8 import check_precision
from autoconfig.training.search import search
from autoconfig.training.space import AxisChoices
from autoconfig.training.stack import SoftwareFeatures


@dataclass(frozen=True)
class CapacityCell:
    """One GPU type and cluster size: its best plan and the cost of the budget."""

    gpu: str
    nodes: int
    gpus: int
    precision: str
    status: str
    """``ok``, ``infeasible`` (nothing fits) or ``unsupported`` (e.g. fp8 on A100)."""
    reason: str = ""
    plan: Plan | None = None
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    memory_gib: float | None = None
    train_days: float | None = None
    gpu_hours: float | None = None

    def to_row(self) -> dict:
        """A flat dict for CSV and tables (plan fields inlined)."""
        row = {k: v for k, v in asdict(self).items() if k != "plan"}
        plan = asdict(self.plan) if self.plan else {}
        for name in ("tp", "pp", "vp", "cp", "dp", "sp", "mbs", "recompute",
                     "distributed_optimizer"):
            row[name] = plan.get(name)
        return row


def train_days(tokens: float, tokens_per_s: float) -> float:
    return tokens / tokens_per_s / SECONDS_PER_DAY


def plan_cell(model: ModelSpec, workload: Workload, gpu: GPU, nodes: int, gpus_per_node: int,
              tokens: float, choices: AxisChoices = AxisChoices(), *,
              software: SoftwareFeatures | None = None, stack: str | None = None,
              constants=None) -> CapacityCell:
    """Search one cluster and price the token budget on its best plan."""
    gpus = nodes * gpus_per_node
    common = dict(gpu=gpu.name, nodes=nodes, gpus=gpus, precision=workload.precision)
    if workload.precision != "bf16" and not _has_precision(gpu, workload.precision):
        return CapacityCell(status="unsupported",
                            reason=f"{gpu.name} has no {workload.precision.upper()}", **common)
    try:
        result = search(model, workload, Cluster(gpu=gpu, nodes=nodes,
                                                 gpus_per_node=gpus_per_node), choices,
                        software=software, stack=stack, constants=constants)
    except AutoconfigError as exc:
        return CapacityCell(status="infeasible", reason=str(exc), **common)
    best = result.table.iloc[0]
    rate = float(best.tokens_per_s_per_gpu) * gpus
    days = train_days(tokens, rate)
    return CapacityCell(status="ok", plan=result.best, step_time_s=float(best.step_time_s),
                        tokens_per_s_per_gpu=float(best.tokens_per_s_per_gpu), tokens_per_s=rate,
                        mfu=float(best.mfu), memory_gib=float(best.memory_gib),
                        train_days=days, gpu_hours=days * 24 * gpus, **common)


def capacity_grid(model: ModelSpec, workload: Workload, gpus: Sequence[GPU],
                  node_counts: Sequence[int], tokens: float,
                  gpus_per_node: int | None = None,
                  choices: AxisChoices = AxisChoices(), *,
                  software: SoftwareFeatures | None = None,
                  stack: str | None = None, constants: dict | None = None
                  ) -> list[CapacityCell]:
    """Every (GPU, nodes) cell, in the order given; ``constants``: GPU name ->
    calibrated PerfConstants (others use the shipped ones)."""
    if not gpus or not node_counts:
        raise InputError("capacity needs at least one --gpu and one --nodes value")
    bad = [n for n in node_counts if n < 1]
    if bad:
        raise InputError(f"invalid --nodes {bad[0]}: node counts must be at least 1")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InputError(f"invalid --gpus-per-node {gpus_per_node}: must be at least 1")
    if tokens <= 0:
        raise InputError(f"invalid --tokens {tokens:g}: must be greater than zero")
    return [plan_cell(model, workload, gpu, nodes, gpus_per_node or gpu.gpus_per_node,
                      tokens, choices, software=software, stack=stack,
                      constants=(constants or {}).get(gpu.name))
            for gpu in gpus for nodes in node_counts]


def _has_precision(gpu, precision: str) -> bool:
    """Whether ``gpu`` has tensor cores (and a catalog peak) for ``precision``."""
    try:
        check_precision(gpu, precision)
    except InputError:
        return False
    return True
