"""Fit the memory model's overhead constants on measured rows and print its error.

Usage:  python benchmarks/fit_memory.py [--write]

Rows: the rows of benchmarks/published_runs.csv with measured peak memory or an
OOM, turned into plans by the library (``autoconfig.validation.runs.load_runs``) and
predicted by ``autoconfig.validation.scoring.predict_memory_bytes``: the one mapping
``autoconfig validate`` also uses (precision recipe, fused attention, measured
stage, stage layer count, ZeRO-1 as the distributed optimizer).

* ``allocated`` rows (Megatron-LM CI, S17: torch ``max_memory_allocated`` on
  the last rank) check the tensor terms (weights, grads, optimizer,
  activations, logits) with no fitted constant.
* ``device`` rows (BLOOM, S10: nvidia-smi, CUDA context, NCCL buffers and the
  caching allocator included) fit device = fragmentation_factor * allocated +
  context (least squares on the relative error); OOM rows must come out above
  the usable HBM.

``--write`` stores the two fitted constants in heuristics/memory.yaml.
"""

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from autoconfig.core.catalog import get_gpu
from autoconfig.training.memory import load_constants, memory_breakdown, usable_bytes
from autoconfig.core.plan import PlanTable, Workload
from autoconfig.validation.runs import Run, load_runs
from autoconfig.validation.scoring import default_runs_path, predict_memory_bytes

ROOT = Path(__file__).resolve().parent.parent
YAML = ROOT / "heuristics" / "memory.yaml"
GIB = 2**30


def load_rows(path: Path | None = None) -> list[Run]:
    """The runs with a measured peak or an OOM (in CSV order)."""
    return [r for r in load_runs(path or default_runs_path()) if r.memory_usable]


def fit_overhead(allocated: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """Least squares of (k * allocated + c) / measured - 1 over the rows."""
    a = np.column_stack([allocated / measured, 1.0 / measured])
    (k, c), *_ = np.linalg.lstsq(a, np.ones_like(measured), rcond=None)
    return float(k), float(c)


FITTED_FRAMEWORK = "megatron-deepspeed"
"""The framework whose device-memory readings (BLOOM, nvidia-smi) the overhead is fitted on."""


def _write(k: float, c_gib: float, rows: str, summary: str) -> None:
    text = YAML.read_text()
    block = (f"  {FITTED_FRAMEWORK}:\n    fragmentation_factor:\n      value: {k:.4f}\n"
             f"      source: \"fitted on BLOOM rows {rows} of benchmarks/published_runs.csv "
             f"(nvidia-smi, S10; {summary}): python benchmarks/fit_memory.py --write\"\n"
             f"    context_gib:\n      value: {c_gib:.3f}\n"
             f"      source: \"fitted with fragmentation_factor on the same rows: CUDA context, "
             "NCCL and framework buffers\"\n")
    YAML.write_text(re.sub(rf"  {FITTED_FRAMEWORK}:\n(?:    .*\n|      .*\n)*", block, text))


def time_million_plans(n: int = 10**6) -> float:
    """Seconds memory_breakdown takes over n random GPT-3 175B plans (best of 3)."""
    import time

    from autoconfig.core.catalog import get_model
    rng = np.random.default_rng(0)
    plans = PlanTable(tp=rng.choice([1, 2, 4, 8], n), pp=rng.choice([1, 2, 4, 8], n),
                      dp=rng.choice([1, 2, 4, 8], n), cp=rng.choice([1, 2], n),
                      vp=rng.choice([1, 2, 3], n), sp=rng.random(n) < 0.5,
                      mbs=rng.choice([1, 2, 4], n),
                      recompute=rng.integers(0, 3, n).astype(np.int8),
                      recompute_method=rng.integers(0, 2, n).astype(np.int8),
                      recompute_num_layers=rng.integers(0, 4, n),
                      distributed_optimizer=rng.random(n) < 0.5,
                      first_stage_layers=np.zeros(n, dtype=np.int64),
                      last_stage_layers=np.zeros(n, dtype=np.int64))
    model, workload = get_model("gpt3", "175b"), Workload(1536, 2048)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        memory_breakdown(model, workload, plans)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fit in memory.yaml")
    parser.add_argument("--no-timing", action="store_true", help="skip the 1e6-plan timing")
    args = parser.parse_args(argv)
    base = load_constants()
    raw = replace(base, overheads={name: (1.0, 0.0) for name in base.overheads})
    rows = load_rows()
    alloc = np.array([predict_memory_bytes(r, raw)[0] for r in rows])
    device = np.array([r.memory_kind == "device" for r in rows])
    measured = np.array([r.memory_bytes or np.nan for r in rows])
    fit_rows = device & ~np.isnan(measured)
    k, c = fit_overhead(alloc[fit_rows], measured[fit_rows])
    fitted = replace(base, overheads={**base.overheads, FITTED_FRAMEWORK: (k, c)})
    capacity = usable_bytes(get_gpu("a100-80gb"), fitted)
    print(f"fitted: fragmentation_factor = {k:.4f}, context = {c / GIB:.3f} GiB "
          f"(on {fit_rows.sum()} device-memory rows); usable A100-80GB = {capacity / GIB:.2f} GiB\n")
    print(f"{'row':6} {'src':4} {'plan':28} {'recipe':16} {'measured':>9} {'predicted':>9} {'err%':>6}")
    errors: dict[str, list[float]] = {}
    oom_ok = []
    for row, a in zip(rows, alloc):
        p = row.plan
        label = f"tp{p.tp} pp{p.pp} dp{p.dp} vp{p.vp} mbs{p.mbs}"
        pred = a if row.memory_kind == "allocated" else k * a + c
        unit = 1e9 if row.memory_kind == "allocated" else GIB
        if row.memory_bytes is None:
            ok = pred > capacity
            oom_ok.append(ok)
            print(f"{row.record_id:6} {row.source_id:4} {label:28} {row.memory_recipe:16} "
                  f"{'OOM':>9} {pred / unit:9.1f} {'ok' if ok else 'MISSED':>6}")
            continue
        err = 100 * (pred - row.memory_bytes) / row.memory_bytes
        errors.setdefault(row.source_id, []).append(abs(err))
        print(f"{row.record_id:6} {row.source_id:4} {label:28} {row.memory_recipe:16} "
              f"{row.memory_bytes / unit:9.1f} {pred / unit:9.1f} {err:+6.1f}")
    print("\n(allocated rows in GB = 1e9 B of torch max allocated; device rows in GiB of nvidia-smi)")
    for source, errs in sorted(errors.items()):
        print(f"MAPE {source}: {np.mean(errs):.1f}% over {len(errs)} rows (max {max(errs):.1f}%)")
    every = [e for errs in errors.values() for e in errs]
    print(f"MAPE all: {np.mean(every):.1f}% over {len(every)} rows")
    print(f"OOM rows predicted not to fit: {sum(oom_ok)}/{len(oom_ok)}")
    if not args.no_timing:
        print(f"memory_breakdown over 1e6 plans: {time_million_plans():.2f} s")
    if args.write:
        ids = [r.record_id for r, f in zip(rows, fit_rows) if f]
        allocated_sources = sorted({r.source_id for r in rows if r.memory_kind == "allocated"})
        summary = (f"MAPE {np.mean([e for s in errors for e in errors[s] if s == 'S10']):.1f}% "
                   f"there; {', '.join(allocated_sources)} allocated rows checked without overhead")
        _write(k, c / GIB, f"{ids[0]}..{ids[-1]} ({len(ids)} rows)", summary)
        print(f"wrote {YAML}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
