"""Fit the few free constants of the step-time model on the shipped published runs.

Free constants (shared by every row; never one per row): the large-GEMM
efficiency per GPU generation (ampere, hopper, blackwell), the GEMM size
factor, the elementwise-traffic factor, the FP8 GEMM speed-up (bounded by
the datasheet ratio 2.0) and the per-layer per-micro-batch fixed cost of two
frameworks: Megatron-DeepSpeed (only the BLOOM S10 rows, the one source run
with it, inform it) and pytorch-fsdp (only the S09 rows), and the attention
efficiency of llm-foundry's kernel on A100 and H100 (``ATTENTION``; the S09 rows
of 4K-65K tokens are where attention dominates). The loss is
the mean squared log ratio of predicted to measured figure, averaged per
source and then over sources, over every usable throughput row
(benchmarks/published_runs.csv minus the rows autoconfig.validation.runs skips or marks
as untuned),
minimised by Nelder-Mead (Nelder & Mead 1965) from the values in
heuristics/perf.yaml. Prints the fitted values and the resulting MAPE; copy
them into heuristics/perf.yaml by hand (the sources there name these rows).

    python benchmarks/fit_perf.py                      # all ten free (~1-2 min on 2 cores)
    python benchmarks/fit_perf.py --fix-size-factor 0.5  # what heuristics/perf.yaml holds

The GEMM size factor is poorly identified by these rows (the loss changes by
under 10% between 0 and 1), so the shipped
constants hold it at 0.5, which keeps the roofline's small-GEMM penalty that
the search relies on, and fit the other nine.
"""

import dataclasses
import sys
import time

import numpy as np

from autoconfig.training.step_time import load_constants
from autoconfig.validation.runs import load_runs
from autoconfig.validation.scoring import default_runs_path, evaluate_rows

GENERATIONS = ("ampere", "hopper", "blackwell")
SCALARS = ("gemm_size_factor", "elementwise_traffic_factor", "fp8_gemm_speedup")
OVERHEADS = ("megatron-deepspeed", "pytorch-fsdp")
"""Frameworks whose per-layer per-micro-batch cost are free constants."""
ATTENTION = (("llm-foundry", "ampere"), ("llm-foundry", "hopper"))
"""(kernel, generation) attention efficiencies, the last free constants: llm-foundry's
kernel on A100 and H100, informed by the S09 rows (those of 4K-65K tokens above
all). The ``fused`` (Transformer Engine) efficiencies are held at the kernel
papers' figures (heuristics/perf.yaml): the S08 rows, the only Megatron rows with
fused attention, are 8K-token FP8 runs that cannot tell attention from GEMM speed
(freed, Blackwell's GEMM efficiency rose to 0.81 and its attention fell to 0.20)."""
OVERHEAD_SCALE = 1e-3
"""The overheads are searched in milliseconds so the simplex steps are comparable."""
FP8_SPEEDUP_BOUND = 2.0
"""Datasheet ratio of dense FP8 to BF16 peak (H100, B200): GEMMs cannot gain more."""


def unpack(base, x):
    eff = dict(base.gemm_efficiency_max)
    eff.update({g: float(v) for g, v in zip(GENERATIONS, x[:3])})
    overhead = {**base.layer_overhead_s,
                **{f: float(v) * OVERHEAD_SCALE for f, v in zip(OVERHEADS, x[6:8])}}
    attention = {kernel: dict(table) for kernel, table in base.attention_efficiency.items()}
    for (kernel, generation), v in zip(ATTENTION, x[8:]):
        attention.setdefault(kernel, {})[generation] = float(v)
    return dataclasses.replace(base, gemm_efficiency_max=eff, layer_overhead_s=overhead,
                               attention_efficiency=attention,
                               **{k: float(v) for k, v in zip(SCALARS, x[3:6])})


def loss(x, base, runs) -> float:
    if (np.any(x[:6] <= 0) or np.any(x[6:8] < 0) or np.any(x[:3] > 1.0)
            or np.any(x[8:] <= 0) or np.any(x[8:] > 1.0)
            or x[5] > FP8_SPEEDUP_BOUND or x[5] < 1.0):
        return 1e9
    rows = evaluate_rows(runs, unpack(base, x))
    per_source: dict[str, list[float]] = {}
    for r in rows:
        per_source.setdefault(r.run.source_id, []).append(np.log(r.predicted / r.measured) ** 2)
    # Each source counts once, so the 50 BLOOM rows do not drown the 16 Narayanan ones.
    return float(np.mean([np.mean(v) for v in per_source.values()]))


def nelder_mead(f, x0, steps, iters=400, tol=1e-7):
    """Plain Nelder-Mead simplex minimiser (reflection 1, expansion 2, contraction 0.5)."""
    simplex = [np.array(x0, float)] + [np.array(x0, float) + np.eye(len(x0))[i] * steps[i]
                                       for i in range(len(x0))]
    values = [f(p) for p in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (p - simplex[0]) for p in simplex]
                values = [f(p) for p in simplex]
    best = int(np.argmin(values))
    return simplex[best], values[best]


def main(argv: list[str]) -> int:
    start = time.time()
    base = load_constants()
    runs = [r for r in load_runs(default_runs_path()) if r.usable and r.throughput_benchmark]
    fixed = float(argv[argv.index("--fix-size-factor") + 1]) if "--fix-size-factor" in argv else None
    x0 = np.array([base.gemm_efficiency_max[g] for g in GENERATIONS]
                  + [getattr(base, k) for k in SCALARS]
                  + [max(base.layer_overhead_s.get(f, 0.0) / OVERHEAD_SCALE, 2.0)
                     for f in OVERHEADS]
                  + [base.attention_efficiency.get(k, {}).get(g, 0.4) for k, g in ATTENTION])
    x0[3] = max(x0[3], 0.3)

    def full(p):
        return p if fixed is None else np.concatenate([p[:3], [fixed], p[3:]])

    free = x0 if fixed is None else np.delete(x0, 3)
    p, value = nelder_mead(lambda q: loss(full(q), base, runs), free, steps=0.15 * free)
    p, value = nelder_mead(lambda q: loss(full(q), base, runs), p, steps=0.1 * p)  # restart
    x = full(p)
    fitted = unpack(base, x)
    rows = evaluate_rows(runs, fitted)
    by_source: dict[str, list[float]] = {}
    for r in rows:
        by_source.setdefault(r.run.source_id, []).append(r.abs_pct_error)
    print(f"fitted on {len(rows)} rows: {', '.join(r.run.record_id for r in rows)}")
    for g, v in zip(GENERATIONS, x[:3]):
        print(f"gemm_efficiency_max.{g}: {v:.4f}")
    for k, v in zip(SCALARS, x[3:6]):
        print(f"{k}: {v:.4f}")
    for f, v in zip(OVERHEADS, x[6:8]):
        print(f"layer_overhead_s.{f}: {v * OVERHEAD_SCALE:.5f}")
    for (kernel, generation), v in zip(ATTENTION, x[8:]):
        print(f"attention_efficiency.{kernel}.{generation}: {v:.4f}")
    at_bound = abs(x[5] - FP8_SPEEDUP_BOUND) < 1e-3
    print(f"fp8_gemm_speedup {'AT its bound' if at_bound else 'inside its bounds'} "
          f"[1, {FP8_SPEEDUP_BOUND}]")
    print(f"loss (mean squared log ratio): {value:.5f}; "
          f"MAPE {np.mean([r.abs_pct_error for r in rows]):.1f}%; "
          + ", ".join(f"{s} {np.mean(e):.1f}%" for s, e in sorted(by_source.items())))
    print(f"({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
