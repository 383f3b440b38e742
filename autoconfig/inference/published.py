"""Check the inference model against published measured points
(``benchmarks/published_inference.csv``, sources in benchmarks/SOURCES.md).

Each point is predicted on its own replica (``tp * pp`` GPUs of its GPU type);
nothing is fitted here. Reported: the error of predicted latency and of
predicted throughput (requests/s of the replica) per point, and whether the
predicted orderings match the published ones, by latency and by throughput
per GPU (a fixed cluster gets per-GPU throughput times its GPUs; for the
published points per-replica and per-GPU orderings are the same).
"""

import io
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.errors import InputError
from autoconfig.textfile import read_text
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.search import predict
from autoconfig.paths import benchmarks_dir

COLUMNS = ("point_id", "source_id", "model", "gpu", "tp", "pp", "batch", "input_len_tokens",
           "output_len_tokens", "precision", "throughput_samples_per_s", "latency_ms")


@dataclass(frozen=True)
class ValidationResult:
    table: pd.DataFrame
    latency_order_matches: bool
    throughput_order_matches: bool


def default_points_path() -> Path:
    return benchmarks_dir() / "published_inference.csv"


def load_points(path: Path) -> pd.DataFrame:
    """The points table: a UTF-8 CSV file with ``COLUMNS`` (InputError naming the
    file when it is not one)."""
    text = read_text(path, "points file")
    try:
        points = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"points file {path}: not a CSV table "
                         f"({str(exc).splitlines()[0][:120] if str(exc) else 'empty'})") from None
    missing = [c for c in COLUMNS if c not in points.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    return points


def predict_point(row) -> pd.Series:
    model = get_model(str(row.model))
    gpu = get_gpu(str(row.gpu))
    plan = InferencePlan(int(row.tp), int(row.pp), int(row.batch), 1)
    cluster = cluster_from_gpus(gpu, plan.gpus_per_replica, gpu.gpus_per_node)
    workload = InferenceWorkload(int(row.input_len_tokens), int(row.output_len_tokens),
                                 str(row.precision))
    return predict(model, workload, InferencePlanTable.from_plans([plan]), cluster).iloc[0]


def validate(path: Path | None = None) -> ValidationResult:
    points = load_points(path or default_points_path())
    rows = []
    for number, row in enumerate(points.itertuples(index=False), start=2):
        try:
            pred = predict_point(row)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InputError(f"{path or default_points_path()} line {number}: "
                             f"{str(exc)[:120]}") from None
        gpus = int(row.tp) * int(row.pp)
        rows.append({"point_id": row.point_id, "source_id": row.source_id, "model": row.model,
                     "tp": row.tp, "pp": row.pp, "batch": row.batch,
                     "published_latency_ms": row.latency_ms,
                     "predicted_latency_ms": pred.latency_ms,
                     "latency_error_pct": 100 * (pred.latency_ms / row.latency_ms - 1),
                     "published_samples_per_s": row.throughput_samples_per_s,
                     "predicted_samples_per_s": pred.requests_per_s_per_replica,
                     "throughput_error_pct": 100 * (pred.requests_per_s_per_replica
                                                    / row.throughput_samples_per_s - 1),
                     "published_samples_per_s_per_gpu": row.throughput_samples_per_s / gpus,
                     "predicted_samples_per_s_per_gpu": pred.requests_per_s_per_gpu,
                     "predicted_ttft_ms": pred.ttft_ms, "predicted_tpot_ms": pred.tpot_ms})
    table = pd.DataFrame(rows)
    return ValidationResult(
        table=table,
        latency_order_matches=_same_order(table, "published_latency_ms", "predicted_latency_ms"),
        throughput_order_matches=_same_order(table, "published_samples_per_s_per_gpu",
                                             "predicted_samples_per_s_per_gpu"))


def _same_order(table: pd.DataFrame, published: str, predicted: str) -> bool:
    return list(table.sort_values(published)["point_id"]) == \
        list(table.sort_values(predicted)["point_id"])


def point_rows(t: pd.DataFrame) -> str:
    rows = [(r.point_id, r.model, r.tp, r.pp, r.batch, f"{r.published_latency_ms:.0f}",
             f"{r.predicted_latency_ms:.0f}", f"{r.latency_error_pct:+.1f}%",
             f"{r.published_samples_per_s:.1f}", f"{r.predicted_samples_per_s:.1f}",
             f"{r.throughput_error_pct:+.1f}%") for r in t.itertuples(index=False)]
    return tabulate(rows, headers=("point", "model", "TP", "PP", "batch", "latency ms", "pred",
                                   "error", "samples/s", "pred", "error"))


def format_report(result: ValidationResult) -> str:
    t = result.table
    mape_lat = t["latency_error_pct"].abs().mean()
    mape_thr = t["throughput_error_pct"].abs().mean()
    return "\n".join([
        point_rows(t), "",
        f"latency MAPE {mape_lat:.1f}%, throughput MAPE {mape_thr:.1f}% over {len(t)} points",
        f"ordering by latency: {'matches' if result.latency_order_matches else 'DIFFERS'}",
        f"ordering by throughput per GPU: "
        f"{'matches' if result.throughput_order_matches else 'DIFFERS'}"])


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
    table = validate(path).table
    return table[table["point_id"].isin(same["point_id"])]
