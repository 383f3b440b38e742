"""Search serving layouts: enumerate (TP, PP, EP, batch), predict, prune, rank, Pareto front.

Candidates: TP sizes that divide the heads, with the KV heads split evenly or
replicated (``kv % tp == 0`` or ``tp % kv == 0``), inside one NVLink domain or,
where the engine runs TP across nodes, up to the cluster; PP a divisor of the
layers (1 where the engine has no pipeline); replicas = GPUs // (TP * PP).

Two modes (``autoconfig.inference.latency``):

- ``static``: ``batch`` requests served together; candidates are the batches
  given (any sizes) or powers of two up to ``max_batch``; one row per plan.
- ``continuous``: ``batch`` is the concurrency (requests in flight per replica)
  at steady state; candidates run over a grid of concurrencies up to the
  engine's ``max_num_seqs`` (or the ones given), and each layout keeps the row
  of the largest concurrency that fits in memory and meets every limit: the
  layout's throughput at the limit, which is how serving layouts are compared.

A finite job (``autoconfig.inference.job``) replaces the steady state where
one is given; with ``Job.rate_search`` each layout runs it at the largest
Poisson rate meeting the latency limits (``autoconfig.inference.rate_search``),
and the limits may bound the job's p50 or p99 instead of its mean
(``Limits.statistic``).

Plans that do not fit in memory, or miss a latency or throughput limit, are
pruned and counted by reason. Pure: no printing, no files.
"""

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.bounds import POSITIVE, check_number, check_optional
from autoconfig.errors import MAX_COUNT, InfeasibleError, InputError, shown
from autoconfig.training.fp8 import check_precision
from autoconfig.inference.dispatch import DEFAULT_DISPATCH, check_dispatch_used
from autoconfig.inference.engine import Engine, get_engine
from autoconfig.inference.job import PERCENTILES, Job
from autoconfig.inference.lengths import LENGTH_DISTS, check_length_law
from autoconfig.inference.latency import MODES, TPOT_PARTS, TTFT_PARTS, latency
from autoconfig.inference.memory import (fits, kv_tokens_per_request, memory_per_gpu,
                                         pool_tokens)
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.training.memory import usable_bytes

OBJECTIVES = ("throughput", "latency", "cost")
STATISTICS = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)
DEFAULT_MAX_BATCH = 256
LAYOUT = ["tp", "pp", "ep", "replicas"]


@dataclass(frozen=True)
class Limits:
    """Service-level limits; None means no limit."""

    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    max_latency_ms: float | None = None
    min_throughput_tokens_per_s: float | None = None
    """Output tokens/s of the whole cluster."""
    statistic: str = "mean"
    """What the latency limits bound: the mean over requests, or (a job's) their
    median or 99th percentile, as MLPerf's Server constraints and serving SLAs do."""

    def __post_init__(self) -> None:
        for name in ("max_ttft_ms", "max_tpot_ms", "max_latency_ms",
                     "min_throughput_tokens_per_s"):
            flag = "--" + name.replace("_tokens_per_s", "").replace("_", "-")
            check_optional(flag, getattr(self, name), POSITIVE)
        if self.statistic not in STATISTICS:
            raise InputError(f"invalid --limit-statistic {shown(self.statistic)}: allowed are "
                             f"{', '.join(STATISTICS)}")

    @property
    def latency_bound(self) -> bool:
        return any(v is not None for v in (self.max_ttft_ms, self.max_tpot_ms,
                                           self.max_latency_ms))


@dataclass(frozen=True)
class Pins:
    """Layout values the user fixed (empty: search them)."""

    tp: tuple[int, ...] = ()
    pp: tuple[int, ...] = ()
    batch: tuple[int, ...] = ()
    """Static batch sizes, or concurrencies in continuous mode."""
    ep: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "batch", "ep"):
            for value in getattr(self, name):
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                        or not 1 <= value <= MAX_COUNT:
                    raise InputError(f"invalid --{name} {shown(value)}: must be a positive "
                                     f"integer up to {MAX_COUNT}")


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
    engine: Engine | None = None
    mode: str = "static"
    job: Job | None = None

    @property
    def plans(self) -> list[InferencePlan]:
        return [InferencePlan(int(r.tp), int(r.pp), int(r.batch), int(r.replicas), int(r.ep))
                for r in self.table.itertuples()]


def tp_choices(model: ModelSpec, cluster: Cluster, across_nodes: bool = False) -> list[int]:
    """TP sizes dividing the heads whose KV heads split evenly or replicate; within
    one NVLink domain unless the engine runs TP across nodes."""
    limit = cluster.num_gpus if across_nodes else min(cluster.nvlink_domain_gpus,
                                                      cluster.num_gpus)
    kv = model.num_kv_heads
    return [t for t in range(1, limit + 1) if model.num_heads % t == 0
            and (kv % t == 0 or t % kv == 0) and (t & (t - 1) == 0 or t in (6, 12, 24, 72))]


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


def pp_choices(model: ModelSpec, max_pp: int, engine: Engine) -> list[int]:
    """Pipeline depths searched: those dividing the layers, and the powers of two
    an engine that deals layers unevenly runs (``Engine.splits_layers``), up to
    ``max_pp``."""
    return [p for p in range(1, min(model.num_layers, max_pp) + 1)
            if (model.num_layers % p == 0 or p & (p - 1) == 0)
            and engine.splits_layers(model.num_layers, p)]


def concurrency_grid(top: int) -> list[int]:
    """Concurrencies tried in continuous mode: every integer to 16, then steps
    of about 1/8 of the value (a served concurrency is any integer, and the
    limit is found to within about 12%)."""
    values, c = [], 1
    while c <= top:
        values.append(c)
        c += max(1, 2 ** max(0, int(np.log2(c)) - 3)) if c >= 16 else 1
    return values


CONTINUOUS_MAX = 2048
"""Concurrency tried for an engine that sets no cap of its own (its KV pool decides)."""


def largest_batch(max_batch: int | None, mode: str, engine: Engine) -> int:
    """The largest batch or concurrency tried: ``--max-batch``, else 256 static
    batches, else the engine's own sequence cap (``max_num_seqs``)."""
    if max_batch is not None:
        return max_batch
    if mode == "continuous":
        return engine.max_num_seqs or CONTINUOUS_MAX
    return DEFAULT_MAX_BATCH


def _batches(pins: Pins, mode: str, max_batch: int, engine: Engine) -> list[int]:
    if pins.batch:
        return sorted(set(pins.batch))
    if mode == "continuous":
        return concurrency_grid(max_batch)
    return [2 ** i for i in range(int(np.log2(max_batch)) + 1)]


def _check_pins(model: ModelSpec, cluster: Cluster, pins: Pins, engine: Engine) -> None:
    gpus = cluster.num_gpus
    for tp in pins.tp:
        if model.num_heads % tp or (model.num_kv_heads % tp and tp % model.num_kv_heads):
            raise InputError(f"invalid --tp {tp}: must divide the {model.num_heads} heads of "
                             f"{model.name} and divide or be a multiple of its "
                             f"{model.num_kv_heads} KV heads")
        if tp > gpus:
            raise InputError(f"invalid --tp {tp}: the cluster has {gpus} GPUs")
        if tp > cluster.nvlink_domain_gpus and not engine.tensor_parallel_across_nodes:
            raise InputError(f"invalid --tp {tp}: engine {engine.name} keeps TP inside one "
                             f"NVLink domain ({cluster.nvlink_domain_gpus} GPUs)")
    for ep in pins.ep:
        if ep > 1 and not model.is_moe:
            raise InputError(f"invalid --ep {ep}: {model.name} has no experts; use --ep 1")
        if ep > 1 and (model.num_experts % ep or gpus % ep):
            raise InputError(f"invalid --ep {ep}: must divide the {model.num_experts} experts "
                             f"of {model.name} and the cluster's {gpus} GPUs")
    if pins.ep and pins.tp and not any(e == 1 or e % t == 0 for e in pins.ep for t in pins.tp):
        # ep_choices: an expert-parallel group is made of whole TP groups.
        raise InputError(f"invalid --ep {','.join(map(str, pins.ep))} with --tp "
                         f"{','.join(map(str, pins.tp))}: EP must be 1 or a multiple of TP "
                         "(an expert-parallel group is made of whole tensor-parallel groups)")
    for pp in pins.pp:
        if pp > 1 and not engine.pipeline_parallel:
            raise InputError(f"invalid --pp {pp}: engine {engine.name} has no pipeline "
                             "parallelism; use --pp 1")
        if not engine.splits_layers(model.num_layers, pp):
            layers = model.num_layers
            rule = {"even": f"{engine.name} needs it to divide",
                    "balanced": "it must be at most",
                    "ceil": f"{engine.name} gives each stage ceil({layers}/{pp}) layers and "
                            "the last what remains, so it must leave that stage one of"}
            how = rule["balanced" if pp > layers else engine.pipeline_layers]
            raise InputError(f"invalid --pp {pp}: {how} the {layers} layers of {model.name}")


def candidate_table(model: ModelSpec, cluster: Cluster, max_batch: int | None,
                    engine: Engine | None = None, mode: str = "static",
                    pins: Pins = Pins()) -> InferencePlanTable:
    engine = engine or get_engine(None)
    max_batch = largest_batch(max_batch, mode, engine)
    if not 1 <= max_batch <= MAX_COUNT:
        raise InputError(f"invalid --max-batch {shown(max_batch)}: must be from 1 to {MAX_COUNT}")
    _check_pins(model, cluster, pins, engine)
    gpus = cluster.num_gpus
    batches = _batches(pins, mode, max_batch, engine)
    tps = list(pins.tp) or tp_choices(model, cluster, engine.tensor_parallel_across_nodes)
    plans = []
    for t in tps:
        pps = list(pins.pp) or pp_choices(model, gpus // t, engine)
        for p in pps:
            if t * p > gpus:
                continue
            choices = ep_choices(model, t, gpus // (t * p))
            for e in [e for e in choices if e in pins.ep] if pins.ep else choices:
                plans += [InferencePlan(t, p, b, gpus // (t * p), e) for b in batches]
    if not plans:
        raise InfeasibleError(f"no layout of {model.name} fits {gpus} GPUs: TP must divide "
                              f"its {model.num_heads} heads and {model.num_kv_heads} KV "
                              "heads, TP x PP at most the GPUs")
    return InferencePlanTable.from_plans(plans)


def predict(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
            cluster: Cluster, constants=None, engine: Engine | None = None,
            mode: str = "static") -> pd.DataFrame:
    """Every prediction of every plan as one DataFrame row (no pruning); ``constants``:
    a calibration's (default heuristics/perf.yaml)."""
    engine = engine or get_engine(None)
    lat = latency(model, workload, plans, cluster, constants, engine, mode)
    kv_tokens = kv_tokens_per_request(workload, engine.kv_block_tokens if engine.paged else None,
                                      mode == "continuous", engine.kv_reserves_output)
    pool = pool_tokens(model, workload, plans, lat.activation_tokens, cluster.gpu, engine)
    held = _pool_held(pool, plans, kv_tokens)
    mem = memory_per_gpu(model, workload, plans, lat.activation_tokens, held, pool is not None,
                         engine=engine)
    fit = fits(mem, cluster.gpu)
    if pool is not None:                            # and the batch's cache within the pool
        fit = fit & (pool > 0) & (plans.batch * kv_tokens <= pool)
    gpus = (plans.tp * plans.pp).astype(float)
    requests_per_s = plans.batch / lat.latency_s
    tokens_per_s = requests_per_s * workload.output_len_tokens
    return pd.DataFrame({
        "serving": "aggregated", "tp": plans.tp, "pp": plans.pp, "ep": plans.ep, "batch": plans.batch,
        "replicas": plans.replicas,
        "gpus_per_replica": gpus.astype(int),
        "ttft_ms": lat.ttft_s * 1e3, "tpot_ms": lat.tpot_s * 1e3,
        "latency_ms": lat.latency_s * 1e3,
        "tokens_per_s_per_user": 1.0 / lat.tpot_s,
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
        "fits": fit,
        **part_columns("tpot", TPOT_PARTS, lat.tpot_parts, len(plans)),
        **part_columns("ttft", TTFT_PARTS, lat.ttft_parts, len(plans)),
        POOL_REQUESTS: (np.full(len(plans), np.nan) if pool is None
                        else np.floor(np.maximum(pool, 0.0) / kv_tokens)),
    })


def part_columns(metric: str, names: tuple, parts, rows: int) -> dict:
    """``<metric>_<part>_ms`` columns of each of ``rows`` plans' ``metric`` by part
    (``names``: ``TPOT_PARTS``, ``TTFT_PARTS``); NaN where no analytic value
    stands behind the rows (``parts`` None: a simulated job's)."""
    return {f"{metric}_{name}_ms": (np.full(rows, np.nan) if parts is None
                                    else getattr(parts, f"{name}_s") * 1e3)
            for name in names}


POOL_REQUESTS = "_kv_pool_requests"
"""Working column (dropped before results are shown): requests whose KV cache the
engine's pool holds, for the error that names it when only the pool is short."""


def _no_fit_message(model: ModelSpec, table: pd.DataFrame, cluster: Cluster) -> str:
    """Why no layout fits: memory per GPU, or, where every layout's memory fits
    but its KV pool cannot hold the requests asked for, the pool."""
    need, usable = table["memory_gib"].min(), usable_bytes(cluster.gpu) / 2**30
    where = f"{cluster.num_gpus} x {cluster.gpu.name}"
    pooled = table[POOL_REQUESTS] if POOL_REQUESTS in table else pd.Series(dtype=float)
    if need <= usable and pooled.notna().all() and len(pooled):
        best = int(pooled.max())
        asked = int(table.loc[pooled.idxmax(), "batch"])
        return (f"no layout of {model.name} holds {asked} requests per replica in its KV "
                f"pool on {where}: the largest pool holds {best}; ask fewer (--concurrency, "
                "--batch or --max-batch), raise --kv-memory-fraction or --kv-cache-tokens, "
                "use more GPUs, or fp8")
    return (f"no layout of {model.name} fits in {where}: the smallest needs {need:.1f} GiB "
            f"per GPU of {usable:.1f}; use more GPUs, fp8, or shorter sequences")


def _pool_held(pool, plans, kv_tokens):
    """KV tokens per request that memory holds: what each request needs, or, where
    the engine allocates a pool at start (``memory.pool_tokens``: its user's or
    its memory rule's), the whole pool spread over the batch."""
    if pool is None:
        return kv_tokens
    return pool / plans.batch.astype(float)


def _limit_checks(limits: Limits):
    """(reason, column, bound, is upper bound) of each limit given."""
    tail = "" if limits.statistic == "mean" else f"_{limits.statistic}"
    checks = (("TTFT over --max-ttft-ms", f"ttft{tail}_ms", limits.max_ttft_ms, True),
              ("TPOT over --max-tpot-ms", f"tpot{tail}_ms", limits.max_tpot_ms, True),
              ("latency over --max-latency-ms", f"latency{tail}_ms", limits.max_latency_ms,
               True),
              ("throughput under --min-throughput", "tokens_per_s_total",
               limits.min_throughput_tokens_per_s, False))
    return [c for c in checks if c[2] is not None]


def search(model: ModelSpec, workload: InferenceWorkload, cluster: Cluster,
           objective: str = "throughput", limits: Limits | None = None,
           max_batch: int | None = None, constants=None, engine: Engine | None = None,
           mode: str | None = None, pins: Pins = Pins(),
           request_rate_per_s: float | None = None,
           disaggregated: bool = False, job: Job | None = None) -> InferenceSearchResult:
    """Rank every serving layout; InfeasibleError (naming the best achievable)
    when memory or a limit leaves nothing. ``mode`` defaults to the engine's
    batching (static when batch sizes are pinned). ``request_rate_per_s``
    (continuous only): each layout at the smallest concurrency whose steady
    state serves that many requests/s on the whole cluster (Little's law: the
    requests in flight are the rate times their latency). ``disaggregated``:
    add prefill/decode-pool rows (``autoconfig.inference.disaggregated``).
    ``job``: a finite job instead of a steady state (``autoconfig.inference.job``):
    each layout runs it with the engine's cap on running sequences (``max_batch``
    when given) and is scored on its means and its duration."""
    if objective not in OBJECTIVES:
        raise InputError(f"invalid objective {objective!r}: allowed are {', '.join(OBJECTIVES)}")
    engine = engine or get_engine(None)
    mode = mode or ("static" if pins.batch else engine.batching)
    if mode not in MODES:
        raise InputError(f"invalid --batching {mode!r}: allowed are {', '.join(MODES)}")
    if mode == "continuous" and not engine.continuous:
        raise InputError(f"engine {engine.name} batches statically: use --batching static or "
                         "an in-flight engine")
    if request_rate_per_s is not None:
        check_number("--request-rate", request_rate_per_s, POSITIVE)
        if mode != "continuous" or pins.batch:
            raise InputError("--request-rate needs continuous batching and no --batch or "
                             "--concurrency (the rate sets the concurrency)")
    if disaggregated and not (engine.continuous and engine.disaggregated_prefill):
        raise InputError(f"engine {engine.name} does not serve prefill and decode on separate "
                         "GPUs: drop --disaggregated or pick an engine that does")
    if disaggregated and (pins.batch or request_rate_per_s is not None or mode != "continuous"):
        raise InputError("--disaggregated ranks pools at their limits: it takes continuous "
                         "batching and no --batch, --concurrency or --request-rate")
    if job is not None and (mode != "continuous" or pins.batch or disaggregated
                            or request_rate_per_s is not None):
        raise InputError("--num-requests runs a job on an in-flight engine: it takes "
                         "continuous batching and no --batch, --request-rate or "
                         "--disaggregated (--concurrency sets its clients)")
    if job is not None and job.clients is not None and job.clients > job.requests:
        raise InputError(f"invalid --concurrency {job.clients} with --num-requests "
                         f"{job.requests}: more clients than requests would send them all at "
                         f"once; give at most {job.requests} clients, or drop --concurrency to "
                         "send them all at once")
    # the CLI checks an explicit --length-dist gamma too (the default here)
    check_length_law(None if workload.length_dist == LENGTH_DISTS[0] else workload.length_dist,
                     workload.input_len_std_tokens, workload.output_len_std_tokens,
                     job is not None)
    # the CLI checks an explicit --dispatch round-robin too (the default here)
    check_dispatch_used(None if workload.dispatch == DEFAULT_DISPATCH else workload.dispatch,
                        request_rate_per_s is not None or (job is not None and (
                            job.rate_per_s is not None or job.rate_search)))
    check_prompt_fits_step(engine, mode, workload.input_len_tokens)
    limits = limits or Limits()
    if limits.statistic != "mean" and job is None:
        raise InputError(f"--limit-statistic {limits.statistic} bounds a percentile over a "
                         "job's requests: give --num-requests (steady state has means only)")
    if limits.statistic != "mean" and not limits.latency_bound:
        raise InputError(f"--limit-statistic {limits.statistic} says what the latency limits "
                         "bound, and none is given: add --max-ttft-ms, --max-tpot-ms or "
                         "--max-latency-ms")
    if job is not None and job.rate_search and not limits.latency_bound:
        raise InputError("--request-rate max needs a latency limit to search against: "
                         "--max-ttft-ms, --max-tpot-ms or --max-latency-ms")
    check_precision(cluster.gpu, workload.precision)
    if job is not None:
        pins = dataclasses.replace(pins, batch=(largest_batch(max_batch, mode, engine),))
    plans = candidate_table(model, cluster, max_batch, engine, mode, pins)
    table = predict(model, workload, plans, cluster, constants, engine, mode)
    if job is not None:
        table = _with_job(table, model, workload, plans, cluster, constants, engine, job,
                          limits)
    rejected = {}
    keep = table["fits"].to_numpy(dtype=bool, copy=True)
    if not keep.any():
        raise InfeasibleError(_no_fit_message(model, table, cluster)
                              + _preemption_hint(engine, mode, pins))
    rejected["does not fit in memory"] = int((~keep).sum())
    if request_rate_per_s is not None:
        keep, short = _at_rate(table, keep, request_rate_per_s)
        if not keep.any():
            best = table[table["fits"]]["requests_per_s_total"].max()
            raise InfeasibleError(f"no layout sustains --request-rate {request_rate_per_s:g} "
                                  f"requests/s: the most any serves is {best:.3g}")
        rejected["cannot sustain --request-rate"] = short
    for reason, column, bound, upper in _limit_checks(limits):
        values = table[column].to_numpy()
        ok = values <= bound if upper else values >= bound
        if not (keep & ok).any():
            best = table[keep].sort_values(column, ascending=upper).iloc[0]
            unit = "ms" if upper else "tokens/s"
            what = {"ttft": "TTFT", "tpot": "TPOT", "latency": "latency",
                    "tokens": "throughput"}[column.split("_")[0]]
            what += "" if limits.statistic == "mean" or not upper else f" ({limits.statistic})"
            raise InfeasibleError(
                f"no layout meets {reason.split()[-1]} {bound:g}: the best {what} achievable is "
                f"{best[column]:.1f} {unit} (tp{best.tp} pp{best.pp} batch {best.batch})")
        rejected[reason] = int((keep & ~ok).sum())
        keep = keep & ok
    kept = table[keep].drop(columns=POOL_REQUESTS, errors="ignore")
    if mode == "continuous" and not pins.batch and request_rate_per_s is None and job is None:
        kept = at_limit(kept)
        rejected["below the largest concurrency meeting the limits"] = \
            int(keep.sum()) - len(kept)
    if disaggregated:
        split = _disaggregated(model, workload, cluster, constants, engine, limits, plans,
                               max_batch)
        if not split.empty:
            kept = pd.concat([kept, split], ignore_index=True)
        else:       # say so: the table would otherwise look as if it was not asked
            rejected["disaggregated serving: no prefill pool and decode pool pair fits the "
                     "GPUs and the limits"] = 1
    kept = rank(kept, objective)
    return InferenceSearchResult(model=model, workload=workload, cluster=cluster,
                                 objective=objective, limits=limits,
                                 table=kept.reset_index(drop=True),
                                 rejected={k: v for k, v in rejected.items() if v},
                                 candidates=len(table), engine=engine, mode=mode, job=job)


def check_prompt_fits_step(engine: Engine, mode: str, input_len_tokens: int) -> None:
    """InputError where an in-flight engine that runs prompts whole (no chunked
    prefill) has a step budget shorter than the prompt: no step can hold it, and
    the engine refuses it (vLLM at start-up: max_num_batched_tokens below
    max_model_len without chunked prefill; TensorRT-LLM per request: 'The sum of
    prompt length ... should not exceed max_num_tokens', llmapi/llm.py
    _check_arguments). A spread job's longer prompts are still run whole, alone
    in their step."""
    budget = engine.max_batched_tokens
    if mode == "continuous" and budget and not engine.chunked_prefill \
            and input_len_tokens > budget:
        raise InputError(f"--input-len {input_len_tokens} is longer than the {budget}-token "
                         f"step budget of {engine.name}, which runs prompts whole (no chunked "
                         "prefill): no step can hold one; give --chunked-prefill, or "
                         f"--max-batched-tokens of at least {input_len_tokens}")


def static_batch_as_job(engine: Engine, mode: str) -> bool:
    """Whether a static batch that overflows the KV cache still runs on this engine:
    an in-flight engine with a paged cache admits the requests whose KV its pool
    holds and preempts or queues the rest (module ``autoconfig.inference.job``),
    so the batch runs, as a job of that many requests sent at once; a contiguous
    cache must hold the whole batch's sequences before it starts."""
    return mode == "static" and engine.continuous and engine.kv_block_tokens is not None


def _preemption_hint(engine: Engine, mode: str, pins: Pins) -> str:
    if not static_batch_as_job(engine, mode):
        return ""
    batch = max(pins.batch) if pins.batch else "B"
    return (f"; or, as {engine.name} runs a batch its KV cache cannot hold (admitting what "
            f"fits, preempting the rest), --num-requests {batch} --max-batch {batch}")


def _with_job(table: pd.DataFrame, model, workload, plans, cluster, constants, engine,
              job: Job, limits: Limits) -> pd.DataFrame:
    """The steady-state rows replaced by each layout's run of ``job``: its means,
    its throughput over the whole job, memory at its peak KV reservation."""
    from autoconfig.inference import job as jobs
    from autoconfig.training.step_time import load_constants

    constants = constants or load_constants()
    runs = _runs_at_largest_rate(model, workload, plans, cluster, constants, engine, job,
                                 limits) if job.rate_search \
        else jobs.run(model, workload, plans, cluster, constants, engine, job)
    table = table.copy()
    gpus = table["gpus_per_replica"].to_numpy(dtype=float)
    for column in ("ttft_ms", "tpot_ms", "latency_ms", "tokens_per_s_per_replica",
                   "requests_per_s_per_replica", "fits", *jobs.PERCENTILE_COLUMNS):
        table[column] = runs[column].to_numpy()
    table["tokens_per_s_per_user"] = 1e3 / table["tpot_ms"]
    table = table.assign(**part_columns("tpot", TPOT_PARTS, None, len(table)),  # simulated
                         **part_columns("ttft", TTFT_PARTS, None, len(table)))
    for unit in ("tokens", "requests"):
        per_replica = table[f"{unit}_per_s_per_replica"]
        table[f"{unit}_per_s_per_gpu"] = per_replica / gpus
        table[f"{unit}_per_s_total"] = per_replica * table["replicas"]
    table["job_duration_s"] = runs["duration_s"].to_numpy()
    if job.rate_search:
        table["request_rate_per_s"] = runs["request_rate_per_s"].to_numpy()
        table["load_fraction"] = runs["load_fraction"].to_numpy()
    forward = jobs.activation_tokens(engine, workload, len(plans))
    pool = pool_tokens(model, workload, plans, forward, cluster.gpu, engine)
    held = _pool_held(pool, plans, runs["peak_kv_tokens"].to_numpy() / plans.batch)
    mem = memory_per_gpu(model, workload, plans, forward, held, pool is not None,
                         engine=engine)
    table["memory_gib"] = mem.total_bytes / 2**30
    table["kv_cache_gib"] = mem.kv_cache_bytes / 2**30
    return table


def _runs_at_largest_rate(model, workload, plans, cluster, constants, engine, job: Job,
                         limits: Limits) -> pd.DataFrame:
    """Each plan's run of ``job`` at the largest Poisson rate (whole cluster) whose
    latencies meet ``limits`` (``autoconfig.inference.rate_search``), with that
    rate in ``request_rate_per_s`` (inf: the job sent at once meets them) and its
    share of the rate the plan completes with the job sent at once in
    ``load_fraction`` (how near the saturation cliff the answer sits:
    ``autoconfig.inference.rate_search``); a plan that meets them at no rate
    keeps its run at the lowest rate tried, which the limit checks then prune. A
    plan whose KV cache cannot hold the job's largest request (its run's
    ``fits``) is pruned anyway: it keeps its offline run, unsearched (rate NaN)."""
    from autoconfig.inference import job as jobs
    from autoconfig.inference.rate_search import largest_rate

    checks = [(column, bound) for _, column, bound, upper in _limit_checks(limits) if upper]
    rows = []
    for i in range(len(plans)):
        one = plans.take([i])
        runs: dict[float, pd.Series] = {}

        def at(rate: float) -> pd.Series:
            if rate not in runs:
                sent = Job(job.requests, None, None if math.isinf(rate) else rate,
                           steady=True)
                runs[rate] = jobs.run(model, workload, one, cluster, constants, engine,
                                      sent).iloc[0]
            return runs[rate]
        offline = at(math.inf)
        if not offline["fits"]:
            rows.append({**offline.to_dict(), "request_rate_per_s": math.nan,
                         "load_fraction": math.nan})
            continue
        capacity = float(offline["requests_per_s_per_replica"] * one.replicas[0])
        rate = largest_rate(lambda r: all(at(r)[c] <= b for c, b in checks), capacity)
        rate = min(runs) if rate is None else rate
        rows.append({**at(rate).to_dict(), "request_rate_per_s": rate,
                     "load_fraction": rate / capacity if math.isfinite(rate) else math.nan})
    return pd.DataFrame(rows)


def _disaggregated(model, workload, cluster, constants, engine, limits, plans,
                   max_batch) -> pd.DataFrame:
    from autoconfig.inference.disaggregated import disaggregated_rows
    from autoconfig.training.step_time import load_constants

    layouts = sorted({(int(t), int(p), int(e)) for t, p, e in zip(plans.tp, plans.pp, plans.ep)})
    grid = concurrency_grid(largest_batch(max_batch, "continuous", engine))

    def run(table, mode):
        return predict(model, workload, table, cluster, constants, engine, mode)
    efficiency = (constants or load_constants()).comm_bandwidth_efficiency
    return disaggregated_rows(model, workload, cluster, engine, layouts, grid, run,
                              limits.max_ttft_ms, limits.max_tpot_ms, efficiency)


def _at_rate(table: pd.DataFrame, keep: np.ndarray, rate: float) -> tuple:
    """(rows kept: each layout's smallest fitting concurrency serving ``rate``
    requests/s, number of layouts that cannot)."""
    enough = keep & (table["requests_per_s_total"].to_numpy() >= rate)
    chosen = table[enough].sort_values("batch").groupby(LAYOUT, sort=False).head(1).index
    mask = np.zeros(len(table), dtype=bool)
    mask[chosen] = True
    layouts = table[keep].groupby(LAYOUT).ngroups
    return mask, layouts - len(chosen)


def at_limit(table: pd.DataFrame) -> pd.DataFrame:
    """Each layout's row at its largest kept concurrency (its throughput at the limit)."""
    if table.empty:
        return table
    last = table.sort_values("batch", kind="stable").groupby(LAYOUT, sort=False).tail(1)
    return last.sort_index()


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
