"""Print how the model's kernel laws compare with the H100 measurements in
benchmarks/gpu/ and another card's in benchmarks/gpu/<card>/ (made by
benchmarks/gpu/run_device.sh; see its README.md).

    python benchmarks/gpu_compare.py

- GEMMs: measured sustained bf16 efficiency, and the shape law of
  ``step_time.gemm_time_s`` (its size factor, the per-kernel cost) against the
  720 measured weight GEMMs (forward, input and weight gradient);
- fused attention: the efficiency ``step_time._flash_attention_times`` gives at
  each measured length (with and without the per-tile cost) against cuDNN's,
  and under ring context parallelism (one rank's kernels);
- FP8 GEMM speed-up measured against ``fp8_gemm_speedup``, and each FP8
  recipe's GEMMs (per-tensor scales, 1x128 / 128x128 blocks) on an H200;
- HBM copy bandwidth against ``hbm_efficiency``;
- the profiling worker's measured steps (``autoconfig search --profile``) and
  inference steps (``autoconfig infer --profile``) beside what was predicted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.core.catalog import get_gpu
from autoconfig.training.memory import load_constants as load_memory_constants
from autoconfig.training.step_time import BF16_BYTES, gemm_time_s, load_constants
from autoconfig.units import GIB

HERE = Path(__file__).resolve().parent / "gpu"


def _executed_dims(row) -> tuple[int, int, int]:
    """(M, N, K) of the GEMM a row timed: forward x W^T, input gradient dY W,
    weight gradient dY^T X."""
    if row.op == "fprop":
        return row.m, row.n, row.k
    if row.op == "dgrad":
        return row.m, row.k, row.n
    return row.n, row.k, row.m


def gemm_report(gpu, constants) -> None:
    g = pd.read_csv(HERE / "gemm.csv")
    peak = gpu.peak_bf16_tflops * 1e12
    ridge = peak / (gpu.hbm_bandwidth_gb_per_s * 1e9 / BF16_BYTES)
    dims = np.array([_executed_dims(r) for r in g.itertuples()], float)
    flops = 2.0 * dims.prod(axis=1)
    measured = g.ms.to_numpy() / 1e3
    big = (dims.min(axis=1) >= 2048)
    print(f"bf16 GEMMs ({len(g)} shapes): sustained efficiency of those with M, N, K >= 2048: "
          f"median {np.median(flops[big] / measured[big] / peak):.3f} of the "
          f"{gpu.peak_bf16_tflops:g} TFLOP/s peak")
    for label, factor, kernel_s in (("shipped law (size factor %.2g, no kernel cost)"
                                     % constants.gemm_size_factor,
                                     constants.gemm_size_factor, 0.0),
                                    ("no size penalty, 3 us per kernel", 0.0, 3e-6)):
        predicted = gemm_time_s(flops, dims[:, 0], dims[:, 1], dims[:, 2], peak, 1.0, ridge,
                                factor)
        efficiency = np.exp(np.mean(np.log((predicted) / (measured - kernel_s).clip(1e-7))))
        shaped = predicted / efficiency + kernel_s
        err = np.abs(shaped / measured - 1.0)
        print(f"  {label}: best large-GEMM efficiency {efficiency:.3f}, "
              f"MAPE {100 * err.mean():.1f}%, worst {100 * err.max():.0f}%")
    graph = pd.read_csv(HERE / "graph_gemm.csv")
    small = graph[graph.m <= 64]
    print(f"  per-kernel cost: smallest GEMMs {1e3 * small.graph_ms.min():.1f} us as a CUDA "
          f"graph, {1e3 * small.eager_ms.median():.1f} us median launched one by one from Python")


def attention_report(gpu, constants, folder: Path = HERE) -> None:
    a = pd.read_csv(folder / "attention.csv", dtype={"error": "string"}).fillna({"error": ""})
    a = a[(a.backend == "cudnn") & (a.head_dim == 128) & (a.error == "")]
    combined = 3.5 / (1.0 / a.fwd_tflops + 2.5 / a.bwd_tflops) / gpu.peak_bf16_tflops
    efficiency = constants.attention_efficiency_of(gpu)
    tile, causal_keys = constants.attention_tile_costs(gpu)
    keys = np.where(a.causal, a.seq / 2.0, a.seq)
    law = efficiency * keys / (keys + tile + np.where(a.causal, causal_keys, 0.0))
    print(f"fused attention (cuDNN, head dim 128), fraction of peak, forward + backward; "
          f"model: {efficiency:.3f} x L / (L + {tile:g} + {causal_keys:g} causal)")
    print("   seq  causal  measured  model")
    for (_, row), value, model in zip(a.iterrows(), combined, law):
        print(f"  {row.seq:6d}  {str(row.causal):6s}  {value:8.3f}  {model:5.3f}")
    err = np.abs(law / combined - 1.0)
    print(f"  MAPE {100 * err.mean():.1f}% (a constant {efficiency:.3f}: "
          f"{100 * np.abs(efficiency / combined - 1.0).mean():.1f}%)")


def ring_report(gpu, constants) -> None:
    r = pd.read_csv(HERE / "ring_attention.csv")
    efficiency = constants.attention_efficiency_of(gpu)
    tile, causal_keys = constants.attention_tile_costs(gpu)
    keys = r.seq / 2.0
    law = efficiency * keys / (keys + r.cp * tile + causal_keys)
    print("ring context parallelism, one rank's attention kernels (no communication), "
          "fraction of peak: measured / model")
    print("  " + ", ".join(f"{row.seq // 1024}K cp{row.cp} {row.combined_fraction_of_989:.2f}/"
                           f"{model:.2f}" for row, model in zip(r.itertuples(), law)))
    big = r.chunk >= 4096
    err = np.abs(law[big] / r.combined_fraction_of_989[big] - 1.0)
    print(f"  chunks of 4K tokens or more: MAPE {100 * err.mean():.1f}%; smaller chunks run far "
          "below (the PyTorch-launched cuDNN backward costs ~0.1-0.2 ms per step)")


def fp8_report(gpu, constants) -> None:
    f = pd.read_csv(HERE / "gemm_fp8.csv")
    g = pd.read_csv(HERE / "gemm.csv")
    bf16 = g[g.op == "fprop"][["hidden", "tp", "gemm", "m", "ms"]].rename(columns={"ms": "bf16"})
    x = f.merge(bf16, on=["hidden", "tp", "gemm", "m"])
    x = x[(x.m >= 4096) & (x.n >= 2048) & (x.k >= 2048)]
    fast = (x.bf16 / x.ms)[x.fast_accum].median()
    split = (x.bf16 / x.ms)[~x.fast_accum].median()
    # Transformer Engine: forward with fast accumulation, both gradients split.
    training = step_mix(fast, split)
    print(f"FP8 GEMMs (per-tensor scales, M >= 4096, N, K >= 2048): {fast:.2f}x bf16 with fast "
          f"accumulation, {split:.2f}x without; a training step's mix {training:.2f}x; "
          f"model fp8_gemm_speedup {constants.fp8_gemm_speedup:.3f}")
    # The roofline's FP8 gain by shape (compute over the speed-up, 1-byte inputs,
    # bf16 output) against the measured one, all shapes, at the measured large gain.
    a = f[f.fast_accum].merge(bf16, on=["hidden", "tp", "gemm", "m"])
    peak = gpu.peak_bf16_tflops * 1e12
    ridge = peak / (gpu.hbm_bandwidth_gb_per_s * 1e9 / BF16_BYTES)
    flops = 2.0 * a.m * a.n * a.k
    args = (a.m, a.n, a.k, peak, 1.0, ridge, constants.gemm_size_factor)
    law = gemm_time_s(flops, *args) / gemm_time_s(flops, *args, fast)
    measured = a.bf16 / a.ms
    print(f"  the roofline's FP8 gain by shape against the measured ({len(a)} forward GEMMs): "
          f"correlation {np.corrcoef(law, measured)[0, 1]:.2f}, MAPE "
          f"{100 * np.abs(law / measured - 1).mean():.1f}% (one gain for all: "
          f"{100 * np.abs(fast / measured - 1).mean():.1f}%)")


def step_mix(forward: float, backward: float) -> float:
    """A training step's GEMM speed-up from its forward GEMM's and its two
    gradient GEMMs' (each a third of the FLOPs)."""
    return 3.0 / (1.0 / forward + 2.0 / backward)


def fp8_recipe_report(folder: Path) -> float:
    """Each Hopper FP8 recipe's GEMMs beside bf16 timed in the same process;
    returns blockwise's step GEMM time over per-tensor scaling's (the figure
    heuristics/fp8.yaml ``gemm_time_vs_per_tensor`` carries)."""
    f = pd.read_csv(folder / "fp8_recipes.csv", dtype={"error": "string"}).fillna({"error": ""})
    f = f[(f.error == "") & (f.m >= 4096) & (f.n >= 2048) & (f.k >= 2048)]
    median = f.groupby(["scales", "accumulation"]).speedup_vs_bf16.median()
    tensor = step_mix(median["per_tensor", "fast"], median["per_tensor", "split"])
    # Transformer Engine Float8BlockScaling: forward and input gradient 1x128 by
    # 128x128 blocks, weight gradient 1x128 by 1x128.
    block = 3.0 / (2.0 / median["block_1x128_128x128", "split"]
                   + 1.0 / median["block_1x128_1x128", "split"])
    print(f"FP8 recipes' GEMMs over bf16 ({folder.name}, {len(f)} timings, M >= 4096, N, K >= "
          "2048, medians): per-tensor " + f"{median['per_tensor', 'fast']:.2f}x fast accumulation,"
          f" {median['per_tensor', 'split']:.2f}x split; blocks 1x128 by 128x128 "
          f"{median['block_1x128_128x128', 'split']:.2f}x, 1x128 by 1x128 "
          f"{median['block_1x128_1x128', 'split']:.2f}x")
    print(f"  a training step's mix: per-tensor (delayed, tensorwise) {tensor:.2f}x, blockwise "
          f"{block:.2f}x: blockwise GEMMs take {tensor / block:.3f} of per-tensor's time")
    return tensor / block


def other_card_report(folder: Path) -> None:
    """The kernel measurements of another card (benchmarks/gpu/<card>/)."""
    card = (folder / "device.txt").read_text().splitlines()[0]
    gpu = get_gpu(folder.name)
    constants = load_constants()
    rate = float(pd.read_csv(folder / "hbm.csv").gb_per_s.iloc[0])
    f = pd.read_csv(folder / "fp8_recipes.csv").drop_duplicates(["hidden", "tp", "gemm", "m"])
    bf16 = 2.0 * f.m * f.n * f.k / (f.bf16_ms / 1e3) / (gpu.peak_bf16_tflops * 1e12)
    print(f"{card}: HBM copy {rate:.0f} GB/s = {rate / gpu.hbm_bandwidth_gb_per_s:.2f} of the "
          f"datasheet {gpu.hbm_bandwidth_gb_per_s:g}; bf16 GEMMs (forward, {len(f)} shapes) "
          f"median {bf16.median():.3f} of the {gpu.peak_bf16_tflops:g} TFLOP/s peak")
    fp8_recipe_report(folder)
    attention_report(gpu, constants, folder)
    if (folder / "serving_gemm.csv").exists():
        serving_gemm_report(gpu, constants, folder)
    if any(folder.glob("train_*_profile.csv")):
        worker_report(folder, card.removeprefix("NVIDIA "))


def serving_gemm_report(gpu, constants, folder: Path) -> None:
    """Served layers' weight GEMMs (``serving_gemm.csv``, CUDA-graph replayed) at
    each serving height against two laws, each at its own best large-GEMM
    efficiency: the shipped additive roofline (``gemm_time_s``) and the max()
    roofline, max(FLOPs at that efficiency, operand bytes at the copy rate)."""
    s = pd.read_csv(folder / "serving_gemm.csv")
    s = s[s.m >= 16]
    peak = gpu.peak_bf16_tflops * 1e12
    copy = float(pd.read_csv(folder / "hbm.csv").gb_per_s.iloc[0]) * 1e9
    ridge = peak / (gpu.hbm_bandwidth_gb_per_s * 1e9 / BF16_BYTES)
    m, n, k = (s[c].to_numpy(float) for c in ("m", "n", "k"))
    flops = 2.0 * m * n * k
    print(f"served layers' GEMMs ({len(s)} shapes at M 16-8192, graph-replayed), MAPE of "
          "each law at its best efficiency; median law/measured at M 128 / 512 / 1536:")
    for dtype, speedup, element in (("bf16", None, BF16_BYTES), ("fp8", 2.0, 1)):
        measured = s[f"{dtype}_ms"].to_numpy() / 1e3
        additive = gemm_time_s(flops, m, n, k, peak, 1.0, ridge, constants.gemm_size_factor,
                               speedup, element)
        roofline = np.maximum(flops / peak / (speedup or 1.0),
                              (element * (n * k + m * k) + BF16_BYTES * m * n) / copy)
        for label, law in (("additive, size factor %.2g" % constants.gemm_size_factor,
                            additive), ("max() roofline", roofline)):
            efficiency = np.exp(np.mean(np.log(law / measured)))
            ratio = law / efficiency / measured
            heights = " / ".join(f"{np.median(ratio[m == h]):.2f}" for h in (128, 512, 1536))
            print(f"  {dtype} {label}: efficiency {efficiency:.3f} of the "
                  f"{'FP8' if speedup else 'bf16'} peak, MAPE "
                  f"{100 * np.abs(ratio - 1.0).mean():.1f}%, {heights}")


def hbm_report(gpu, constants) -> None:
    h = pd.read_csv(HERE / "hbm.csv")
    e = pd.read_csv(HERE / "elementwise.csv")
    rate = float(h.gb_per_s.iloc[0])
    print(f"HBM copy {rate:.0f} GB/s = {rate / gpu.hbm_bandwidth_gb_per_s:.2f} of the datasheet "
          f"{gpu.hbm_bandwidth_gb_per_s:g} (model hbm_efficiency {constants.hbm_efficiency:g}); "
          "PyTorch non-GEMM kernels at 8K tokens: " + ", ".join(
              f"{r.kernel} h{r.hidden} {r.fwd_gb_per_s / gpu.hbm_bandwidth_gb_per_s:.2f}"
              for r in e.itertuples()))


def _predicted_tensors_gib(total_gib: float) -> float:
    """The memory model's device total less its fragmentation and context: the
    tensors, what max_memory_allocated measures."""
    fragmentation, context = load_memory_constants().overhead_of("megatron-core")
    return (total_gib * GIB - context) / fragmentation / GIB


def worker_report(folder: Path = HERE, card: str = "H100") -> None:
    for path in sorted(folder.glob("train_*_profile.csv")):
        t = pd.read_csv(path)
        name = path.stem.removeprefix("train_").removesuffix("_profile")
        print(f"training worker, {name} on one {card} (megatron-core 0.16.1 local spec, bf16):")
        for r in t.itertuples():
            predicted = f"predicted {r.predicted_memory_gib:.1f}"
            if r.status != "ok":
                print(f"  {r.plan:44s} {r.status}, {predicted} GiB")
                continue
            memory = f"device peak {r.peak_memory_gib:.1f} GiB ({predicted})"
            if pd.notna(getattr(r, "peak_allocated_gib", None)):
                memory += (f", tensors {r.peak_allocated_gib:.1f} (predicted "
                           f"{_predicted_tensors_gib(r.predicted_memory_gib):.1f})")
            else:   # records before 2026-11-27 kept the allocator's tensor peak only
                memory = (f"tensors {r.peak_memory_gib:.1f} GiB (predicted "
                          f"{_predicted_tensors_gib(r.predicted_memory_gib):.1f})")
            print(f"  {r.plan:44s} step {r.step_time_s:.3f} s (predicted "
                  f"{r.predicted_step_time_s:.3f}, {r.step_time_error_pct:+.0f}%), {memory}, "
                  f"measured rank {int(r.measured_rank)} predicted {int(r.predicted_rank)}")
    print("inference worker (megatron-core 0.16.1 static path, eager), input 512 and output 64 "
          "tokens (the MoE models: 128 and 8); predicted: what the engine file said when it ran "
          "(benchmarks/fit_worker_engine.py predicts them as committed):")
    for path in sorted(folder.glob("infer_*_profile.csv")):
        i = pd.read_csv(path)
        for r in i.sort_values("batch").itertuples():
            print(f"  {r.run_model:10s} batch {r.batch:3d}: TPOT {r.measured_tpot_ms:5.1f} ms "
                  f"(predicted {r.predicted_tpot_ms:.1f}), TTFT {r.measured_ttft_ms:6.1f} ms "
                  f"(predicted {r.predicted_ttft_ms:.1f})")


def main() -> int:
    gpu = get_gpu("h100-80gb")
    constants = load_constants()
    print(f"H100 measurements: {(HERE / 'README.md').relative_to(HERE.parent.parent)}\n")
    for report in (lambda: gemm_report(gpu, constants), lambda: attention_report(gpu, constants),
                   lambda: ring_report(gpu, constants),
                   lambda: fp8_report(gpu, constants), lambda: hbm_report(gpu, constants),
                   worker_report):
        report()
        print()
    for folder in sorted(p for p in HERE.iterdir() if (p / "device.txt").exists()):
        other_card_report(folder)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
