"""Check the inference model against published measured serving points
(``benchmarks/published_inference.csv``, sources in benchmarks/SOURCES.md).

Each point is asked exactly as a user would ask ``autoconfig infer``: its
engine, GPU count, pinned TP and PP, and its batch (static), concurrency,
request rate, latency limits (continuous), or nothing (offline: the largest
concurrency that fits). Nothing here is fitted: every constant the
prediction uses comes from heuristics/ and configs/, none from these points,
so the leave-one-source-out figures equal the in-sample ones.

Reported per engine and metric (TTFT, TPOT, request latency, output tokens/s
per GPU; a point that publishes medians is scored on the median of the job's
requests where it is asked as a job): MAPE and the number of points; the within-group Spearman rank
correlation of throughput (groups: one source, model, GPU, engine and request
shape with 3 or more points); and whether the seed tool's three GPT-3 175B
points keep their published throughput order.
"""

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.errors import AutoconfigError, InfeasibleError, InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.dispatch import DEFAULT_DISPATCH
from autoconfig.inference.job import Job
from autoconfig.inference.lengths import LENGTH_DISTS
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.search import Limits, Pins, search, static_batch_as_job
from autoconfig.paths import benchmarks_dir
from autoconfig.textfile import read_text
from autoconfig.units import optional_float

COLUMNS = ("point_id", "source_id", "model", "gpu", "tp", "pp", "batch", "input_len_tokens",
           "output_len_tokens", "precision")
OPTIONAL = ("engine", "batching", "num_gpus", "request_rate_per_s", "ttft_ms", "tpot_ms",
            "latency_ms", "throughput_tokens_per_s", "throughput_samples_per_s",
            "limit_ttft_ms", "limit_tpot_ms", "limit_statistic", "statistic", "num_requests",
            "clients",
            "input_len_std_tokens", "output_len_std_tokens", "decode_steps", "mixed_prefill",
            "max_batched_tokens", "kv_cache_tokens", "chunked_prefill", "kv_policy",
            "kv_memory_fraction", "length_dist", "overlap_schedule", "cuda_graph_max_batch",
            "dispatch", "gemm_allreduce_fusion", "fp8_context_fmha")
METRICS = (("ttft", "ttft_ms", "ttft_ms"), ("tpot", "tpot_ms", "tpot_ms"),
           ("latency", "latency_ms", "latency_ms"),
           ("throughput", "published_tokens_per_s_per_gpu", "tokens_per_s_per_gpu"))
SEED_SOURCE = "SI01"
LEGACY_ENGINE = "fastertransformer"
"""Engine of rows that name none: the seed's points, measured with FasterTransformer.
Only rows of ``SEED_SOURCE`` default to it; another row with a blank engine is not asked."""
MEASURED = ("ttft_ms", "tpot_ms", "latency_ms", "throughput_tokens_per_s",
            "throughput_samples_per_s")
"""Columns that hold measured figures: positive finite numbers when given."""
MIN_GROUP = 3


@dataclass(frozen=True)
class ValidationResult:
    table: pd.DataFrame
    """One row per point asked: published and predicted figures, errors in percent."""
    skipped: pd.DataFrame
    """Points that could not be asked, with the reason."""
    seed_order_holds: bool | None
    """The seed points' published order by throughput per GPU holds; None if absent.
    Per GPU, as a fixed cluster compares them: per replica the published figures
    contradict their own latencies (TP8 PP8 b64: 25.6 samples/s at 2,009 ms is
    51 requests a batch of 64), so no latency model can order them both ways."""


def default_points_path() -> Path:
    return benchmarks_dir() / "published_inference.csv"


def load_points(path: Path) -> pd.DataFrame:
    """The points table: a UTF-8 CSV file with ``COLUMNS`` and ``engine`` (InputError
    naming the file when it is not one); optional columns filled with NaN. Only a
    blank cell is NaN (not given): a cell that reads 'nan' or 'NA' stays text, so
    that a point giving it is reported (``_number``), not read as blank."""
    text = read_text(path, "points file")
    try:
        points = pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"points file {path}: not a CSV table "
                         f"({str(exc).splitlines()[0][:120] if str(exc) else 'empty'})") from None
    missing = [c for c in (*COLUMNS, "engine") if c not in points.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    for column in OPTIONAL:
        if column not in points.columns:
            points[column] = np.nan
    seed = points["source_id"].astype(str).str.strip() == SEED_SOURCE
    points["engine"] = points["engine"].astype(object).where(points["engine"].notna() | ~seed,
                                                             LEGACY_ENGINE)
    points["batching"] = points["batching"].astype(object).where(points["batching"].notna(),
                                                                 "static")
    return points


def _number(row, column: str) -> float | None:
    """The numeric cell ``column`` of a point; None when blank. A cell that is not a
    number is an InputError naming it (the point is then reported as not asked),
    never read as blank."""
    value = getattr(row, column, None)
    number, text = optional_float(value), _cell(value)
    if number is None and text is not None:
        raise InputError(f"invalid {column} {str(value).strip()!r}: not a number")
    return number


def _whole(row, column: str) -> int | None:
    """The count cell ``column`` of a point (tp, batch, clients...); None when blank. Not a
    positive whole number: an InputError naming it (never truncated, nor read as blank)."""
    number = _number(row, column)
    if number is None:
        return None
    if not (math.isfinite(number) and number > 0 and number == int(number)):
        raise InputError(f"invalid {column} {number:g}: must be a positive whole number")
    return int(number)


def _measured(row, column: str) -> float | None:
    """The measured figure ``column`` of a point (``MEASURED``); None when blank, an
    InputError naming it when it is not a positive finite number."""
    number = _number(row, column)
    if number is not None and not (math.isfinite(number) and number > 0):
        raise InputError(f"invalid {column} {number:g}: must be a positive finite number "
                         "(blank: not measured)")
    return number


def _layout(row) -> tuple[int, int, int, int, int]:
    """(tp, pp, GPUs, replicas, ep) of a point; blank TP, PP or EP is 1 (a replica
    holds every expert, as a run that states no expert parallelism ran), blank
    GPUs tp x pp. GPUs that are not a whole number of tp x pp replicas: InputError."""
    tp, pp = _whole(row, "tp") or 1, _whole(row, "pp") or 1
    ep, gpus = _whole(row, "ep") or 1, _whole(row, "num_gpus") or tp * pp
    if gpus % (tp * pp):
        raise InputError(f"invalid num_gpus {gpus}: must be a whole number of replicas of "
                         f"tp x pp = {tp * pp} GPUs")
    return tp, pp, gpus, gpus // (tp * pp), ep


def _check(row) -> None:
    """What ``ask`` does not read before predicting, checked first so that a bad
    cell costs no prediction: the engine named (or the seed's default) and the
    measured figures ``_scored`` reads after it (InputError naming the column).
    The counts ``ask`` reads itself, through ``_whole`` and ``_layout``."""
    if _cell(row.engine) is None:
        raise InputError(f"no engine given: only points of the seed source {SEED_SOURCE} "
                         f"default to {LEGACY_ENGINE}")
    for column in MEASURED:
        _measured(row, column)


def ask(row) -> pd.Series:
    """The prediction ``autoconfig infer`` gives for this point: a static batch
    (``batch``); a finite job of ``num_requests`` (``infer --num-requests``), sent
    all at once, by ``clients`` closed-loop clients or at the request rate
    (Poisson arrivals), or at the largest rate meeting its latency limits
    (``limit_*`` columns: an MLPerf Server or Interactive result, whose rate is
    what the submitter found); a request rate at steady state; a fixed
    concurrency (``clients``); or, with none of these, offline at the largest
    concurrency that fits. For continuous batching ``batch`` is the engine's cap
    on running sequences of one replica that the source ran with."""
    model = get_model(str(row.model))
    gpu = get_gpu(str(row.gpu))
    _check(row)
    steps, budget, pool, graphs = (_whole(row, c) for c in (
        "decode_steps", "max_batched_tokens", "kv_cache_tokens", "cuda_graph_max_batch"))
    engine = engines.configured(str(row.engine), steps,
                                _flag_cell("mixed_prefill", row.mixed_prefill),
                                _flag_cell("chunked_prefill", row.chunked_prefill),
                                budget, pool, _cell(row.kv_policy),
                                _number(row, "kv_memory_fraction"),
                                _flag_cell("overlap_schedule", row.overlap_schedule), graphs,
                                _flag_cell("gemm_allreduce_fusion", row.gemm_allreduce_fusion),
                                _flag_cell("fp8_context_fmha", row.fp8_context_fmha))
    tp, pp, _, replicas, ep = _layout(row)
    cluster = cluster_from_gpus(gpu, replicas * tp * pp, gpu.gpus_per_node)
    lengths = [_number(row, "input_len_tokens"), _number(row, "output_len_tokens")]
    if None in lengths:
        raise InputError("no mean input or output length published")
    for column, length in zip(("input_len_tokens", "output_len_tokens"), lengths):
        if not math.isfinite(length):
            raise InputError(f"invalid {column} {length:g}: must be a finite token count")
    if min(lengths) <= 0:
        raise InputError(f"invalid lengths {lengths[0]:g} in / {lengths[1]:g} out: must be "
                         "positive token counts")
    if str(row.batching) not in ("static", "continuous"):
        raise InputError(f"invalid batching {row.batching!r}: allowed are static, continuous")
    workload = InferenceWorkload(max(1, round(lengths[0])), max(1, round(lengths[1])),
                                 str(row.precision),
                                 _number(row, "input_len_std_tokens") or 0.0,
                                 _number(row, "output_len_std_tokens") or 0.0,
                                 _length_law(row.length_dist),
                                 _cell(row.dispatch) or DEFAULT_DISPATCH)
    engines.check_precision(engine, workload.precision)
    batch, rate = _whole(row, "batch"), _number(row, "request_rate_per_s")
    requests, clients = _whole(row, "num_requests"), _whole(row, "clients")
    if rate is not None and not rate > 0:
        raise InputError(f"invalid request_rate_per_s {rate:g}: must be a positive rate "
                         "(inf: all requests at once)")
    limits = Limits(_number(row, "limit_ttft_ms"), _number(row, "limit_tpot_ms"),
                    statistic=_cell(row.limit_statistic) or "mean")
    cap = batch
    mode, job, pins = "continuous", None, Pins((tp,), (pp,), ep=(ep,))
    if str(row.batching) != "continuous":
        if batch is None:
            raise InputError("no batch given: a static point needs batch, a positive "
                             "whole number")
        mode, rate, cap, pins = "static", None, None, Pins((tp,), (pp,), (batch,), (ep,))
    elif requests is not None and limits.latency_bound:
        # The published rate is the submitter's answer to "the largest rate meeting
        # these limits" (MLPerf Server, Interactive): ask that question
        # (--request-rate max); the rate is scored through the throughput.
        rate, job = None, Job(requests, None, None, rate_search=True)
    elif requests is not None:
        arriving = rate if rate is not None and math.isfinite(rate) else None
        rate, job = None, Job(requests, clients, arriving)
    elif rate is not None and math.isfinite(rate):
        pass
    elif clients is not None:
        rate, pins = None, Pins((tp,), (pp,), (max(1, round(clients / replicas)),), (ep,))
    elif rate is not None:                                  # offline, no job size published
        rate = None
    else:
        raise InputError("no batch, concurrency, job size or request rate published")
    try:
        result = search(model, workload, cluster, "throughput", limits, max_batch=cap,
                        engine=engine, mode=mode, pins=pins, request_rate_per_s=rate, job=job)
    except InfeasibleError:
        if not static_batch_as_job(engine, mode):
            raise
        # The batch's KV cache overflows the pool: ask it as the error tells a user
        # to, --num-requests B --max-batch B (all sent at once, the engine preempts).
        batch = int(pins.batch[0])
        result = search(model, workload, cluster, "throughput", limits, max_batch=batch,
                        engine=engine, pins=Pins((tp,), (pp,), ep=(ep,)),
                        job=Job(batch, None, None))
    return result.table.iloc[0]


def _cell(value) -> str | None:
    """A text cell, stripped and lower-cased; None when empty."""
    text = "" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else str(value).strip().lower()
    return text or None


def _flag_cell(column: str, value) -> bool | None:
    """A true/false cell (``mixed_prefill``, ``chunked_prefill``); empty: None, the
    engine's default."""
    text = _cell(value)
    if text is None:
        return None
    if text not in ("true", "false"):
        raise InputError(f"invalid {column} {value!r}: allowed are true, false or empty")
    return text == "true"


def validate(path: Path | None = None) -> ValidationResult:
    path = path or default_points_path()
    return validate_points(load_points(path), path)


def validate_points(points: pd.DataFrame, path: Path) -> ValidationResult:
    """Ask and score ``points`` (rows of ``load_points(path)``; ``path`` names them in errors)."""
    rows, skipped = [], []
    for row in points.itertuples(index=False):
        try:
            pred = ask(row)
        except AutoconfigError as exc:
            skipped.append({"point_id": row.point_id, "source_id": row.source_id,
                            "reason": str(exc).splitlines()[0][:160]})
            continue
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{path} point {row.point_id}: {str(exc)[:120]}") from None
        rows.append(_scored(row, pred))
    table = pd.DataFrame(rows)
    return ValidationResult(table=table, skipped=pd.DataFrame(skipped,
                                                              columns=["point_id", "source_id",
                                                                       "reason"]),
                            seed_order_holds=_seed_order(table))


def _scored(row, pred) -> dict:
    tp, pp, gpus, _, _ = _layout(row)
    tokens = _measured(row, "throughput_tokens_per_s")
    samples = _measured(row, "throughput_samples_per_s")
    if tokens is None and samples is not None:
        tokens = samples * int(_number(row, "output_len_tokens"))
    scored = {"point_id": row.point_id, "source_id": row.source_id, "engine": row.engine,
              "model": row.model, "gpu": row.gpu, "tp": tp, "pp": pp,
              "batch": _number(row, "batch"), "num_gpus": gpus, "batching": row.batching,
              "input_len_tokens": _number(row, "input_len_tokens"),
              "output_len_tokens": _number(row, "output_len_tokens"),
              "precision": row.precision,
              "predicted_batch": int(pred.batch),
              "published_samples_per_s": samples,
              "predicted_samples_per_s": float(pred.requests_per_s_total),
              "predicted_load": float(pred.get("load_fraction", math.nan)),
              "published_tokens_per_s_per_gpu": None if tokens is None else tokens / gpus}
    for name, published, predicted in METRICS:
        measured = _measured(row, published) if name != "throughput" \
            else scored["published_tokens_per_s_per_gpu"]
        value = float(getattr(pred, predicted))
        column = _median_column(row, name)
        median = None if column is None else optional_float(pred.get(column))
        if median is not None and math.isfinite(median):
            value = median
        scored[f"published_{name}"] = measured
        scored[f"predicted_{name}"] = value
        scored[f"{name}_error_pct"] = None if measured is None else 100 * (value / measured - 1)
    return scored


def _length_law(cell) -> str:
    """The law of a point's spread lengths: the first word of its ``length_dist``
    description when that names one (``lengths.LENGTH_DISTS``: 'uniform (random
    1024/1024, range ratio 0)'), else gamma, the law of a dataset's long tail."""
    words = str(_cell(cell) or "").split()
    return words[0] if words and words[0] in LENGTH_DISTS else "gamma"


def _median_column(row, metric: str) -> str | None:
    """The job column that holds ``metric`` as the point publishes it, where that is
    a median: its statistic is 'median', or names the metric after 'median' ('mean
    TTFT, median TPOT': each request's TPOT, the median request), or 'median ITL'
    for the TPOT (the median of every gap between two tokens, pooled over the
    requests: ``job.inter_token_gaps``). None: the mean, which a steady state or
    static batch has alone (all requests alike)."""
    statistic = str(getattr(row, "statistic", "") or "").lower()
    if metric == "tpot" and "median itl" in statistic:
        return "itl_p50_ms"
    if statistic == "median" or f"median {metric}" in statistic:
        return f"{metric}_p50_ms"
    return None


def _seed_order(table: pd.DataFrame) -> bool | None:
    """The seed's points: published order by throughput per GPU holds (ValidationResult)."""
    seed = table[table["source_id"] == SEED_SOURCE] if not table.empty else table
    if len(seed) < 2:
        return None
    return list(seed.sort_values("published_throughput")["point_id"]) == \
        list(seed.sort_values("predicted_throughput")["point_id"])


def metric_figures(table: pd.DataFrame) -> list[tuple]:
    """(engine, metric, points, MAPE %, median predicted/measured) per engine and metric."""
    figures = []
    if table.empty:
        return figures
    for engine, group in table.groupby("engine"):
        for name, _, _ in METRICS:
            errors = group[f"{name}_error_pct"].dropna().astype(float)
            if errors.empty:
                continue
            figures.append((engine, name, len(errors), errors.abs().mean(),
                            float(np.median(1 + errors / 100))))
    return figures


def group_spearman(table: pd.DataFrame) -> tuple[float | None, int]:
    """Mean within-group Spearman of throughput per GPU, size-weighted, and the groups."""
    keys = ["source_id", "model", "gpu", "engine", "input_len_tokens", "output_len_tokens",
            "precision"]
    values, weights = [], []
    scored = table.dropna(subset=["published_throughput"]) if not table.empty else table
    for _, group in scored.groupby(keys):
        if len(group) < MIN_GROUP:
            continue
        rho = group["published_throughput"].astype(float).rank().corr(
            group["predicted_throughput"].astype(float).rank())
        if not math.isnan(rho):
            values.append(rho)
            weights.append(len(group))
    if not values:
        return None, 0
    return float(np.average(values, weights=weights)), len(values)


def point_rows(t: pd.DataFrame) -> str:
    def cell(value, fmt):
        return "" if value is None or (isinstance(value, float) and math.isnan(value)) \
            else format(value, fmt)
    rows = [(r.point_id, r.engine, r.model, r.gpu, r.tp, r.pp, r.predicted_batch,
             cell(r.published_ttft, ".4g"), cell(r.ttft_error_pct, "+.0f"),
             cell(r.published_tpot, ".4g"), cell(r.tpot_error_pct, "+.0f"),
             cell(r.published_latency, ".5g"), cell(r.latency_error_pct, "+.0f"),
             cell(r.published_throughput, ".4g"), cell(r.throughput_error_pct, "+.0f"),
             cell(100 * r.predicted_load, ".0f"))
            for r in t.itertuples(index=False)]
    return tabulate(rows, headers=("point", "engine", "model", "GPU", "TP", "PP", "batch",
                                   "TTFT ms", "err%", "TPOT ms", "err%", "latency ms", "err%",
                                   "tok/s/GPU", "err%", "load%"))


def format_report(result: ValidationResult) -> str:
    t = result.table
    figures = metric_figures(t) if not t.empty else []
    rho, groups = group_spearman(t) if not t.empty else (None, 0)
    order = {None: "no seed points", True: "holds", False: "DIFFERS"}[result.seed_order_holds]
    lines = [point_rows(t) if not t.empty else "(no points asked)", "",
             tabulate([(e, m, n, f"{mape:.1f}%", f"{ratio:.2f}") for e, m, n, mape, ratio
                       in figures],
                      headers=("engine", "metric", "points", "MAPE", "median pred/meas")), "",
             f"{len(t)} points asked, {len(result.skipped)} could not be",
             *[f"  {r.point_id} ({r.source_id}): {r.reason}"
               for r in result.skipped.itertuples(index=False)],
             "within-group Spearman of throughput: "
             + (f"{rho:.2f} over {groups} groups" if rho is not None else "no group of 3+"),
             f"seed points' order by throughput per GPU (GPT-3 175B, TP8 PP4 b64 > TP8 PP8 "
             f"b64 > TP8 PP8 b4): {order}",
             "nothing is fitted to these points: leave-one-source-out figures equal the "
             "in-sample ones"]
    return "\n".join(lines)


def matching_points(model_name: str, gpu_name: str, workload: InferenceWorkload,
                    path: Path | None = None) -> pd.DataFrame:
    """Published points measured in this exact setting, with their predictions and errors
    (empty when none)."""
    points = load_points(path or default_points_path())
    same = points[(points["model"] == model_name) & (points["gpu"] == gpu_name)
                  & (points["input_len_tokens"] == workload.input_len_tokens)
                  & (points["output_len_tokens"] == workload.output_len_tokens)
                  & (points["precision"] == workload.precision)]
    if same.empty:
        return pd.DataFrame()
    return validate_points(same, path or default_points_path()).table
