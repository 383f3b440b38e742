"""A profiling sweep: select plans from a ranked search, build one ProfileSpec
per plan (on ``--device cpu`` a scaled-down proxy of the model), launch them,
store every outcome as it arrives and write the report.

It knows nothing of how the search ranked the plans: it takes RankedPlans,
best predicted first.
"""

import dataclasses
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import click
import numpy as np
import pandas as pd

from autoconfig.errors import InputError, ProfilingError
from autoconfig.core.plan import PLAN_FIELDS, Plan, PlanTable, plan_label
from autoconfig.profiling import executors, launch, store
from autoconfig.profiling.launch import LaunchOptions
from autoconfig.profiling.report import CPU_NOTE, write_report
from autoconfig.profiling.select import DEFAULT_TOP_K, select_plans

PROFILE_SUBDIR = store.PROFILE_SUBDIR
CALIBRATION_FILE = "calibration.yaml"
"""Written beside the results by a round-based run: the constants it ended with."""
WORKER_MODULES = {"torch": "torch", "megatron.core": "megatron-core"}
"""What the profiling worker imports (module -> distribution), on every device."""
INSTALL_HINT = ("pip install 'autoconfig[profile]' (CPU only: pip install torch==2.13.0 "
                "megatron-core==0.16.1)")


SWEEP_FLAGS = ("profile", "top_k", "max_steps", "warmup_steps", "dry_run", "resume",
               "profile_objective", "retry", "max_runs", "tolerance")
LAUNCH_FLAGS = ("device", "executor", "max_minutes", "max_parallel", "time_limit")


@dataclass(frozen=True)
class ProfileOptions:
    """The ``--profile`` flags: what to profile, and ``launch``: where and how."""

    profile: bool = False
    launch: LaunchOptions = field(default_factory=lambda: LaunchOptions(device="cuda"))
    """Executor, device, time limit, parallelism and the executor's own options;
    ranks per node and nodes are taken from the cluster at run time."""
    top_k: int = DEFAULT_TOP_K
    max_steps: int = 3
    warmup_steps: int = 2
    dry_run: bool = False
    resume: str | None = None
    profile_objective: str = "throughput"
    retry: tuple[str, ...] = ()
    """Final statuses to run again (``store.RETRY_CHOICES``; ``failed``: all but ok)."""
    max_runs: int | None = None
    """Profile in rounds (``rounds``) with at most this many runs; None: one round of top_k."""
    tolerance: float = 0.02
    """Rounds stop when the measured best is within this fraction of every unmeasured
    plan's calibrated prediction."""

    def __post_init__(self) -> None:
        for name in ("top_k", "max_steps"):
            if getattr(self, name) < 1:
                raise InputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.warmup_steps < 0:
            raise InputError(f"invalid --warmup-steps {self.warmup_steps}: must be >= 0")
        if self.max_runs is not None and self.max_runs < 1:
            raise InputError(f"invalid --max-runs {self.max_runs}: must be >= 1")
        if not (0.0 <= self.tolerance < 1.0):
            raise InputError(f"invalid --tolerance {self.tolerance}: must be from 0 to below 1 "
                             "(a fraction: 0.02 is 2%)")
        retry = tuple(self.retry or ())
        object.__setattr__(self, "retry", retry)
        for value in retry:
            if value not in store.RETRY_CHOICES:
                raise InputError(f"invalid --retry {str(value)[:40]!r}: allowed are "
                                 f"{', '.join(store.RETRY_CHOICES)}")

    @classmethod
    def from_flags(cls, **flags) -> "ProfileOptions":
        """From flat flag values (the CLI's, a sweep file's): the sweep's own
        (SWEEP_FLAGS), the shared launch options (LAUNCH_FLAGS) and the chosen
        executor's (its ``Options.FLAGS``; other executors' are ignored)."""
        sweep = {k: flags.pop(k) for k in SWEEP_FLAGS if k in flags}
        shared = {k: flags.pop(k) for k in LAUNCH_FLAGS if k in flags}
        for name in ("max_minutes", "max_parallel", "time_limit"):
            if shared.get(name) is not None and shared[name] < 1:
                unit = " minute" if name == "time_limit" else ""
                raise InputError(f"invalid --{name.replace('_', '-')} {shared[name]}: "
                                 f"must be >= 1{unit}")
        executor = executors.get(shared.get("executor") or "local")
        known = {f for name in executors.names() for f in executors.get(name).Options.FLAGS}
        unknown = set(flags) - known
        if unknown:
            raise InputError(f"unknown profiling option(s) {', '.join(sorted(unknown))}")
        backend = executor.Options.from_flags(**{k: v for k, v in flags.items()
                                                 if v is not None and k in executor.Options.FLAGS})
        launch = LaunchOptions(executor=executor.name, device=shared.get("device") or "cuda",
                               time_limit_min=shared.get("time_limit") or shared.get("max_minutes")
                               or 10, max_parallel=shared.get("max_parallel") or 4,
                               backend=backend)
        return cls(launch=launch, **{k: v for k, v in sweep.items() if v is not None or
                                     k == "resume"})

    @property
    def device(self) -> str:
        return self.launch.device

    @property
    def executor(self) -> str:
        return self.launch.executor


@dataclass(frozen=True)
class RankedPlan:
    """One candidate, best predicted first in the list given to run_profiling."""

    plan: Plan
    predicted_step_time_s: float | None = None
    predicted_tokens_per_s_per_gpu: float | None = None
    predicted_memory_gib: float | None = None


def ranked_from_search(result) -> list[RankedPlan]:
    """RankedPlans from a search result: ``.plans`` (PlanTable, best first) and
    ``.table`` (one row per plan with step_time_s, tokens_per_s_per_gpu, memory_gib).
    Columns are read once, not row by row: a search can return tens of thousands."""
    steps, rates, memory = (result.table[name].to_numpy(dtype=float) for name in
                            ("step_time_s", "tokens_per_s_per_gpu", "memory_gib"))
    return [RankedPlan(plan=result.plans.plan(i), predicted_step_time_s=_finite(steps[i]),
                       predicted_tokens_per_s_per_gpu=_finite(rates[i]),
                       predicted_memory_gib=_finite(memory[i]))
            for i in range(len(result.plans))]


def run_profiling(ranked: Sequence[RankedPlan], model, workload, cluster, options: ProfileOptions,
                  out_dir: Path, echo=click.echo, software=None, stack: str | None = None,
                  plots: bool = True) -> Path | None:
    """Select, launch, store and report. Returns the results directory (None on
    --dry-run). The caller has run ``check_options`` (before its search); bad
    input raises before anything is written. Raises ProfilingError when no
    profiled plan succeeded. ``software`` (the search's SoftwareFeatures;
    default: megatron-core's own defaults) says how MoE layers run: its token
    dispatcher and grouped GEMM (the worker records what actually ran). ``plots``:
    False (--no-plots) writes no PNG and never loads matplotlib."""
    if not options.profile:
        return None
    ranked = list(ranked)
    if not ranked:
        raise InputError("nothing to profile: the search found no plan")
    selected = select_plans([r.plan for r in ranked], options.top_k)
    lopts = dataclasses.replace(options.launch, gpus_per_node=cluster.gpus_per_node,
                                nodes=cluster.nodes)
    specs = [_spec(model, workload, plan, options, software,
                   cluster.nvlink_domain_gpus) for plan in selected]
    results_dir = Path(options.resume) if options.resume else Path(out_dir) / PROFILE_SUBDIR
    check_resume(options)
    items = _job_items(specs)
    if options.dry_run:
        executor = executors.create(lopts)
        executor.check_capacity(selected)
        executor.dry_run(items, results_dir / "jobs", echo, plan_label)
        return None
    with store.lock(results_dir):
        warning = store.check_store(results_dir)
        if warning:
            echo(warning, err=True)
        pending = set(store.pending_plans(results_dir, selected, options.retry))
        todo = [item for item in items if item.plan in pending]
        skipped = len(items) - len(todo)
        meta = _meta(model, workload, cluster, options, specs, software, stack)
        table = _plans_table(ranked, selected, results_dir)

        def submitted() -> None:
            store.write_plans(results_dir, table, meta)
            if options.device == "cpu":
                echo(f"note: {CPU_NOTE}", err=True)
            if skipped:
                echo(f"resume: {skipped} plan(s) already have a final record in {results_dir}; "
                     f"running {len(todo)}"
                     + ("" if todo or options.retry else
                        " (--retry failed|oom|error|timeout|cancelled runs failed plans again)"),
                     err=True)

        if options.max_runs:
            selected = _in_rounds(ranked, (model, workload, cluster, software), options, lopts,
                                  results_dir, meta, echo)
        else:
            launch.launch(todo, lopts, results_dir, on_submitted=submitted)
        csv_path, md_path, report = write_report(results_dir, options.profile_objective,
                                                 plots=plots)
    echo(md_path.read_text())
    echo(f"profiling results: {results_dir} (report: {md_path.name}, {csv_path.name}; "
         f"rebuild with `autoconfig report {results_dir}`)")
    _check_any_succeeded(report, selected, options, results_dir)
    return results_dir


def _in_rounds(ranked, setting, options: ProfileOptions, lopts, results_dir: Path, meta: dict,
               echo) -> list[Plan]:
    """Profile in rounds (``rounds``) until the best is proven or --max-runs is
    spent; the plans profiled. The calibration the last round ranked with is
    written beside the results (GPU measurements only)."""
    from autoconfig.profiling import calibrate, rounds
    from autoconfig.training.stack import SoftwareFeatures

    model, workload, cluster, software = setting
    setting = (model, workload, cluster, software or SoftwareFeatures())
    unique: dict = {}
    for r in ranked:
        unique.setdefault(r.plan, r)
    ranked = list(unique.values())
    candidates = [r.plan for r in ranked]
    grid = PlanTable.from_plans(candidates)
    # the search's own predictions rank the first round (and every round on CPU)
    searched = np.array([np.nan if r.predicted_step_time_s is None else r.predicted_step_time_s
                         for r in ranked])
    cpu = options.device == "cpu"
    number = sum(1 for r in rounds.load_rounds(results_dir) if r.get("planned"))
    profiled: list[Plan] = []
    while True:
        st = rounds.state(results_dir, candidates)
        fitted = None
        if st.measured_s and not cpu:
            fitted = calibrate.calibrate(calibrate.measured_runs([results_dir]))
        predicted = (rounds.predictions(setting, grid, fitted.constants())
                     if fitted is not None else searched)
        budget_left = options.max_runs - len(st.finals)
        planned = rounds.unfinished_round(results_dir, st)[:max(budget_left, 0)]
        if not planned:
            # "proven" only once a round chosen by calibrated predictions was measured
            reason = rounds.stop_reason(candidates, predicted, st, budget_left,
                                        options.tolerance, fitted is not None and number >= 2)
            if reason:
                rounds.append_round(results_dir, rounds.summary(
                    number, [], st, fitted, predicted, candidates, reason))
                if fitted is not None:
                    calibrate.write_calibration(results_dir / CALIBRATION_FILE, fitted)
                echo(f"[profile] stopped after {len(st.finals)} run(s): {reason}", err=True)
                return profiled or list(st.finals)
            number += 1
            planned = rounds.next_plans(candidates, predicted, st,
                                        min(options.top_k, budget_left), first=number == 1)
            rounds.append_round(results_dir, rounds.summary(number, planned, st, fitted,
                                                            predicted, candidates))
        profiled += planned
        best = min(st.measured_s.items(), key=lambda kv: kv[1]) if st.measured_s else None
        echo(f"[profile] round {number}: {len(planned)} plan(s), {len(st.finals)} of "
             f"{options.max_runs} runs used"
             + (f", best measured {plan_label(best[0])} {best[1]:.4g} s" if best else ""),
             err=True)
        table = _plans_table(ranked, list(dict.fromkeys(profiled)), results_dir)
        specs = [_spec(model, workload, plan, options, software,
                       cluster.nvlink_domain_gpus) for plan in planned]
        meta = {**meta, "run_shapes": {**meta.get("run_shapes", {}), **_meta_shapes(specs)}
                if cpu else {}}
        launch.launch(_job_items(specs), lopts, results_dir,
                      on_submitted=lambda: store.write_plans(results_dir, table, meta))


def check_options(options: ProfileOptions) -> None:
    """Up-front checks of the machine, before the search and before anything is
    launched: the executor can run jobs on this device here, and this Python
    can import what the profiling worker needs (found without importing it,
    so the CLI stays light). Flag values are checked when the options are built."""
    check_worker(options.launch, options.dry_run)
    check_resume(options)


def check_resume(options: ProfileOptions) -> None:
    """--resume names the results folder of an earlier --profile run."""
    if options.resume and not (Path(options.resume) / store.PLANS_FILE).exists():
        raise InputError(f"invalid --resume {options.resume}: no {store.PLANS_FILE} there "
                         "(give the results directory of an earlier --profile run)")


def check_worker(launch_options: launch.LaunchOptions, dry_run: bool) -> None:
    """The executor can run jobs on the device here and, unless nothing is to run,
    this Python can import the worker's modules (training and inference alike)."""
    executor = executors.get(launch_options.executor)
    executor.check_environment(launch_options)
    if dry_run or not executor.needs_worker:
        return
    missing = [dist for module, dist in WORKER_MODULES.items() if not _importable(module)]
    if missing:
        raise InputError(f"--profile needs {' and '.join(missing)}, which this Python "
                         f"({sys.executable}) cannot import: {INSTALL_HINT}")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):   # a parent package missing or broken
        return False


def _check_any_succeeded(report: pd.DataFrame, selected, options: ProfileOptions,
                         results_dir: Path) -> None:
    """ProfilingError (one line, naming the cause) when no selected plan ran ok."""
    rows = report[report["status"].astype(str) != "not run"] if len(report) else report
    if len(rows) == 0 or (rows["status"] == "ok").any():
        return
    counts = rows["status"].value_counts()
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    errors = [str(e) for e in rows["error"].fillna("") if str(e).strip()]
    cause = _last_line(errors[0]) if errors else "no error recorded"
    text = "\n".join(errors)
    if any(f"No module named '{m.split('.')[0]}" in text for m in WORKER_MODULES) or \
            "megatron" in text and "No module named" in text:
        hint = f"install the worker's dependencies where the jobs run: {INSTALL_HINT}"
    elif (counts.index == "oom").all():
        hint = "every plan ran out of memory: search with --recompute full --mbs 1 or more TP/PP"
    elif (counts.index == "timeout").all():
        hint = ("raise --max-minutes (or lower --max-steps/--warmup-steps) and run again with "
                "--retry timeout")
    elif options.device == "cuda":
        hint = f"read {results_dir / store.RESULTS_FILE}, or try --device cpu"
    else:
        hint = f"read {results_dir / store.RESULTS_FILE}"
    raise ProfilingError(f"no profiled plan succeeded ({summary}): {cause}; {hint}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _spec(model, workload, plan: Plan, options: ProfileOptions, software=None,
          domain_gpus: int = 8):
    from autoconfig.profiling.spec import ProfileSpec
    from autoconfig.training.context_parallel import a2a_group_size
    from autoconfig.training.stack import SoftwareFeatures

    software = software or SoftwareFeatures()
    run_model, run_workload = model, workload
    if options.device == "cpu":
        from autoconfig.profiling.proxy import cpu_proxy

        run_model, run_workload = cpu_proxy(model, plan, workload)
    # The all-to-all group as the prediction sized it (the full model's heads).
    a2a = int(a2a_group_size(software.cp_comm_type, model, plan.tp, plan.cp, domain_gpus))
    return ProfileSpec(model=run_model, workload=run_workload, plan=plan, device=options.device,
                       warmup_steps=options.warmup_steps, timed_steps=options.max_steps,
                       moe_dispatcher=software.moe_dispatcher,
                       moe_grouped_gemm=software.moe_grouped_gemm,
                       cp_comm_type=software.cp_comm_type, cp_a2a_size=a2a)


def _plans_table(ranked: Sequence[RankedPlan], selected: Sequence[Plan], results_dir: Path
                 ) -> pd.DataFrame:
    previously = store.load_plans(results_dir)
    was_selected = set()
    if "selected" in previously:
        for row in previously.to_dict("records"):
            if str(row.get("selected")).lower() == "true":
                was_selected.add(store.plan_from_record(row))
    chosen = set(selected) | was_selected
    rows = []
    for i, r in enumerate(ranked):
        row = {name: getattr(r.plan, name) for name in PLAN_FIELDS}
        row.update(predicted_rank=i + 1, predicted_step_time_s=r.predicted_step_time_s,
                   predicted_tokens_per_s_per_gpu=r.predicted_tokens_per_s_per_gpu,
                   predicted_memory_gib=r.predicted_memory_gib, selected=r.plan in chosen)
        rows.append(row)
    return pd.DataFrame(rows)


def _meta(model, workload, cluster, options, specs, software=None, stack=None) -> dict:
    return {
        # what ``autoconfig calibrate`` needs to predict each measured plan again
        "stack": stack, "software": dataclasses.asdict(software) if software else None,
        "model_name": model.name, "model": dataclasses.asdict(model),
        "workload": dataclasses.asdict(workload),
        "cluster": {"gpu": cluster.gpu.name, "nodes": cluster.nodes,
                    "gpus_per_node": cluster.gpus_per_node},
        "device": options.device, "executor": options.executor,
        "objective": options.profile_objective, "top_k": options.top_k,
        "proxy_model_name": specs[0].model.name if options.device == "cpu" and specs else None,
        "run_shapes": _meta_shapes(specs) if options.device == "cpu" else {},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
    }


def _job_items(specs) -> list:
    """One profiling job per spec (every rank runs ``launch.profile_job``)."""
    return [launch.JobItem(plan=s.plan, world_size=s.plan.num_gpus, fn=launch.profile_job,
                           args=(s.to_json(),)) for s in specs]


def _meta_shapes(specs) -> dict:
    """Plan (JSON) -> the proxy model shape that ran it (CPU runs)."""
    return {json.dumps(s.plan.to_dict(), sort_keys=True): dataclasses.asdict(s.model)
            for s in specs}


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
