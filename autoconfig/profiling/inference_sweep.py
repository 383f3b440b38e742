"""Prove an inference search by measurement: run megatron-core's static inference
for a few predicted layouts through the training profiler's launcher and results
store, then rank them by measured latency.

Jobs go through ``autoconfig.profiling.launch.launch`` (submitit, local or
SLURM) into ``<out>/profile/results.jsonl`` (``autoconfig.profiling.store``),
keyed by the training Plan of one replica (``InferenceProfileSpec.launch_plan``:
tp, pp, dp 1, micro-batch = the request batch). On ``--device cpu`` each plan
runs on the CPU proxy of the training profiler (``autoconfig.profiling.proxy``)
with the request batch capped at ``CPU_MAX_BATCH`` and the input and output
lengths scaled into the proxy's sequence; CPU figures describe the proxy, not
a GPU.
"""

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tabulate import tabulate

from autoconfig.atomic import write_atomic
from autoconfig.core.plan import Workload
from autoconfig.errors import InputError
from autoconfig.inference.plan import InferencePlan, InferenceWorkload
from autoconfig.inference.search import InferenceSearchResult
from autoconfig.profiling.inference_worker import InferenceProfileSpec, inference_job
from autoconfig.profiling import executors, launch, store

PROFILE_SUBDIR = "profile"
REPORT_CSV = "infer_profile.csv"
REPORT_MD = "infer_profile.md"
CPU_MAX_BATCH = 8
"""Largest request batch run on the CPU proxy (2 cores: seconds, not minutes)."""
CPU_MAX_RANKS = 4
"""Largest replica (tp * pp) run on the CPU proxy."""


@dataclass(frozen=True)
class InferProfileOptions:
    device: str = "cuda"
    executor: str = "local"
    top_k: int = 3
    max_minutes: int = 10
    max_parallel: int = 1
    partition: str | None = None
    account: str | None = None
    dry_run: bool = False
    retry: tuple[str, ...] = ()
    """Final statuses to run again (``store.RETRY_CHOICES``)."""

    def __post_init__(self) -> None:
        for name in ("top_k", "max_minutes", "max_parallel"):
            if getattr(self, name) < 1:
                raise InputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)}: "
                                 "must be >= 1")


def check(options: InferProfileOptions) -> None:
    """The up-front checks of training profiling (executor, device, worker imports);
    the replay executor answers training jobs from a measurements file, which
    serving jobs have no counterpart of."""
    if options.executor == "replay":
        from autoconfig.profiling import executors
        allowed = ", ".join(n for n in executors.names() if n != "replay")
        raise InputError("invalid --executor replay for infer --profile: it replays "
                         "training measurements (search --profile --measurements); allowed "
                         f"here: {allowed}")
    from autoconfig.profiling.sweep import check_worker
    check_worker(launch.LaunchOptions(executor=options.executor, device=options.device),
                 options.dry_run)


def select(result: InferenceSearchResult, top_k: int, max_ranks: int | None) -> pd.DataFrame:
    """The predicted best row, then the best rows whose TP and PP sizes are both new,
    then whose TP or PP size is new, then a new (tp, pp) pair, until top_k."""
    table = result.table
    if max_ranks is not None:
        table = table[table["gpus_per_replica"] <= max_ranks]
    if table.empty:
        raise InputError(f"nothing to profile: no kept layout has at most {max_ranks} ranks "
                         "per replica (the CPU proxy's limit)")
    chosen = []
    rows = list(table.itertuples())
    passes = (lambda r, tps, pps, pairs: r.tp not in tps and r.pp not in pps,
              lambda r, tps, pps, pairs: r.tp not in tps or r.pp not in pps,
              lambda r, tps, pps, pairs: (r.tp, r.pp) not in pairs)
    for is_new in passes:
        for r in rows:
            if len(chosen) == top_k:
                break
            picked = table.loc[chosen]
            if r.Index not in chosen and (not chosen or is_new(
                    r, set(picked.tp), set(picked.pp), set(zip(picked.tp, picked.pp)))):
                chosen.append(r.Index)
    for index in table.index:     # fewer layouts than top_k: other batches
        if len(chosen) == top_k:
            break
        if index not in chosen:
            chosen.append(index)
    return table.loc[chosen]


def _spec(result: InferenceSearchResult, row, device: str) -> InferenceProfileSpec:
    plan = InferencePlan(int(row.tp), int(row.pp), int(row.batch), 1, int(getattr(row, "ep", 1)))
    model, workload = result.model, result.workload
    microbatches = int(row.prefill_microbatches)
    if device == "cpu":
        from autoconfig.profiling.proxy import PROXY_MAX_SEQ, cpu_proxy

        batch = min(plan.batch, CPU_MAX_BATCH)
        plan = dataclasses.replace(plan, batch=batch)
        total = workload.total_len_tokens
        scale = min(1.0, PROXY_MAX_SEQ / total)
        s_in = max(1, int(workload.input_len_tokens * scale))
        s_out = max(2, min(PROXY_MAX_SEQ - s_in, int(round(workload.output_len_tokens * scale))))
        workload = InferenceWorkload(s_in, s_out, "bf16")
        model, _ = cpu_proxy(model, InferenceProfileSpec(model, workload, plan, device)
                             .launch_plan(), Workload(batch, s_in + s_out))
        model = dataclasses.replace(model, seq_len=s_in + s_out)
        microbatches = min(microbatches, batch)
    return InferenceProfileSpec(model=model, workload=workload, plan=plan, device=device,
                                prefill_microbatches=microbatches)


def run(result: InferenceSearchResult, options: InferProfileOptions, out_dir: Path,
        echo=print) -> pd.DataFrame | None:
    """Select, launch, store; returns predicted beside measured, best measured first."""
    cpu = options.device == "cpu"
    chosen = select(result, options.top_k, CPU_MAX_RANKS if cpu else None)
    specs = [_spec(result, row, options.device) for row in chosen.itertuples(index=False)]
    cluster = result.cluster
    lopts = launch.LaunchOptions(
        executor=options.executor, device=options.device,
        gpus_per_node=CPU_MAX_RANKS if cpu and options.executor == "local"
        else cluster.gpus_per_node, nodes=cluster.nodes, time_limit_min=options.max_minutes,
        max_parallel=options.max_parallel, job_name="autoconfig-infer",
        backend=_backend_options(options))
    items = [launch.JobItem(plan=s.launch_plan(), world_size=s.world_size, fn=inference_job,
                            args=(s.to_json(),)) for s in specs]
    results_dir = Path(out_dir) / PROFILE_SUBDIR
    if options.dry_run:
        for script in executors.create(lopts).scripts(items, results_dir / "jobs"):
            echo(script)
        for spec in specs:
            echo(f"# {options.executor}: {spec.plan.label()} on {spec.world_size} rank(s), "
                 f"model {spec.model.name}, input {spec.workload.input_len_tokens}, "
                 f"output {spec.workload.output_len_tokens}")
        echo(f"# dry run: {len(specs)} job(s); nothing started")
        return None
    if cpu:
        echo("note: --device cpu runs a scaled-down proxy of the model on CPU: its times rank "
             "layouts on this machine and are not GPU figures")
    meta = {"kind": "inference", "model_name": result.model.name,
            "cluster": {"gpu": cluster.gpu.name, "nodes": cluster.nodes,
                        "gpus_per_node": cluster.gpus_per_node},
            "device": options.device, "executor": options.executor,
            "run_shapes": [json.loads(s.to_json()) for s in specs],
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": sys.argv}
    plans_table = chosen.assign(**{k: [getattr(s.launch_plan(), k) for s in specs]
                                   for k in ("dp", "cp", "vp", "sp", "mbs", "recompute",
                                             "recompute_method", "recompute_num_layers",
                                             "distributed_optimizer")})
    # Like training sweeps: one sweep per results directory at a time, and a re-run
    # (after an interruption or a crash) runs only the layouts without a final record.
    with store.lock(results_dir):
        warning = store.check_store(results_dir)
        if warning:
            echo(warning)   # the CLI's echo writes to stderr
        pending = set(store.pending_plans(results_dir, [item.plan for item in items],
                                          options.retry))
        todo = [item for item in items if item.plan in pending]

        def submitted() -> None:
            store.write_plans(results_dir, plans_table, meta)
            if len(todo) < len(items):
                echo(f"resume: {len(items) - len(todo)} layout(s) already have a final record "
                     f"in {results_dir}; running {len(todo)}")

        launch.launch(todo, lopts, results_dir, on_submitted=submitted)
        records = store.latest_records(results_dir)
    table = combine(chosen, specs, records)
    write_atomic(results_dir / REPORT_CSV, table.to_csv(index=False, float_format="%.6g",
                                                        lineterminator="\n"))
    write_atomic(results_dir / REPORT_MD, render(table, options.device) + "\n")
    return table


def _backend_options(options: InferProfileOptions):
    """The chosen executor's own options from the flags it takes (--partition, --account)."""
    executor = executors.get(options.executor)
    flags = {"partition": options.partition, "account": options.account}
    return executor.Options.from_flags(**{k: v for k, v in flags.items()
                                          if v is not None and k in executor.Options.FLAGS})


def combine(chosen: pd.DataFrame, specs, records: list[dict]) -> pd.DataFrame:
    """Predicted beside measured, ranked by measured latency (failures last)."""
    by_key = {(r["tp"], r["pp"], r["mbs"]): r for r in records}
    rows = []
    for (_, pred), spec in zip(chosen.iterrows(), specs):
        record = by_key.get((spec.plan.tp, spec.plan.pp, spec.plan.batch), {})
        rows.append({"tp": spec.plan.tp, "pp": spec.plan.pp, "batch": int(pred.batch),
                     "run_batch": spec.plan.batch, "run_model": spec.model.name,
                     "predicted_ttft_ms": pred.ttft_ms, "predicted_tpot_ms": pred.tpot_ms,
                     "predicted_latency_ms": pred.latency_ms,
                     "status": record.get("status", "missing"),
                     "measured_ttft_ms": record.get("measured_ttft_ms"),
                     "measured_tpot_ms": record.get("measured_tpot_ms"),
                     "measured_latency_ms": record.get("measured_latency_ms"),
                     "error": (record.get("error") or "").splitlines()[-1:] or [""]})
        rows[-1]["error"] = rows[-1]["error"][0]
    table = pd.DataFrame(rows)
    table["measured_rank"] = table["measured_latency_ms"].astype(float).rank(method="first")
    table = table.sort_values(["measured_rank"], na_position="last").reset_index(drop=True)
    table["predicted_rank"] = table["predicted_latency_ms"].rank(method="first").astype(int)
    return table


WORKER_ENGINE = "megatron-core's static inference path, run eagerly by the profiling worker"
"""What the inference worker measures, whatever engine the predictions are for."""
WORKER_ENGINE_NAME = "megatron-core-static"
"""The engine file that describes what the worker runs (heuristics/engines/)."""


def render(table: pd.DataFrame, device: str, engine: str = "") -> str:
    def fmt(value, digits=4):
        return "" if value is None or (isinstance(value, float) and np.isnan(value)) \
            else f"{value:.{digits}g}"

    rows = [(i + 1, r.tp, r.pp, r.batch, r.run_batch, r.status, fmt(r.measured_ttft_ms),
             fmt(r.predicted_ttft_ms), fmt(r.measured_tpot_ms), fmt(r.predicted_tpot_ms),
             fmt(r.measured_latency_ms), fmt(r.predicted_latency_ms), r.predicted_rank,
             r.error[:60]) for i, r in enumerate(table.itertuples(index=False))]
    note = (" (CPU proxy: measured times are the scaled-down model on this CPU, predictions "
            "are for the real model on the GPU)" if device == "cpu" else
            f" (measured and predicted: {WORKER_ENGINE})" if engine == WORKER_ENGINE_NAME else
            f" (measured: {WORKER_ENGINE}; predicted: the {engine} engine, so compare "
            f"the order more than the times; --engine {WORKER_ENGINE_NAME} predicts what the "
            "worker runs: benchmarks/gpu/README.md)" if engine else "")
    return "\n".join([f"Profiled layouts ranked by measured latency{note}:", "",
                      tabulate(rows, headers=("#", "TP", "PP", "batch", "run batch", "status",
                                              "TTFT ms", "pred", "TPOT ms", "pred",
                                              "latency ms", "pred", "pred rank", "error"),
                               tablefmt="github")])
