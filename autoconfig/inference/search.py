"""Search serving layouts: enumerate (TP, PP, batch), predict, prune, rank, Pareto front.

Candidates: TP a power of two within one NVLink domain that divides the heads
and the KV heads (megatron-core needs ``num_query_groups % tp == 0``); PP a
divisor of the layers; batch a power of two up to ``max_batch``; replicas =
GPUs // (TP * PP). Plans that do not fit in memory, or miss a latency or
throughput limit, are pruned and counted by reason. Pure: no printing, no files.
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.errors import MAX_COUNT, InfeasibleError, InputError, shown
from autoconfig.inference.latency import latency
from autoconfig.inference.memory import fits, memory_per_gpu
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.training.memory import usable_bytes

OBJECTIVES = ("throughput", "latency", "cost")
DEFAULT_MAX_BATCH = 256


@dataclass(frozen=True)
class Limits:
    """Service-level limits; None means no limit."""

    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    max_latency_ms: float | None = None
    min_throughput_tokens_per_s: float | None = None
    """Output tokens/s of the whole cluster."""

    def __post_init__(self) -> None:
        for name in ("max_ttft_ms", "max_tpot_ms", "max_latency_ms",
                     "min_throughput_tokens_per_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                flag = "--" + name.replace("_tokens_per_s", "").replace("_", "-")
                raise InputError(f"invalid {flag} {value!r}: must be positive")


@dataclass(frozen=True)
class InferenceSearchResult:
    model: ModelSpec
    workload: InferenceWorkload
    cluster: Cluster
    objective: str
    limits: Limits
    table: pd.DataFrame
    """Kept plans, best first: one row per plan with every prediction."""
    rejected: dict = field(default_factory=dict)
    """Reason -> number of plans pruned for it."""
    candidates: int = 0

    @property
    def plans(self) -> list[InferencePlan]:
        return [InferencePlan(int(r.tp), int(r.pp), int(r.batch), int(r.replicas), int(r.ep))
                for r in self.table.itertuples()]


def tp_choices(model: ModelSpec, cluster: Cluster) -> list[int]:
    limit = min(cluster.nvlink_domain_gpus, cluster.num_gpus)
    return [t for t in (1, 2, 4, 8, 16, 32, 64, 72) if t <= limit
            and model.num_heads % t == 0 and model.num_kv_heads % t == 0]


def ep_choices(model: ModelSpec, tp: int, replicas: int) -> list[int]:
    """Expert-parallel sizes of a serving plan: 1, and for MoE models every
    multiple of tp up to the GPUs of one pipeline stage (tp x replicas) that
    divides both those GPUs and the experts."""
    if not model.is_moe:
        return [1]
    stage_gpus = tp * replicas
    experts = model.num_experts  # its divisors, not every multiple of tp up to the GPUs
    divisors = {d for i in range(1, int(experts ** 0.5) + 1) if experts % i == 0
                for d in (i, experts // i)}
    return [1] + sorted(e for e in divisors
                        if e > 1 and e % tp == 0 and stage_gpus % e == 0)


def pp_choices(model: ModelSpec, max_pp: int) -> list[int]:
    return [p for p in range(1, min(model.num_layers, max_pp) + 1) if model.num_layers % p == 0]


def candidate_table(model: ModelSpec, cluster: Cluster, max_batch: int) -> InferencePlanTable:
    if not 1 <= max_batch <= MAX_COUNT:
        raise InputError(f"invalid --max-batch {shown(max_batch)}: must be from 1 to {MAX_COUNT}")
    gpus = cluster.num_gpus
    batches = [2 ** i for i in range(int(np.log2(max_batch)) + 1)]
    plans = [InferencePlan(t, p, b, gpus // (t * p), e)
             for t in tp_choices(model, cluster) for p in pp_choices(model, gpus // t)
             for e in ep_choices(model, t, gpus // (t * p)) for b in batches]
    if not plans:
        raise InfeasibleError(f"no TP size divides the {model.num_heads} heads and "
                              f"{model.num_kv_heads} KV heads of {model.name} within "
                              f"{gpus} GPUs")
    return InferencePlanTable.from_plans(plans)


def predict(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
            cluster: Cluster, constants=None) -> pd.DataFrame:
    """Every prediction of every plan as one DataFrame row (no pruning); ``constants``:
    a calibration's (default heuristics/perf.yaml)."""
    lat = latency(model, workload, plans, cluster, constants)
    mem = memory_per_gpu(model, workload, plans, lat.prefill_microbatch_requests)
    gpus = (plans.tp * plans.pp).astype(float)
    requests_per_s = plans.batch / lat.latency_s
    tokens_per_s = requests_per_s * workload.output_len_tokens
    return pd.DataFrame({
        "tp": plans.tp, "pp": plans.pp, "ep": plans.ep, "batch": plans.batch,
        "replicas": plans.replicas,
        "gpus_per_replica": gpus.astype(int),
        "ttft_ms": lat.ttft_s * 1e3, "tpot_ms": lat.tpot_s * 1e3,
        "latency_ms": lat.latency_s * 1e3,
        "tokens_per_s_per_replica": tokens_per_s,
        "requests_per_s_per_replica": requests_per_s,
        "tokens_per_s_per_gpu": tokens_per_s / gpus,
        "requests_per_s_per_gpu": requests_per_s / gpus,
        "tokens_per_s_total": tokens_per_s * plans.replicas,
        "requests_per_s_total": requests_per_s * plans.replicas,
        "memory_gib": mem.total_bytes / 2**30,
        "weights_gib": mem.weights_bytes / 2**30, "kv_cache_gib": mem.kv_cache_bytes / 2**30,
        "prefill_microbatches": lat.prefill_microbatches.astype(int),
        "decode_microbatches": lat.decode_microbatches.astype(int),
        "fits": fits(mem, cluster.gpu),
    })


def _limit_checks(limits: Limits):
    """(reason, column, bound, is upper bound) of each limit given."""
    checks = (("TTFT over --max-ttft-ms", "ttft_ms", limits.max_ttft_ms, True),
              ("TPOT over --max-tpot-ms", "tpot_ms", limits.max_tpot_ms, True),
              ("latency over --max-latency-ms", "latency_ms", limits.max_latency_ms, True),
              ("throughput under --min-throughput", "tokens_per_s_total",
               limits.min_throughput_tokens_per_s, False))
    return [c for c in checks if c[2] is not None]


def search(model: ModelSpec, workload: InferenceWorkload, cluster: Cluster,
           objective: str = "throughput", limits: Limits | None = None,
           max_batch: int = DEFAULT_MAX_BATCH, constants=None) -> InferenceSearchResult:
    """Rank every serving layout; InfeasibleError (naming the best achievable)
    when memory or a limit leaves nothing."""
    if objective not in OBJECTIVES:
        raise InputError(f"invalid objective {objective!r}: allowed are {', '.join(OBJECTIVES)}")
    limits = limits or Limits()
    cluster.gpu.peak_tflops(workload.precision)    # InputError: fp8 on a GPU without it
    plans = candidate_table(model, cluster, max_batch)
    table = predict(model, workload, plans, cluster, constants)
    rejected = {}
    keep = table["fits"].to_numpy(dtype=bool, copy=True)
    if not keep.any():
        need = table["memory_gib"].min()
        raise InfeasibleError(
            f"no layout of {model.name} fits in {cluster.num_gpus} x {cluster.gpu.name}: the "
            f"smallest needs {need:.1f} GiB per GPU of {usable_bytes(cluster.gpu) / 2**30:.1f}; "
            "use more GPUs, fp8, or shorter sequences")
    rejected["does not fit in memory"] = int((~keep).sum())
    for reason, column, bound, upper in _limit_checks(limits):
        values = table[column].to_numpy()
        ok = values <= bound if upper else values >= bound
        if not (keep & ok).any():
            best = table[keep].sort_values(column, ascending=upper).iloc[0]
            unit = "ms" if upper else "tokens/s"
            what = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "latency_ms": "latency",
                    "tokens_per_s_total": "throughput"}[column]
            raise InfeasibleError(
                f"no layout meets {reason.split()[-1]} {bound:g}: the best {what} achievable is "
                f"{best[column]:.1f} {unit} (tp{best.tp} pp{best.pp} batch {best.batch})")
        rejected[reason] = int((keep & ~ok).sum())
        keep = keep & ok
    kept = rank(table[keep], objective)
    return InferenceSearchResult(model=model, workload=workload, cluster=cluster,
                                 objective=objective, limits=limits,
                                 table=kept.reset_index(drop=True),
                                 rejected={k: v for k, v in rejected.items() if v},
                                 candidates=len(table))


def rank(table: pd.DataFrame, objective: str) -> pd.DataFrame:
    """throughput: output tokens/s of the cluster; latency: request latency;
    cost: tokens/s per GPU (GPU-hours per token). Ties by the other measure."""
    table = table.copy()
    table["pareto"] = pareto_mask(table["latency_ms"].to_numpy(),
                                  table["tokens_per_s_per_gpu"].to_numpy())
    keys = {"throughput": (["tokens_per_s_total", "latency_ms"], [False, True]),
            "latency": (["latency_ms", "tokens_per_s_total"], [True, False]),
            "cost": (["tokens_per_s_per_gpu", "latency_ms"], [False, True])}[objective]
    return table.sort_values(keys[0], ascending=keys[1], kind="stable")


def pareto_mask(latency_ms: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """True for plans no other plan beats on both lower latency and higher throughput."""
    order = np.lexsort((-throughput, latency_ms))
    mask = np.zeros(len(latency_ms), dtype=bool)
    best = -np.inf
    for i in order:
        if throughput[i] > best:
            mask[i] = True
            best = throughput[i]
    return mask
