"""A profiling sweep: select plans from a ranked search, build one ProfileSpec
per plan (on ``--device cpu`` a scaled-down proxy of the model), launch them,
store every outcome as it arrives and write the report.

It knows nothing of how the search ranked the plans: it takes RankedPlans,
best predicted first.
"""

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import click
import numpy as np
import pandas as pd

from autoconfig.errors import InputError
from autoconfig.core.plan import PLAN_FIELDS, Plan, plan_label
from autoconfig.profiling import launch, store
from autoconfig.profiling.report import CPU_NOTE, write_report
from autoconfig.profiling.select import DEFAULT_TOP_K, select_plans

PROFILE_SUBDIR = "profile"


@dataclass(frozen=True)
class ProfileOptions:
    profile: bool = False
    device: str = "cuda"
    executor: str = "local"
    top_k: int = DEFAULT_TOP_K
    max_steps: int = 3
    warmup_steps: int = 2
    max_minutes: int = 10
    max_parallel: int = 4
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: int | None = None
    slurm_extra: tuple[str, ...] = ()
    dry_run: bool = False
    resume: str | None = None
    profile_objective: str = "throughput"


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
                  out_dir: Path, echo=click.echo) -> Path | None:
    """Select, launch, store and report. Returns the results directory (None on
    --dry-run). Bad input raises before anything is written."""
    if not options.profile:
        return None
    check_options(options)
    ranked = list(ranked)
    if not ranked:
        raise InputError("nothing to profile: the search found no plan")
    selected = select_plans([r.plan for r in ranked], options.top_k)
    lopts = launch.LaunchOptions(
        executor=options.executor, device=options.device, gpus_per_node=cluster.gpus_per_node,
        nodes=cluster.nodes, time_limit_min=options.time_limit or options.max_minutes,
        max_parallel=options.max_parallel, partition=options.partition, account=options.account,
        qos=options.qos, slurm_extra=launch.parse_slurm_extra(options.slurm_extra))
    launch.check_capacity(selected, lopts)
    specs = [_spec(model, workload, plan, options) for plan in selected]
    results_dir = Path(options.resume) if options.resume else Path(out_dir) / PROFILE_SUBDIR
    if options.resume and not (results_dir / store.PLANS_FILE).exists():
        raise InputError(f"invalid --resume {options.resume}: no {store.PLANS_FILE} there "
                         "(give the results directory of an earlier --profile run)")
    items = [launch.JobItem(plan=s.plan, world_size=s.plan.num_gpus, fn=launch.profile_job,
                            args=(s.to_json(),)) for s in specs]
    if options.dry_run:
        _print_dry_run(items, lopts, results_dir / "jobs", echo)
        return None
    pending = set(store.pending_plans(results_dir, selected))
    todo = [item for item in items if item.plan in pending]
    skipped = len(items) - len(todo)
    if lopts.executor == "slurm" and todo:
        launch.preflight_slurm(lopts)
    if options.device == "cpu":
        echo(f"note: {CPU_NOTE}", err=True)
    if skipped:
        echo(f"resume: {skipped} plan(s) already have a final record in {results_dir}; "
             f"running {len(todo)}", err=True)
    meta = _meta(model, workload, cluster, options, specs)
    table = _plans_table(ranked, selected, results_dir)
    launch.launch(todo, lopts, results_dir,
                  on_submitted=lambda: store.write_plans(results_dir, table, meta))
    if not (results_dir / store.PLANS_FILE).exists():
        store.write_plans(results_dir, table, meta)
    csv_path, md_path, _ = write_report(results_dir, options.profile_objective)
    echo(md_path.read_text())
    echo(f"profiling results: {results_dir} (report: {md_path.name}, {csv_path.name}; "
         f"rebuild with `autoconfig report {results_dir}`)")
    return results_dir


def check_options(options: ProfileOptions) -> None:
    for name in ("top_k", "max_steps", "max_minutes", "max_parallel"):
        if getattr(options, name) < 1:
            raise InputError(f"invalid --{name.replace('_', '-')} {getattr(options, name)}: must be >= 1")
    if options.warmup_steps < 0:
        raise InputError(f"invalid --warmup-steps {options.warmup_steps}: must be >= 0")
    if options.time_limit is not None and options.time_limit < 1:
        raise InputError(f"invalid --time-limit {options.time_limit}: must be >= 1 minute")
    if options.device == "cuda" and options.executor == "local" and not local_gpu_visible():
        raise InputError("invalid --device cuda: no NVIDIA GPU is visible on this machine for "
                         "the local executor; use --device cpu, or --executor slurm")


def local_gpu_visible() -> bool:
    """An NVIDIA driver device node exists and CUDA_VISIBLE_DEVICES does not hide
    every GPU. Checked without importing torch, so the CLI stays light."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or any(Path("/dev").glob("nvidia[0-9]*"))


def _spec(model, workload, plan: Plan, options: ProfileOptions):
    from autoconfig.profiling.spec import ProfileSpec

    run_model, run_workload = model, workload
    if options.device == "cpu":
        from autoconfig.profiling.proxy import cpu_proxy

        run_model, run_workload = cpu_proxy(model, plan, workload)
    return ProfileSpec(model=run_model, workload=run_workload, plan=plan, device=options.device,
                       warmup_steps=options.warmup_steps, timed_steps=options.max_steps)


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


def _meta(model, workload, cluster, options, specs) -> dict:
    return {
        "model_name": model.name, "model": dataclasses.asdict(model),
        "workload": dataclasses.asdict(workload),
        "cluster": {"gpu": cluster.gpu.name, "nodes": cluster.nodes,
                    "gpus_per_node": cluster.gpus_per_node},
        "device": options.device, "executor": options.executor,
        "objective": options.profile_objective, "top_k": options.top_k,
        "proxy_model_name": specs[0].model.name if options.device == "cpu" and specs else None,
        "run_shapes": {json.dumps(s.plan.to_dict(), sort_keys=True): dataclasses.asdict(s.model)
                       for s in specs} if options.device == "cpu" else {},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv,
    }


def _print_dry_run(items, lopts: launch.LaunchOptions, folder: Path, echo) -> None:
    if lopts.executor == "slurm":
        scripts = launch.render_sbatch(items, lopts, folder)
        for script, group in zip(scripts, launch.group_by_shape(items).values()):
            echo(script)
            for index, item in enumerate(group):
                echo(f"# {'array task ' + str(index) if len(group) > 1 else 'job'}: "
                     f"{plan_label(item.plan)} ({item.world_size} ranks)")
            echo("")
        echo(f"# dry run: {len(items)} job(s) in the script(s) above; nothing submitted")
        return
    for item in items:
        echo(f"# local: plan {item.plan.to_dict()}: {item.world_size} process(es) through "
             f"submitit's LocalExecutor (tasks_per_node={item.world_size}, "
             f"timeout {lopts.time_limit_min} min) running "
             f"autoconfig.profiling.launch.profile_job")
    echo(f"# dry run: {len(items)} local job(s); nothing started")


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
