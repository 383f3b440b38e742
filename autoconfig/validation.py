"""Check the step-time (and memory) model against published measured runs.

For every usable run: predict the figure the source measured (step time,
TFLOP/s incl. recompute, or tokens/s/GPU), its absolute percentage error, the
mean (MAPE) per source and overall; memory errors where measured; and, for
groups of runs measured in one setting, the Spearman rank correlation between
predicted and measured step time (ranking plans right is the search's job).
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoconfig.paths import benchmarks_dir
from autoconfig.perf import PerfConstants, load_constants, step_time
from autoconfig.plan import PlanTable
from autoconfig.runs import Run, load_runs

TARGET_MAPE_PCT = 10.0
TARGET_MAPE_S01_PCT = 5.0
TARGET_SPEARMAN = 0.8
MIN_GROUP = 2


@dataclass(frozen=True)
class RowResult:
    run: Run
    measured: float
    predicted: float
    predicted_step_s: float
    measured_step_s: float
    """Measured figure turned into a step time (same FLOP count as the source)."""

    @property
    def abs_pct_error(self) -> float:
        return abs(self.predicted / self.measured - 1.0) * 100.0


@dataclass(frozen=True)
class GroupResult:
    key: str
    record_ids: tuple[str, ...]
    spearman: float


@dataclass(frozen=True)
class MemoryResult:
    run: Run
    measured_gb: float
    predicted_gb: float

    @property
    def abs_pct_error(self) -> float:
        return abs(self.predicted_gb / self.measured_gb - 1.0) * 100.0


@dataclass(frozen=True)
class ValidationReport:
    rows: tuple[RowResult, ...]
    """Throughput rows (tuned benchmarks only)."""
    ranking_rows: tuple[RowResult, ...]
    """Every predicted row, incl. untuned ones, for rank correlation."""
    skipped: tuple[Run, ...]
    groups: tuple[GroupResult, ...]
    memory: tuple[MemoryResult, ...] | None
    """None when autoconfig.memory is not available."""

    def mape_by_source(self) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for r in self.rows:
            out.setdefault(r.run.source_id, []).append(r.abs_pct_error)
        return {k: float(np.mean(v)) for k, v in sorted(out.items())}

    @property
    def mape(self) -> float:
        return float(np.mean([r.abs_pct_error for r in self.rows])) if self.rows else float("nan")

    @property
    def memory_mape(self) -> float:
        if not self.memory:
            return float("nan")
        return float(np.mean([m.abs_pct_error for m in self.memory]))


def default_runs_path() -> Path:
    return benchmarks_dir() / "published_runs.csv"


def predict_run(run: Run, constants: PerfConstants | None = None):
    """The StepTimeBreakdown of one run (a 1-row table)."""
    return step_time(run.model, run.workload, PlanTable.from_plans([run.plan]), run.cluster,
                     constants=constants, software=run.software)


def evaluate_rows(runs: list[Run], constants: PerfConstants | None = None) -> list[RowResult]:
    results = []
    for run in runs:
        if not run.usable:
            continue
        perf = predict_run(run, constants)
        step = float(perf.step_time_s[0])
        predicted = run.predicted_measure(step, float(perf.tokens_per_s_per_gpu[0]))
        # A rate scales as 1/step for a fixed FLOP count; a step time as step.
        measured_step = (run.measured if run.measure == "step_time_s"
                         else step * predicted / run.measured)
        results.append(RowResult(run, run.measured, predicted, step, measured_step))
    return results


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties); nan if undefined."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if np.std(rx) == 0 or np.std(ry) == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=float)
    for v in np.unique(values):
        tie = values == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def group_key(run: Run) -> str:
    """One setting: same source, model shape, GPU type and count, and global batch."""
    m = run.model
    return (f"{run.source_id} {m.num_layers}L h{m.hidden_size} a{m.num_heads} "
            f"{run.cluster.num_gpus}x{run.cluster.gpu.name} gbs{run.workload.global_batch_size}")


def rank_groups(rows: list[RowResult], min_size: int = MIN_GROUP) -> list[GroupResult]:
    """Spearman per group of runs measured in one setting (>= min_size distinct
    plans), comparing predicted with measured step time."""
    groups: dict[str, list[RowResult]] = {}
    for r in rows:
        groups.setdefault(group_key(r.run), []).append(r)
    out = []
    for key, members in groups.items():
        if len({(m.run.plan, m.run.workload.precision) for m in members}) < min_size:
            continue
        rho = spearman([m.predicted_step_s for m in members], [m.measured_step_s for m in members])
        out.append(GroupResult(key, tuple(m.run.record_id for m in members), rho))
    return out


def evaluate_memory(runs: list[Run]) -> list[MemoryResult] | None:
    """Predicted peak memory vs measured; None if autoconfig.memory is absent."""
    try:
        from autoconfig.memory import memory_breakdown
    except ImportError:
        return None
    out = []
    for run in runs:
        if run.model is None or run.memory_gb is None:
            continue
        mem = memory_breakdown(run.model, run.workload, PlanTable.from_plans([run.plan]),
                               run.cluster.gpu)
        out.append(MemoryResult(run, run.memory_gb, float(mem.total_bytes[0]) / 1e9))
    return out


def validate(path: Path | None = None, constants: PerfConstants | None = None,
             min_group: int = MIN_GROUP) -> ValidationReport:
    runs = load_runs(path or default_runs_path())
    rows = evaluate_rows(runs, constants or load_constants())
    return ValidationReport(rows=tuple(r for r in rows if r.run.throughput_benchmark),
                            ranking_rows=tuple(rows),
                            skipped=tuple(r for r in runs if not r.usable),
                            groups=tuple(rank_groups(rows, min_group)),
                            memory=evaluate_memory(runs))


def _plan_text(run: Run) -> str:
    p = run.plan
    text = f"tp{p.tp} pp{p.pp} dp{p.dp}"
    if p.cp > 1:
        text += f" cp{p.cp}"
    if p.vp > 1:
        text += f" vp{p.vp}"
    text += f" mbs{p.mbs} {p.recompute}"
    if p.sp:
        text += " sp"
    if run.workload.precision == "fp8":
        text += " fp8"
    return text


def format_report(report: ValidationReport, show_rows: bool = True) -> str:
    """The validation tables as text (tabulate)."""
    from tabulate import tabulate

    lines = []
    if show_rows:
        table = [(r.run.record_id, r.run.source_id, r.run.model_name[:28], r.run.cluster.num_gpus,
                  f"{r.run.cluster.gpu.name}", _plan_text(r.run), r.run.measure,
                  f"{r.measured:.4g}", f"{r.predicted:.4g}", f"{r.abs_pct_error:.1f}")
                 for r in report.rows]
        lines.append(tabulate(table, headers=("record", "source", "model", "GPUs", "gpu", "plan",
                                              "measured figure", "measured", "predicted",
                                              "abs % err")))
        lines.append("")
    lines.append("Throughput MAPE per source (target: <= "
                 f"{TARGET_MAPE_S01_PCT:g}% on S01, <= {TARGET_MAPE_PCT:g}% overall):")
    for source, mape in report.mape_by_source().items():
        n = sum(1 for r in report.rows if r.run.source_id == source)
        lines.append(f"  MAPE {source}: {mape:.1f}% over {n} rows")
    lines.append(f"  MAPE overall: {report.mape:.1f}% over {len(report.rows)} rows "
                 f"(target <= {TARGET_MAPE_PCT:g}%)")
    lines.append("")
    lines.append(f"Spearman rank correlation of predicted vs measured step time, per group "
                 f"measured in one setting (target >= {TARGET_SPEARMAN:g}):")
    for g in report.groups:
        lines.append(f"  {g.key} (n={len(g.record_ids)}): rho = {g.spearman:.2f}")
    rhos = [g.spearman for g in report.groups if np.isfinite(g.spearman)]
    if rhos:
        lines.append(f"  mean rho over {len(rhos)} groups: {np.mean(rhos):.2f}")
    big = [g for g in report.groups if np.isfinite(g.spearman) and len(g.record_ids) >= 3]
    if big:
        weights = np.array([len(g.record_ids) for g in big], float)
        mean = float(np.average([g.spearman for g in big], weights=weights))
        lines.append(f"  mean rho over {len(big)} groups of 3 or more rows "
                     f"(weighted by size): {mean:.2f}")
    lines.append("")
    if report.memory is None:
        lines.append("Memory: memory model not available (autoconfig.memory missing)")
    elif not report.memory:
        lines.append("Memory: no usable rows with measured memory")
    else:
        if show_rows:
            table = [(m.run.record_id, m.run.source_id, _plan_text(m.run), f"{m.measured_gb:.1f}",
                      f"{m.predicted_gb:.1f}", f"{m.abs_pct_error:.1f}") for m in report.memory]
            lines.append(tabulate(table, headers=("record", "source", "plan", "measured GB",
                                                  "predicted GB", "abs % err")))
        lines.append(f"Memory MAPE: {report.memory_mape:.1f}% over {len(report.memory)} rows")
    lines.append("")
    reasons: dict[str, int] = {}
    for run in report.skipped:
        reasons[run.skip_reason] = reasons.get(run.skip_reason, 0) + 1
    lines.append(f"Rows not used ({len(report.skipped)}; S09 llm-foundry FSDP rows are not "
                 "shipped: pure FSDP is not a Megatron plan):")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:3d}  {reason}")
    return "\n".join(lines)
