"""Fit the memory model's overhead constants on measured rows and print its error.

Usage:  python benchmarks/fit_memory.py [--write]

Rows: benchmarks/memory_rows.csv (verbatim copies of the published_runs.csv rows
with measured memory or OOM and a complete model shape).

* Megatron-LM CI rows (S17): torch ``max_memory_allocated`` on the last rank, so
  they check the tensor terms (weights, grads, optimizer, activations, logits)
  with no fitted constant: predicted = last-stage allocated bytes.
* BLOOM rows (S10): nvidia-smi device memory of the first/last stage (CUDA
  context, NCCL buffers and the caching allocator included), so they fit
  total = fragmentation_factor * allocated + context (least squares on the
  relative error of the rows that fit); OOM rows must come out above the
  usable HBM.

``--write`` stores the two fitted constants in heuristics/memory.yaml.
"""

import argparse
import csv
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from autoconfig.catalog import get_gpu
from autoconfig.memory import (allocated_bytes, load_constants, memory_breakdown,
                               stage_breakdown, usable_bytes)
from autoconfig.model import ModelSpec
from autoconfig.plan import Plan, PlanTable, Workload

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "benchmarks" / "memory_rows.csv"
YAML = ROOT / "heuristics" / "memory.yaml"
GIB = 2**30
BLOOM_VOCAB = 250880  # BLOOM README: 250680 tokens padded to 250880 (S10)


@dataclass(frozen=True)
class MemoryRow:
    record_id: str
    source_id: str
    model: ModelSpec
    workload: Workload
    plan: Plan
    recipe: str
    flash_attention: bool
    stage: str
    """'worst' (max of first and last) or 'last' (CI logs only the last rank)."""
    measured_bytes: float | None
    """None for an OOM row."""


def _leading_int(text: str) -> int:
    return int(re.match(r"\s*(\d+)", text).group(1))


def _bloom_row(r: dict) -> MemoryRow:
    layers, h, heads = int(r["num_layers"]), int(r["hidden_size"]), int(r["num_heads"])
    tp, pp, dp = int(r["tp"]), int(r["pp"]), int(r["dp"])
    # From 02-28 Megatron-DeepSpeed partitioned with 'type:transformer|embedding':
    # the embedding counts as a layer on the first and last stage.
    if "type:transformer|embedding" in r["note"] or layers % pp:
        layers = pp * ((layers + 2) // pp - 1)
    model = ModelSpec(name=r["model_name"], num_layers=layers, hidden_size=h, num_heads=heads,
                      num_kv_heads=heads, ffn_hidden_size=4 * h, vocab_size=BLOOM_VOCAB,
                      seq_len=int(r["seq_len"]), position_embedding="rope",  # ALiBi: no params
                      tied_embeddings=True)
    plan = Plan(tp=tp, pp=pp, dp=dp, mbs=int(r["micro_batch_size"]), recompute="full",
                distributed_optimizer=True)  # ZeRO-1 shards fp32 states over DP
    recipe = "bf16_fp32_accum" if "BF16 optimizer" in r["precision"] else "fp16"
    measured = None if r["mem_gb_measured"] == "OOM" else float(r["mem_gb_measured"]) * GIB
    return MemoryRow(r["record_id"], "S10", model,
                     Workload(int(r["global_batch_size"]), int(r["seq_len"])), plan, recipe,
                     False, "worst", measured)


def _ci_row(r: dict) -> MemoryRow:
    tp = int(r["tp"])
    vocab = _leading_int(r["vocab_size"])
    padded = -(-vocab // (128 * tp)) * 128 * tp  # Megatron pads to a multiple of 128*TP
    model = ModelSpec(name=r["model_name"], num_layers=int(r["num_layers"]),
                      hidden_size=int(r["hidden_size"]), num_heads=int(r["num_heads"]),
                      num_kv_heads=int(r["num_kv_heads"]),
                      ffn_hidden_size=_leading_int(r["ffn_hidden_size"]), vocab_size=padded,
                      seq_len=int(r["seq_len"]), position_embedding="rope",
                      tied_embeddings=False)
    plan = Plan(tp=tp, pp=int(r["pp"]), dp=int(r["dp"]), vp=int(r["vp"] or 1),
                mbs=int(r["micro_batch_size"]), distributed_optimizer=True)
    peak_gb = float(re.search(r"peak\s+([\d.]+)", r["mem_gb_measured"]).group(1))
    return MemoryRow(r["record_id"], "S17", model,
                     Workload(int(r["global_batch_size"]), int(r["seq_len"])), plan, "bf16",
                     True, "last", peak_gb * 1e9)


def load_rows(path: Path = ROWS) -> list[MemoryRow]:
    with path.open(newline="") as handle:
        return [(_bloom_row if r["source_id"] == "S10" else _ci_row)(r)
                for r in csv.DictReader(handle)]


def predict(row: MemoryRow, constants) -> tuple[float, float]:
    """(allocated bytes, total bytes) of the row's measured stage."""
    table = PlanTable.from_plans([row.plan])
    kw = {"flash_attention": row.flash_attention, "recipe": row.recipe}
    if row.stage == "last":
        b = stage_breakdown(row.model, row.workload, table, "last", constants=constants, **kw)
    else:
        b = _worst(row, table, constants, kw)
    return float(allocated_bytes(b)[0]), float(b.total_bytes[0])


def _worst(row, table, constants, kw):
    first = stage_breakdown(row.model, row.workload, table, "first", constants=constants, **kw)
    last = stage_breakdown(row.model, row.workload, table, "last", constants=constants, **kw)
    return first if first.total_bytes[0] >= last.total_bytes[0] else last


def fit_overhead(allocated: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """Least squares of (k * allocated + c) / measured - 1 over the rows."""
    a = np.column_stack([allocated / measured, 1.0 / measured])
    (k, c), *_ = np.linalg.lstsq(a, np.ones_like(measured), rcond=None)
    return float(k), float(c)


def _write(k: float, c_gib: float, rows: str, summary: str) -> None:
    text = YAML.read_text()
    block = (f"overhead:\n  fragmentation_factor:\n    value: {k:.4f}\n"
             f"    source: \"fitted on BLOOM rows {rows} of benchmarks/memory_rows.csv "
             f"(nvidia-smi, S10; {summary}): python benchmarks/fit_memory.py --write\"\n"
             f"  context_gib:\n    value: {c_gib:.3f}\n"
             f"    source: \"fitted with fragmentation_factor on the same rows: CUDA context, "
             "NCCL and framework buffers\"\n")
    YAML.write_text(re.sub(r"overhead:\n(?:  .*\n|    .*\n)*", block, text))


def time_million_plans(n: int = 10**6) -> float:
    """Seconds memory_breakdown takes over n random GPT-3 175B plans (best of 3)."""
    import time

    from autoconfig.catalog import get_model
    rng = np.random.default_rng(0)
    plans = PlanTable(tp=rng.choice([1, 2, 4, 8], n), pp=rng.choice([1, 2, 4, 8], n),
                      dp=rng.choice([1, 2, 4, 8], n), cp=rng.choice([1, 2], n),
                      vp=rng.choice([1, 2, 3], n), sp=rng.random(n) < 0.5,
                      mbs=rng.choice([1, 2, 4], n),
                      recompute=rng.integers(0, 3, n).astype(np.int8),
                      recompute_method=rng.integers(0, 2, n).astype(np.int8),
                      recompute_num_layers=rng.integers(0, 4, n),
                      distributed_optimizer=rng.random(n) < 0.5)
    model, gpu, workload = get_model("gpt3", "175b"), get_gpu("a100-80gb"), Workload(1536, 2048)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        memory_breakdown(model, workload, plans, gpu)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the fit in memory.yaml")
    args = parser.parse_args(argv)
    raw = replace(load_constants(), fragmentation_factor=1.0, context_bytes=0.0)
    rows = load_rows()
    alloc = np.array([predict(r, raw)[0] for r in rows])
    is_ci = np.array([r.source_id == "S17" for r in rows])
    measured = np.array([r.measured_bytes or np.nan for r in rows])
    fit_rows = ~is_ci & ~np.isnan(measured)
    k, c = fit_overhead(alloc[fit_rows], measured[fit_rows])
    fitted = replace(raw, fragmentation_factor=k, context_bytes=c)
    capacity = usable_bytes(get_gpu("a100-80gb"), fitted)
    print(f"fitted: fragmentation_factor = {k:.4f}, context = {c / GIB:.3f} GiB "
          f"(on {fit_rows.sum()} BLOOM rows); usable A100-80GB = {capacity / GIB:.2f} GiB\n")
    print(f"{'row':6} {'src':4} {'plan':28} {'measured':>9} {'predicted':>9} {'err%':>6}")
    errors = {"S17": [], "S10": []}
    oom_ok = []
    for row, a in zip(rows, alloc):
        p = row.plan
        label = f"tp{p.tp} pp{p.pp} dp{p.dp} vp{p.vp} mbs{p.mbs}"
        pred = a if row.source_id == "S17" else k * a + c
        unit = 1e9 if row.source_id == "S17" else GIB
        if row.measured_bytes is None:
            ok = pred > capacity
            oom_ok.append(ok)
            print(f"{row.record_id:6} {row.source_id:4} {label:28} {'OOM':>9} "
                  f"{pred / unit:9.1f} {'ok' if ok else 'MISSED':>6}")
            continue
        err = 100 * (pred - row.measured_bytes) / row.measured_bytes
        errors[row.source_id].append(abs(err))
        print(f"{row.record_id:6} {row.source_id:4} {label:28} {row.measured_bytes / unit:9.1f} "
              f"{pred / unit:9.1f} {err:+6.1f}")
    print("\n(S17 in GB = 1e9 B of torch max allocated; S10 in GiB of nvidia-smi)")
    for source, errs in errors.items():
        print(f"MAPE {source}: {np.mean(errs):.1f}% over {len(errs)} rows (max {max(errs):.1f}%)")
    every = errors["S17"] + errors["S10"]
    print(f"MAPE all: {np.mean(every):.1f}% over {len(every)} rows")
    print(f"OOM rows predicted not to fit: {sum(oom_ok)}/{len(oom_ok)}")
    print(f"memory_breakdown over 1e6 plans: {time_million_plans():.2f} s")
    if args.write:
        ids = [r.record_id for r, f in zip(rows, fit_rows) if f]
        summary = (f"MAPE {np.mean(errors['S10']):.1f}% there, "
                   f"{np.mean(errors['S17']):.1f}% on the S17 rows without overhead")
        _write(k, c / GIB, f"{ids[0]}..{ids[-1]} ({len(ids)} rows)", summary)
        print(f"wrote {YAML}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
