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

from autoconfig.training.memory import allocated_bytes, stage_breakdown, usable_bytes
from autoconfig.core.model import hardware_flops_per_token
from autoconfig.paths import benchmarks_dir
from autoconfig.training.step_time import PerfConstants, load_constants, step_time
from autoconfig.core.plan import PlanTable, plan_label
from autoconfig.validation.runs import Run, load_runs

TARGET_MAPE_PCT = 10.0
TARGET_MAPE_S01_PCT = 5.0
TARGET_SPEARMAN = 0.8
TARGET_HELD_OUT_MAPE_PCT = 7.0
TARGET_HELD_OUT_SOURCE_PCT = 12.0
TARGET_HELD_OUT_SPEARMAN = 0.6
LONG_CONTEXT_TOKENS = 16384
"""Sequences from this length on count as long context (attention dominates)."""
AT_SCALE_GPUS = 128
"""Runs on this many GPUs or more form the at-scale family: 16 nodes of 8, where
data-parallel traffic crosses the network and the weak-scaling misses show."""
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

    def with_predicted_step(self, step_s: float) -> "RowResult":
        """The same row predicted at another step time (the figure follows it)."""
        from dataclasses import replace
        tokens_per_gpu = self.run.workload.tokens_per_step / self.run.cluster.num_gpus
        return replace(self, predicted_step_s=step_s,
                       predicted=self.run.predicted_measure(step_s, tokens_per_gpu / step_s))


@dataclass(frozen=True)
class GroupResult:
    key: str
    record_ids: tuple[str, ...]
    spearman: float


@dataclass(frozen=True)
class MemoryResult:
    run: Run
    measured_bytes: float | None
    """None for an OOM row."""
    predicted_bytes: float
    """Same kind as the measurement: allocated tensors, or device memory with overhead."""
    usable_bytes: float
    """Capacity a run can fill on the row's GPU (for OOM rows)."""

    @property
    def oom(self) -> bool:
        return self.measured_bytes is None

    @property
    def predicted_oom(self) -> bool:
        return self.predicted_bytes > self.usable_bytes

    @property
    def unit_bytes(self) -> float:
        """The unit the source reports in: GB (torch) or GiB (nvidia-smi)."""
        return 1e9 if self.run.memory_kind == "allocated" else 2.0**30

    @property
    def abs_pct_error(self) -> float:
        return abs(self.predicted_bytes / self.measured_bytes - 1.0) * 100.0


@dataclass(frozen=True)
class ValidationReport:
    rows: tuple[RowResult, ...]
    """Throughput rows (tuned benchmarks only)."""
    ranking_rows: tuple[RowResult, ...]
    """Every predicted row, incl. untuned ones, for rank correlation."""
    skipped: tuple[Run, ...]
    groups: tuple[GroupResult, ...]
    memory: tuple[MemoryResult, ...]
    """Rows with measured memory or a reported OOM."""

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
        measured = [m.abs_pct_error for m in self.memory or () if not m.oom]
        return float(np.mean(measured)) if measured else float("nan")

    def memory_mape_by_source(self) -> dict[str, tuple[float, int]]:
        """Source -> (MAPE %, rows) over rows with a measured peak."""
        out: dict[str, list[float]] = {}
        for m in self.memory or ():
            if not m.oom:
                out.setdefault(m.run.source_id, []).append(m.abs_pct_error)
        return {k: (float(np.mean(v)), len(v)) for k, v in sorted(out.items())}


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
        measured_step = measured_step_s(run)
        results.append(RowResult(run, run.measured, predicted, step, measured_step))
    return results


def measured_step_s(run: Run) -> float:
    """The row's measured figure as a step time, from the row alone (so equal
    measured rates give equal step times, and ties stay ties in the ranking):
    tokens per step over the rate, or eq. 3 FLOPs per step over the TFLOP/s."""
    if run.measure == "step_time_s":
        return run.measured
    tokens_per_gpu = run.workload.tokens_per_step / run.cluster.num_gpus
    if run.measure == "tokens_per_s_per_gpu":
        return tokens_per_gpu / run.measured
    flops = hardware_flops_per_token(run.model, run.workload.seq_len, "full")
    return tokens_per_gpu * flops / (run.measured * 1e12)


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
    """One setting: same source, model shape, GPU type and count, global batch and
    named FP8 recipe (recipes differ in speed in ways the model does not represent,
    so an MXFP8 run is no evidence on how a plan run in another FP8 recipe ranks;
    bf16 and FP8 stay comparable)."""
    m = run.model
    recipe = f" {run.fp8_recipe}" if run.fp8_recipe else ""
    return (f"{run.source_id} {m.num_layers}L h{m.hidden_size} a{m.num_heads} "
            f"{run.cluster.num_gpus}x{run.cluster.gpu.name} gbs{run.workload.global_batch_size}"
            f"{recipe}")


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


def predict_memory_bytes(run: Run, constants=None) -> tuple[float, float]:
    """(allocated, device) peak bytes of the pipeline rank the row measured.

    The one mapping from a measured row to the memory model, used by validation
    and by benchmarks/fit_memory.py: the row's precision recipe
    (``Run.memory_recipe``), fused attention or not (``SoftwareFeatures``), the
    measured stage (``Run.memory_stage``: the last rank, or the largest of the
    first, middle and last), each with its own layer count (the plan's split). ZeRO-1 is the
    distributed optimizer (``Plan.distributed_optimizer``). ``allocated`` is what
    torch's ``max_memory_allocated`` counts; ``device`` adds the calibrated
    allocator and context overhead (what nvidia-smi shows).
    """

    model = run.model
    table = PlanTable.from_plans([run.plan])
    kw = dict(software=run.software, recipe=run.memory_recipe,
              constants=constants)
    stages = ("last",) if run.memory_stage == "last" else ("first", "middle", "last")
    best = max((stage_breakdown(model, run.workload, table, st, **kw) for st in stages),
               key=lambda b: float(b.total_bytes[0]))
    return float(allocated_bytes(best)[0]), float(best.total_bytes[0])


def evaluate_memory(runs: list[Run], constants=None) -> list[MemoryResult]:
    """Predicted peak memory vs measured (and OOM rows)."""
    out = []
    for run in runs:
        if not run.memory_usable:
            continue
        allocated, device = predict_memory_bytes(run, constants)
        predicted = allocated if run.memory_kind == "allocated" else device
        out.append(MemoryResult(run, run.memory_bytes, predicted,
                                usable_bytes(run.cluster.gpu, constants)))
    return out


def validate(path: Path | None = None, constants: PerfConstants | None = None,
             min_group: int = MIN_GROUP) -> ValidationReport:
    runs = load_runs(path or default_runs_path())
    rows = evaluate_rows(runs, constants or load_constants())
    return ValidationReport(rows=tuple(r for r in rows if r.run.throughput_benchmark),
                            ranking_rows=tuple(rows),
                            skipped=tuple(r for r in runs if not r.usable),
                            groups=tuple(rank_groups(rows, min_group)),
                            memory=tuple(evaluate_memory(runs)))


def ranking_groups(groups) -> list[GroupResult]:
    """The groups the headline rank correlation averages: 3 or more rows, rho defined."""
    return [g for g in groups if np.isfinite(g.spearman) and len(g.record_ids) >= 3]


def weighted_spearman(groups) -> float:
    """Size-weighted mean rho over ``ranking_groups`` (nan if none)."""
    big = ranking_groups(groups)
    if not big:
        return float("nan")
    return float(np.average([g.spearman for g in big],
                            weights=[len(g.record_ids) for g in big]))


def held_out_groups(report: ValidationReport, predictions: dict) -> list[GroupResult]:
    """Spearman per group with every row predicted with its source left out."""
    rows = [r.with_predicted_step(predictions.get(r.run.record_id, r.predicted_step_s))
            for r in report.ranking_rows]
    return rank_groups(rows)


@dataclass(frozen=True)
class Target:
    """A headline target: the figure must be ``op`` (``<=`` or ``>=``) ``limit``."""

    op: str
    limit: float
    percent: bool = True

    def met(self, value: float) -> bool:
        return bool(value <= self.limit if self.op == "<=" else value >= self.limit)

    def __str__(self) -> str:
        return f"{self.op} {self.limit:g}" + ("%" if self.percent else "")


def targets(report: ValidationReport, stored: dict | None) -> list[tuple[str, float, Target, bool]]:
    """(name, value, target, met) for every headline target."""
    def row(name: str, value: float, target: Target) -> tuple[str, float, Target, bool]:
        return name, value, target, target.met(value)

    out = [row("throughput MAPE overall, in-sample", report.mape, Target("<=", TARGET_MAPE_PCT))]
    s01 = report.mape_by_source().get("S01")
    if s01 is not None:
        out.append(row("throughput MAPE S01, in-sample", s01, Target("<=", TARGET_MAPE_S01_PCT)))
    out.append(row("within-group Spearman (weighted), in-sample", weighted_spearman(report.groups),
                   Target(">=", TARGET_SPEARMAN, percent=False)))
    if stored is None:
        # Not computed for this model and these inputs: NaN meets no target.
        out.append(row("throughput MAPE overall, leave-one-source-out (not computed: "
                       "autoconfig validate --cross-validate)", float("nan"),
                       Target("<=", TARGET_HELD_OUT_MAPE_PCT)))
        return out
    out.append(row("throughput MAPE overall, leave-one-source-out",
                   stored["held_out_overall_pct"], Target("<=", TARGET_HELD_OUT_MAPE_PCT)))
    worst, worst_pct = max(stored["held_out_pct"].items(), key=lambda kv: kv[1])
    out.append(row(f"worst source held out ({worst})", worst_pct,
                   Target("<=", TARGET_HELD_OUT_SOURCE_PCT)))
    out.append(row("within-group Spearman (weighted), leave-one-source-out",
                   stored["held_out_spearman_weighted"],
                   Target(">=", TARGET_HELD_OUT_SPEARMAN, percent=False)))
    return out


def run_families(run: Run) -> tuple[str, ...]:
    """The families of runs whose errors ``validate`` prints apart: long context,
    TP of 4 or more inside one node, deep pipelines, runs at scale, MoE, and each
    FP8 recipe."""
    from autoconfig.training.fp8 import precision_label
    plan, families = run.plan, []
    if run.workload.seq_len >= LONG_CONTEXT_TOKENS or plan.cp > 1:
        families.append(f"long context (seq >= {LONG_CONTEXT_TOKENS // 1024}K or CP > 1)")
    if 4 <= plan.tp <= run.cluster.gpus_per_node:
        families.append("TP >= 4 inside a node")
    if plan.pp >= 16:
        families.append("PP >= 16")
    if run.cluster.num_gpus >= AT_SCALE_GPUS:
        families.append(f"{AT_SCALE_GPUS} GPUs or more")
    if run.model.is_moe:
        families.append("MoE")
    families.append(precision_label(run.workload, run.software, run.cluster.gpu).upper())
    return tuple(families)


def family_figures(report: ValidationReport, held_out: dict | None
                   ) -> list[tuple[str, int, float, float]]:
    """(family, rows, in-sample MAPE %, held-out MAPE % or nan) per family."""
    members: dict[str, list[RowResult]] = {}
    for r in report.rows:
        for family in run_families(r.run):
            members.setdefault(family, []).append(r)
    out = []
    for family in sorted(members):
        rows = members[family]
        inside = float(np.mean([r.abs_pct_error for r in rows]))
        held = float("nan")
        if held_out:   # the measured figure's error, as the per-source held-out MAPE
            errors = [r.with_predicted_step(held_out[r.run.record_id]).abs_pct_error
                      for r in rows if r.run.record_id in held_out]
            held = float(np.mean(errors)) if errors else held
        out.append((family, len(rows), inside, held))
    return out


def format_families(report: ValidationReport, stored: dict | None) -> list[str]:
    held_out = stored["held_out_predictions"] if stored else None
    lines = ["Throughput MAPE per family (a row may be in several):",
             "  family                                   rows  in-sample  held out"]
    for family, n, inside, held in family_figures(report, held_out):
        shown = f"{held:7.1f}%" if np.isfinite(held) else "    n/a"
        lines.append(f"  {family:40s} {n:4d}  {inside:8.1f}%  {shown}")
    return lines


def format_cross_validation(stored: dict | None, why: str) -> list[str]:
    if stored is None:
        return [f"Leave-one-source-out: {why}; run `autoconfig validate --cross-validate` "
                "(refits the constants once per source, a few minutes)"]
    lines = [f"Leave-one-source-out cross-validation ({stored['fitted_constants']} fitted "
             "constants, refit without each source, then that source predicted):",
             "  source  rows  in-sample  held out"]
    for source in sorted(stored["held_out_pct"]):
        lines.append(f"  {source:6s} {stored['rows'][source]:5d}  {stored['in_sample_pct'][source]:8.1f}%"
                     f"  {stored['held_out_pct'][source]:7.1f}%")
    lines.append(f"  overall {sum(stored['rows'].values()):4d}  {stored['in_sample_overall_pct']:8.1f}%"
                 f"  {stored['held_out_overall_pct']:7.1f}%")
    lines.append(f"  within-group Spearman (weighted), held out: "
                 f"{stored['held_out_spearman_weighted']:.2f}")
    return lines


def format_targets(rows) -> list[str]:
    lines = ["Targets:"]
    for name, value, target, met in rows:
        shown = "n/a" if not np.isfinite(value) else _shown(value, target, met)
        lines.append(f"  {'met   ' if met else 'MISSED'}  {name}: {shown} (target {target})")
    return lines


def _shown(value: float, target: Target, met: bool) -> str:
    """``value`` with as many decimals as it takes for the printed figure to sit on
    the side of ``target`` that ``met`` says: 0.7996 against ">= 0.8" prints 0.7996,
    not a missed 0.80."""
    digits = 1 if target.percent else 2
    while digits < 6 and target.met(round(value, digits)) != met:
        digits += 1
    return f"{value:.{digits}f}" + ("%" if target.percent else "")


def _plan_text(run: Run) -> str:
    precision = run.workload.precision
    return plan_label(run.plan) + ("" if precision == "bf16" else f" {precision}")


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
    big = ranking_groups(report.groups)
    if big:
        lines.append(f"  mean rho over {len(big)} groups of 3 or more rows "
                     f"(weighted by size): {weighted_spearman(report.groups):.2f}")
    lines.append("")
    if not report.memory:
        lines.append("Memory: no usable rows with measured memory")
    else:
        if show_rows:
            table = [(m.run.record_id, m.run.source_id, _plan_text(m.run), m.run.memory_recipe,
                      m.run.memory_kind, m.run.memory_stage,
                      "OOM" if m.oom else f"{m.measured_bytes / m.unit_bytes:.1f}",
                      f"{m.predicted_bytes / m.unit_bytes:.1f}",
                      ("ok" if m.predicted_oom else "MISSED") if m.oom
                      else f"{m.abs_pct_error:.1f}") for m in report.memory]
            lines.append(tabulate(table, headers=("record", "source", "plan", "recipe", "kind",
                                                  "stage", "measured", "predicted",
                                                  "abs % err")))
            lines.append("(allocated: torch max allocated, GB = 1e9 B; device: nvidia-smi, GiB)")
        lines.append("Memory MAPE per source:")
        for source, (mape, n) in report.memory_mape_by_source().items():
            lines.append(f"  MAPE {source}: {mape:.1f}% over {n} rows")
        n = sum(1 for m in report.memory if not m.oom)
        lines.append(f"  MAPE overall: {report.memory_mape:.1f}% over {n} rows")
        ooms = [m for m in report.memory if m.oom]
        if ooms:
            lines.append(f"  OOM rows predicted not to fit: {sum(m.predicted_oom for m in ooms)}"
                         f"/{len(ooms)}")
    lines.append("")
    reasons: dict[str, int] = {}
    for run in report.skipped:
        reasons[run.skip_reason] = reasons.get(run.skip_reason, 0) + 1
    lines.append(f"Rows not used ({len(report.skipped)}):")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:3d}  {reason}")
    return "\n".join(lines)
