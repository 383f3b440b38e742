"""Fit the host cost per kernel of the profiling worker's inference path and check it
on measurements it was not fitted to.

``heuristics/engines/megatron-core-static.yaml`` describes what the inference
profiling worker runs (megatron-core 0.16.1's static path, local layers, eager).
Its one fitted number, ``kernel_launch_s`` (host time per kernel-launching
operator), is the value of least TPOT MAPE on the H100 runs
(``benchmarks/gpu/infer_gpt3-*_profile.csv``); the H200 runs of the
``infer_static`` stage (``benchmarks/gpu/h200/infer_static_gpt3-*_profile.csv``,
batch 1 to 128) are the check, and the ``infer_llama`` stage's Llama 3 8B runs
(``h200/infer_static_llama3-8b_profile.csv``) check the per-feature operator
counts. The MoE runs of the ``infer_moe`` and ``infer_moe2`` stages
(``h200/infer_static_{qwen3,mixtral,tiny}-*``, 128 input and 8 output tokens) fit
the host time of an expert's operator as a share of a dense layer's
(``moe_kernels_per_layer.expert_op_host_fraction``) on one point, Qwen3-30B-A3B's
TPOT at batch 1 (its 128 experts' loop is most of the step), and check it on the
other points. Every other number of the engine is counted or
derived (its file says how). Prints the fitted values beside the file's, and the
TTFT and TPOT errors of each set with the file's values; nothing is written.

    python benchmarks/fit_worker_engine.py
"""

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.inference import engine as engines
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.search import Pins, search

ENGINE = "megatron-core-static"
GPU_DIR = Path(__file__).resolve().parent / "gpu"
FIT = ("h100-80gb", sorted(GPU_DIR.glob("infer_gpt3-*_profile.csv")))
CHECK = ("h200", sorted((GPU_DIR / "h200").glob("infer_static_gpt3-*_profile.csv")))
LLAMA = ("h200", sorted((GPU_DIR / "h200").glob("infer_static_llama3-*_profile.csv")))
"""Llama 3 8B (rotary, SwiGLU, GQA, no biases): predicted from the per-feature
operator counts before it was measured."""
MOE = ("h200", sorted((GPU_DIR / "h200").glob("infer_static_qwen3-*_profile.csv"))
       + sorted((GPU_DIR / "h200").glob("infer_static_mixtral-*_profile.csv"))
       + sorted((GPU_DIR / "h200").glob("infer_static_tiny-moe_profile.csv")))
WORKLOAD = InferenceWorkload(512, 64, "bf16")
"""The infer stages' request shape (benchmarks/gpu/run_device.sh)."""
MOE_WORKLOAD = InferenceWorkload(128, 8, "bf16")
"""The infer_moe stage's request shape."""
SCAN_S = np.arange(20e-6, 80e-6, 0.5e-6)
SCAN_SHARE = np.arange(0.05, 1.0001, 0.01)


def measured(files) -> pd.DataFrame:
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def predicted(gpu: str, points: pd.DataFrame, launch_s: float, share: float | None = None,
              workload: InferenceWorkload = WORKLOAD) -> pd.DataFrame:
    engine = dataclasses.replace(engines.get_engine(ENGINE), kernel_launch_s=launch_s)
    if share is not None:
        engine = dataclasses.replace(engine, moe_kernels=(*engine.moe_kernels[:2], share))
    rows = []
    for p in points.itertuples(index=False):
        model = get_model(p.run_model)
        table = search(model, workload, Cluster(get_gpu(gpu), 1, 1), engine=engine,
                       mode="static", pins=Pins((int(p.tp),), (int(p.pp),),
                                                (int(p.run_batch),))).table
        rows.append({"model": p.run_model, "batch": int(p.run_batch),
                     "ttft_ms": p.measured_ttft_ms, "pred_ttft_ms": table.ttft_ms.iloc[0],
                     "tpot_ms": p.measured_tpot_ms, "pred_tpot_ms": table.tpot_ms.iloc[0]})
    out = pd.DataFrame(rows)
    out["ttft_err_pct"] = 100 * (out.pred_ttft_ms / out.ttft_ms - 1)
    out["tpot_err_pct"] = 100 * (out.pred_tpot_ms / out.tpot_ms - 1)
    return out


def mape(table: pd.DataFrame, metric: str) -> float:
    return float(table[f"{metric}_err_pct"].abs().mean())


def main() -> None:
    fit_gpu, fit_files = FIT
    check_gpu, check_files = CHECK
    fit_points, check_points = measured(fit_files), measured(check_files)
    llama_gpu, llama_files = LLAMA
    best = min(SCAN_S, key=lambda s: mape(predicted(fit_gpu, fit_points, s), "tpot"))
    current = engines.get_engine(ENGINE).kernel_launch_s
    print(f"kernel_launch_s of least TPOT MAPE on {len(fit_points)} {fit_gpu} points: "
          f"{best * 1e6:.1f} us (engine file: {current * 1e6:.1f} us)")
    for name, gpu, points in (("fitted on", fit_gpu, fit_points),
                              ("checked on (not fitted)", check_gpu, check_points),
                              ("Llama layers, predicted before measured, on", llama_gpu,
                               measured(llama_files))):
        table = predicted(gpu, points, current)
        print(f"\n{name} {gpu}, {len(table)} points: TPOT MAPE {mape(table, 'tpot'):.1f}%, "
              f"TTFT MAPE {mape(table, 'ttft'):.1f}%")
        print(table.round(1).to_string(index=False))
    moe_report(current)


def moe_report(launch_s: float) -> None:
    """The expert operators' host share fitted on Qwen3-30B-A3B's TPOT at batch 1,
    then every MoE point with the file's value."""
    gpu, files = MOE
    points = measured(files)
    anchor = points[(points.run_model == "qwen3-30b-a3b") & (points.run_batch == 1)]
    best = min(SCAN_SHARE, key=lambda e: mape(
        predicted(gpu, anchor, launch_s, e, MOE_WORKLOAD), "tpot"))
    current = engines.get_engine(ENGINE).moe_kernels[2]
    print(f"\nexpert_op_host_fraction fitted on Qwen3-30B-A3B's batch-1 TPOT: {best:.2f} "
          f"(engine file: {current:.2f})")
    for label, share in (("the file's value", None), ("every operator at a dense one's", 1.0)):
        table = predicted(gpu, points, launch_s, share, MOE_WORKLOAD)
        rest = ~((table.model == "qwen3-30b-a3b") & (table.batch == 1))
        print(f"MoE runs on {gpu} with {label}, {len(table)} points: TPOT MAPE "
              f"{mape(table, 'tpot'):.1f}% ({mape(table[rest], 'tpot'):.1f}% on the "
              f"{int(rest.sum())} not fitted), TTFT MAPE {mape(table, 'ttft'):.1f}%")
        if share is None:
            print(table.round(1).to_string(index=False))

if __name__ == "__main__":
    main()
