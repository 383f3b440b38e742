"""Measure, on the GPU this runs on, the kernels the step-time model prices.

Writes one CSV per kernel family to --out and prints a short summary:

- ``hbm.csv``: a large device-to-device copy (bytes read + written per second),
  the ceiling the model's ``hbm_efficiency`` scales;
- ``gemm.csv``: bf16 GEMMs of the transformer layer's weight matrices (QKV,
  attention output, MLP up, MLP down) for hidden sizes 2048-12288, TP 1-8 and
  1K-16K tokens per micro-batch, each as its forward (M x K by K x N), input
  gradient (M x N by N x K) and weight gradient (N x M by M x K) GEMM;
- ``gemm_fp8.csv``: the forward GEMMs again in FP8 (e4m3, per-tensor scales,
  ``torch._scaled_mm``) with and without fast accumulation;
- ``fp8_recipes.csv``: the GEMMs of each FP8 training recipe Hopper runs
  (per-tensor scales; 1x128 / 128x128 blocks) beside bf16 in the same process;
- ``grouped_gemm.csv``: one rank's MoE expert GEMMs at published layouts
  (per-expert cuBLAS loop as a CUDA graph, bf16 and FP8; PyTorch's grouped
  GEMM; one GEMM of the same FLOPs);
- ``serving_gemm.csv``: the weight GEMMs of served models' layers (Llama 2 70B
  at TP 1-8, Llama 3.1 405B at TP 8, Llama 3 8B, whose MLP is a Mixtral expert's) at
  every height a serving step runs (1 to 8K tokens), bf16 and FP8 (per-tensor
  scales, fast accumulation, as TensorRT-LLM's FP8 checkpoints run), replayed
  in CUDA graphs as the engines replay them, with the cast of the activations
  to FP8 timed apart;
- ``attention.csv``: fused attention (PyTorch SDPA, cuDNN and FlashAttention
  back ends), head dim 64/128, causal and not, 1K to 128K tokens, forward and
  backward timed apart; TFLOP/s count the FLOPs the kernel executes (causal
  half of the score matrix), as ``step_time._flash_attention_times`` does.

Only torch is needed. Timing: CUDA events around a loop of back-to-back launches
long enough to hide launch gaps (>= 10 ms), after warm-up, median of 3 loops.
Inputs are random normal, never zeros (zeros run faster on H100/H200).

Usage (the command behind benchmarks/gpu/*, run on a lent H100):
    python benchmarks/gpu_kernels.py --out DIR [--budget-s 200]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

HIDDEN_SIZES = (2048, 4096, 6144, 8192, 12288)
TP_SIZES = (1, 2, 4, 8)
TOKENS = (1024, 4096, 16384)
ATTENTION_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _time_ms(fn, min_loop_ms: float = 10.0) -> float:
    import torch

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    n = max(1, int(min_loop_ms / once))
    loops = []
    for _ in range(3):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        loops.append(start.elapsed_time(end) / n)
    return statistics.median(loops)


def _write(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def hbm_rows() -> list[dict]:
    import torch

    n = 1 << 30  # 2 GiB of bf16
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src))
    moved = 2 * src.numel() * src.element_size()
    return [{"bytes_moved": moved, "ms": round(ms, 4), "gb_per_s": round(moved / ms / 1e6, 1)}]


def layer_gemm_shapes(h: int, t: int) -> list[tuple[str, int, int]]:
    """(name, N, K) of one GPT layer's weight GEMMs at TP t (MHA, 4h MLP)."""
    return [("qkv", 3 * h // t, h), ("proj", h, h // t), ("fc1", 4 * h // t, h), ("fc2", h, 4 * h // t)]


def training_shapes(deadline: float):
    """(hidden, tp, GEMM name, M, N, K) of the weight GEMMs swept, until ``deadline``."""
    for h in HIDDEN_SIZES:
        for t in TP_SIZES:
            for name, n, k in layer_gemm_shapes(h, t):
                for m in TOKENS:
                    if time.monotonic() > deadline:
                        return
                    yield h, t, name, m, n, k


def gemm_rows(deadline: float) -> list[dict]:
    import torch

    rows = []
    for h, t, name, m, n, k in training_shapes(deadline):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        for op, fn in (("fprop", lambda: x @ w.t()), ("dgrad", lambda: dy @ w),
                       ("wgrad", lambda: dy.t() @ x)):
            ms = _time_ms(fn)
            rows.append({"hidden": h, "tp": t, "gemm": name, "op": op, "m": m, "n": n, "k": k,
                         "ms": round(ms, 5), "tflops": round(flops / ms / 1e9, 1)})
        x = w = dy = None  # free before the next shape
    return rows


def _graph_ms(fn, replays: int = 20) -> float:
    """Milliseconds per call of ``fn`` with launch costs taken out: ``replays``
    calls captured in one CUDA graph, the graph replayed (median of 5)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            fn()
    return _time_ms(graph.replay, min_loop_ms=10.0) / replays


def graph_gemm_rows(deadline: float) -> list[dict]:
    """bf16 GEMMs timed both ways, eager back-to-back (``_time_ms``) and as graph
    replays (``_graph_ms``): the difference is the host's launch cost; M from
    decode batches (1-256 rows) to a training micro-batch (16K)."""
    import torch

    rows = []
    for h, t in ((2048, 8), (4096, 1), (4096, 8), (8192, 8), (12288, 8)):
        for name, n, k in layer_gemm_shapes(h, t):
            for m in (1, 8, 64, 256, 1024, 4096, 16384):
                if time.monotonic() > deadline:
                    return rows
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                eager = _time_ms(lambda: x @ w.t())
                graphed = _graph_ms(lambda: x @ w.t())
                flops = 2.0 * m * n * k
                rows.append({"hidden": h, "tp": t, "gemm": name, "m": m, "n": n, "k": k,
                             "eager_ms": round(eager, 5), "graph_ms": round(graphed, 5),
                             "graph_tflops": round(flops / graphed / 1e9, 2),
                             "weight_gb_per_s": round(2.0 * n * k / graphed / 1e6, 1)})
                x = w = None
    return rows


def elementwise_rows(deadline: float) -> list[dict]:
    """Non-GEMM kernels of a layer in PyTorch at a micro-batch's size (8K tokens,
    h 4096 and 8192), forward and backward: achieved bytes/s on the bytes each
    must move at least (inputs read once, outputs written once)."""
    import torch
    import torch.nn.functional as F

    rows = []
    for h in (4096, 8192):
        tokens = 8192
        x = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = torch.randn(tokens, h, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        up = torch.randn(tokens, 2 * 4 * h // 8, device="cuda", dtype=torch.bfloat16,
                         requires_grad=True)
        e = tokens * h * 2   # bytes of one [tokens, h] bf16 tensor
        cases = {
            "add": (lambda: x + y, 3 * e, None),
            "layernorm": (lambda: F.layer_norm(x, (h,), w), 2 * e, 4 * e),
            "rmsnorm": (lambda: F.rms_norm(x, (h,), w), 2 * e, 4 * e),
            "gelu": (lambda: F.gelu(x, approximate="tanh"), 2 * e, 3 * e),
            "swiglu": (lambda: F.silu(up[:, :h // 2]) * up[:, h // 2:], 1.5 * e,
                       2.0 * e),
        }
        for name, (fn, fwd_bytes, bwd_bytes) in cases.items():
            if time.monotonic() > deadline:
                return rows
            fwd = _time_ms(fn)
            row = {"kernel": name, "tokens": tokens, "hidden": h, "fwd_ms": round(fwd, 4),
                   "fwd_gb_per_s": round(fwd_bytes / fwd / 1e6, 1), "bwd_ms": "",
                   "bwd_gb_per_s": ""}
            if bwd_bytes:
                out = fn()
                grad = torch.randn_like(out)
                inputs = [v for v in (x, w, up) if v.requires_grad]
                both = _time_ms(lambda: torch.autograd.grad(fn(), inputs, grad,
                                                            allow_unused=True))
                bwd = max(both - fwd, 1e-6)
                row.update(bwd_ms=round(bwd, 4), bwd_gb_per_s=round(bwd_bytes / bwd / 1e6, 1))
            rows.append(row)
    return rows


def fp8_rows(deadline: float) -> list[dict]:
    import torch

    rows = []
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for h, t, name, m, n, k in training_shapes(deadline):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        for fast in (True, False):
            ms = _time_ms(lambda: torch._scaled_mm(a, w.t(), one, one, out_dtype=torch.bfloat16,
                                                   use_fast_accum=fast))
            rows.append({"hidden": h, "tp": t, "gemm": name, "m": m, "n": n, "k": k,
                         "fast_accum": fast, "ms": round(ms, 5),
                         "tflops": round(2.0 * m * n * k / ms / 1e9, 1)})
        a = w = None
    return rows


def _blockwise_scales(m: int, n: int, k: int, b_blocks: str):
    """Candidate scale tensors for a 1x128-scaled A (M x K) times B (K x N, the
    transpose of an N x K weight) scaled ``b_blocks`` ("128x128" or "1x128"):
    cuBLASLt reads the scales outer-dimension-major, and which layout a PyTorch
    build accepts differs between releases, so each is tried in turn."""
    import torch

    def rand(*shape):
        return torch.rand(*shape, device="cuda", dtype=torch.float32) + 0.5

    a_options = (rand(k // 128, m).t(), rand(m, k // 128))
    if b_blocks == "128x128":
        b_options = (rand(n // 128, k // 128).t(), rand(k // 128, n // 128))
    else:
        b_options = (rand(k // 128, n), rand(n, k // 128).t())
    return [(a, b) for a in a_options for b in b_options]


def fp8_recipe_rows(deadline: float) -> list[dict]:
    """The GEMMs of the FP8 training recipes a Hopper GPU runs, beside bf16 in
    the same process: per-tensor scales (``delayed`` and ``tensorwise``:
    forward with fast accumulation, gradients without, as Transformer Engine
    runs them) and ``blockwise`` (Transformer Engine Float8BlockScaling on
    cuBLASLt: 1x128 activation blocks by 128x128 weight blocks for the forward
    and input-gradient GEMMs, 1x128 by 1x128 for the weight gradient). The
    shapes are a GPT layer's at h 4096/8192, TP 1/2/8, 4K and 16K tokens."""
    import torch
    import torch.nn.functional as F

    rows = []
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for h in (4096, 8192):
        for t in (1, 2, 8):
            for name, n, k in layer_gemm_shapes(h, t):
                for m in (4096, 16384):
                    if time.monotonic() > deadline:
                        return rows
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                    base = {"hidden": h, "tp": t, "gemm": name, "m": m, "n": n, "k": k,
                            "bf16_ms": round(_time_ms(lambda: x @ w.t()), 5)}
                    a8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                    x = w = None
                    cases = [("per_tensor", "fast", [(one, one)], True),
                             ("per_tensor", "split", [(one, one)], False),
                             ("block_1x128_128x128", "split",
                              _blockwise_scales(m, n, k, "128x128"), False),
                             ("block_1x128_1x128", "split",
                              _blockwise_scales(m, n, k, "1x128"), False)]
                    for scales, accum, options, fast in cases:
                        row = {**base, "scales": scales, "accumulation": accum,
                               "ms": "", "tflops": "", "speedup_vs_bf16": "", "layout": "",
                               "error": ""}
                        calls = [(f"_scaled_mm {i}", lambda sa=sa, sb=sb: torch._scaled_mm(
                            a8, w8.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast))
                            for i, (sa, sb) in enumerate(options)]
                        if scales != "per_tensor" and hasattr(F, "scaled_mm"):
                            recipe_b = (F.ScalingType.BlockWise128x128 if "128x128" in scales
                                        else F.ScalingType.BlockWise1x128)
                            calls += [(f"scaled_mm {i}", lambda sa=sa, sb=sb: F.scaled_mm(
                                a8, w8.t(), sa, F.ScalingType.BlockWise1x128, sb, recipe_b,
                                output_dtype=torch.bfloat16)) for i, (sa, sb) in enumerate(options)]
                        for label, call in calls:
                            try:
                                ms = _time_ms(call)
                            except (RuntimeError, ValueError, TypeError,
                                    NotImplementedError) as err:
                                row["error"] = str(err).splitlines()[0][:160]
                                continue
                            row.update(ms=round(ms, 5), layout=label, error="",
                                       tflops=round(2.0 * m * n * k / ms / 1e9, 1),
                                       speedup_vs_bf16=round(base["bf16_ms"] / ms, 3))
                            break
                        rows.append(row)
                    a8 = w8 = None
    return rows


SERVING_LAYERS = (  # (model, TP, hidden, heads, KV heads, FFN): config.json of each model
    ("llama2-70b", 1, 8192, 64, 8, 28672), ("llama2-70b", 2, 8192, 64, 8, 28672),
    ("llama2-70b", 4, 8192, 64, 8, 28672), ("llama2-70b", 8, 8192, 64, 8, 28672),
    ("llama3.1-405b", 8, 16384, 128, 8, 53248), ("llama3-8b", 1, 4096, 32, 8, 14336))
# A Mixtral 8x7B expert has Llama 3 8B's MLP shapes (h 4096, FFN 14336).
SERVING_TOKENS = (1, 16, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192)


def serving_shapes(h: int, heads: int, kv_heads: int, ffn: int, t: int):
    """(name, N, K) of a Llama layer's weight GEMMs at TP t: fused QKV with
    grouped KV heads, output projection, fused SwiGLU gate and up, down."""
    d = h // heads
    return [("qkv", (heads + 2 * kv_heads) * d // t, h), ("proj", h, h // t),
            ("fc1", 2 * ffn // t, h), ("fc2", h, ffn // t)]


def serving_gemm_rows(deadline: float) -> list[dict]:
    """Each served layer's weight GEMMs at each serving height, bf16 and FP8
    (per-tensor scales, fast accumulation), graph-replayed (``_graph_ms``), and
    the activations' cast to FP8 (what an engine without a fused quantising
    epilogue adds)."""
    import torch

    rows = []
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for model, t, h, heads, kv_heads, ffn in SERVING_LAYERS:
        for name, n, k in serving_shapes(h, heads, kv_heads, ffn, t):
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            w8 = w.to(torch.float8_e4m3fn)
            for m in SERVING_TOKENS:
                if time.monotonic() > deadline:
                    return rows
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                x8 = x.to(torch.float8_e4m3fn)
                bf16 = _graph_ms(lambda: x @ w.t())
                fp8 = _graph_ms(lambda: torch._scaled_mm(x8, w8.t(), one, one,
                                                         out_dtype=torch.bfloat16,
                                                         use_fast_accum=True))
                cast = _graph_ms(lambda: (x * 1.0).to(torch.float8_e4m3fn))
                flops = 2.0 * m * n * k
                rows.append({"model": model, "tp": t, "gemm": name, "m": m, "n": n, "k": k,
                             "bf16_ms": round(bf16, 5), "fp8_ms": round(fp8, 5),
                             "cast_ms": round(cast, 5),
                             "bf16_tflops": round(flops / bf16 / 1e9, 1),
                             "fp8_tflops": round(flops / fp8 / 1e9, 1)})
                x = x8 = None
            w = w8 = None
    return rows


MOE_EXPERTS = (  # (model, hidden, expert FFN, local experts at the published EP)
    ("qwen3-30b-a3b ep8", 2048, 768, 16), ("qwen3-30b-a3b ep16", 2048, 768, 8),
    ("qwen3-235b-a22b ep32", 4096, 1536, 4), ("deepseek-v3 ep32", 7168, 2048, 8),
    ("deepseek-v3 ep64", 7168, 2048, 4))


def grouped_gemm_rows(deadline: float) -> list[dict]:
    """One rank's MoE expert GEMMs (SwiGLU up: M x h by h x 2F; down: M x F by
    F x h) for the local experts of published MoE layouts, M tokens per expert,
    timed four ways: the experts one after another as cuBLAS GEMMs replayed in a
    CUDA graph (how Transformer Engine's GroupedLinear runs them, launch cost
    apart), the same in FP8 with per-tensor scales, PyTorch's grouped GEMM
    (``torch._grouped_mm``, one CUTLASS kernel for all experts) where present,
    and a single GEMM of all the experts' tokens against one expert's weights
    (the same FLOPs at the total M: the ideal the grouped kernels approach)."""
    import torch

    rows = []
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for model, h, f, g in MOE_EXPERTS:
        for m in (1024, 4096, 16384):
            for name, k, n in (("up", h, 2 * f), ("down", f, h)):
                if time.monotonic() > deadline:
                    return rows
                xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(g)]
                ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(g)]
                flops = 2.0 * g * m * n * k
                row = {"model": model, "gemm": name, "experts": g, "m_per_expert": m, "n": n,
                       "k": k}
                row["loop_graph_ms"] = _graph_ms(lambda: [x @ w.t() for x, w in zip(xs, ws)],
                                                 replays=5)
                big = torch.cat(xs)
                row["one_gemm_ms"] = _time_ms(lambda: big @ ws[0].t())
                x8 = [x.to(torch.float8_e4m3fn) for x in xs]
                w8 = [w.to(torch.float8_e4m3fn) for w in ws]
                row["fp8_loop_graph_ms"] = _graph_ms(lambda: [torch._scaled_mm(
                    a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True)
                    for a, b in zip(x8, w8)], replays=5)
                row["grouped_ms"], row["error"] = "", ""
                if hasattr(torch, "_grouped_mm"):
                    offs = torch.arange(1, g + 1, device="cuda", dtype=torch.int32) * m
                    wg = torch.stack(ws)
                    try:
                        row["grouped_ms"] = _time_ms(lambda: torch._grouped_mm(
                            big, wg.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16))
                    except (RuntimeError, ValueError, TypeError) as err:
                        row["error"] = str(err).splitlines()[0][:160]
                    wg = None
                for key in ("loop_graph_ms", "one_gemm_ms", "fp8_loop_graph_ms", "grouped_ms"):
                    if row[key] != "":
                        row[key] = round(row[key], 5)
                        row[key.replace("_ms", "_tflops")] = round(flops / row[key] / 1e9, 1)
                    else:
                        row[key.replace("_ms", "_tflops")] = ""
                rows.append(row)
                xs = ws = big = x8 = w8 = None
    return rows


def attention_rows(deadline: float) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for d in (128, 64):
        for s in ATTENTION_LENGTHS:
            if d == 64 and s > 16384:
                continue
            heads = 16 if s <= 32768 else 8
            b = max(1, 16384 // s)
            for causal in (True, False):
                for backend_name, backend in backends.items():
                    if time.monotonic() > deadline:
                        return rows
                    q, k, v = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16,
                                           requires_grad=True) for _ in range(3))
                    row = {"backend": backend_name, "head_dim": d, "seq": s, "batch": b,
                           "heads": heads, "causal": causal}
                    try:
                        with sdpa_kernel([backend]):
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            grad = torch.randn_like(out)
                            fwd = _time_ms(lambda: F.scaled_dot_product_attention(
                                q, k, v, is_causal=causal))
                            both = _time_ms(lambda: torch.autograd.grad(
                                F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                (q, k, v), grad))
                    except RuntimeError as err:
                        rows.append({**row, "fwd_ms": "", "bwd_ms": "", "fwd_tflops": "",
                                     "bwd_tflops": "", "error": str(err).splitlines()[0][:120]})
                        continue
                    # FLOPs executed: forward 4 s^2 d per head (QK^T and PV), halved when
                    # causal; backward 2.5 x forward (FlashAttention-2 benchmark counting).
                    flops = 4.0 * b * heads * s * s * d * (0.5 if causal else 1.0)
                    bwd = max(both - fwd, 1e-6)
                    rows.append({**row, "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4),
                                 "fwd_tflops": round(flops / fwd / 1e9, 1),
                                 "bwd_tflops": round(2.5 * flops / bwd / 1e9, 1), "error": ""})
                    q = k = v = out = grad = None
    return rows


def ring_attention_rows(deadline: float) -> list[dict]:
    """One rank's attention kernels under ring context parallelism with
    load-balanced chunks, as Transformer Engine runs them
    (``AttnFuncWithCPAndKVP2P``): the rank holds chunks r and 2cp-1-r of c =
    s/(2 cp) tokens; step 0 is a causal kernel over its own 2c tokens, each of the
    cp-1 other steps a kernel without a mask, 2c queries by c keys or c queries by
    2c keys (cuDNN, head dim 128, 8 heads: a TP slice). No communication: the
    kernels' own time, forward and forward + backward, against the FLOPs they
    execute (2 d h s^2 / cp per rank forward)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    d, heads = 128, 8
    for s in (32768, 131072, 524288):
        for cp in (1, 2, 4, 8, 16, 32):
            c = s // (2 * cp)
            if c < 512 or 2 * c > 65536 or time.monotonic() > deadline:
                continue
            q2, k2, v2 = (torch.randn(1, heads, 2 * c, d, device="cuda", dtype=torch.bfloat16,
                                      requires_grad=True) for _ in range(3))
            k1, v1 = (torch.randn(1, heads, c, d, device="cuda", dtype=torch.bfloat16,
                                  requires_grad=True) for _ in range(2))
            q1 = torch.randn(1, heads, c, d, device="cuda", dtype=torch.bfloat16,
                             requires_grad=True)

            def steps():
                outs = [F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)]
                for i in range(1, cp):
                    outs.append(F.scaled_dot_product_attention(q2, k1, v1) if i % 2
                                else F.scaled_dot_product_attention(q1, k2, v2))
                return outs

            def forward_backward():
                outs = steps()
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                fwd = _time_ms(steps)
                both = _time_ms(forward_backward)
            flops = 2.0 * d * heads * s * s / cp
            bwd = max(both - fwd, 1e-6)
            rows.append({"seq": s, "cp": cp, "chunk": c, "heads": heads, "head_dim": d,
                         "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4),
                         "combined_fraction_of_989": round(
                             3.5 * flops / (fwd + bwd) / 1e9 / 989.4, 4)})
            q1 = q2 = k1 = k2 = v1 = v2 = None
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--only", default="hbm,attention,gemm,gemm_fp8",
                        help="comma-separated sections: hbm, attention, gemm, gemm_fp8, "
                             "fp8_recipes, grouped_gemm, graph_gemm, elementwise, "
                             "ring_attention, serving_gemm")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; nothing measured", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    print(f"device {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}", flush=True)
    start = time.monotonic()
    # Shares of the budget by value: attention (long context) and bf16 GEMMs first.
    plan = (("hbm", hbm_rows, None), ("fp8_recipes", fp8_recipe_rows, 0.3),
            ("grouped_gemm", grouped_gemm_rows, 0.8),
            ("attention", attention_rows, 0.3),
            ("gemm", gemm_rows, 0.4), ("gemm_fp8", fp8_rows, 0.25),
            ("graph_gemm", graph_gemm_rows, 0.6), ("elementwise", elementwise_rows, 0.3),
            ("ring_attention", ring_attention_rows, 0.9),
            ("serving_gemm", serving_gemm_rows, 0.95))
    wanted = set(args.only.split(","))
    for name, fn, share in plan:
        if name not in wanted:
            continue
        deadline = time.monotonic() + (share or 0) * args.budget_s
        rows = fn() if share is None else fn(deadline)
        _write(args.out / f"{name}.csv", rows)
        print(f"{name}: {len(rows)} rows at {time.monotonic() - start:.0f} s", flush=True)
        torch.cuda.empty_cache()
    (args.out / "device.txt").write_text(
        f"{props.name}\nSMs {props.multi_processor_count}\ntorch {torch.__version__}\n"
        f"cuDNN {torch.backends.cudnn.version()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
