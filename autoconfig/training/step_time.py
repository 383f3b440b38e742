"""Analytical step time of a Megatron-style training step, vectorised over a PlanTable.

One step = the slowest pipeline stage (of the first, the middle and the last,
each with its own layer count: ``Plan.first_stage_layers`` and
``last_stage_layers``; the last also runs the output layer) running
``m = GBS / (MBS * DP)`` micro-batches forward and backward (1F1B or
interleaved 1F1B), plus the pipeline fill and drain, exposed communication
and the optimizer step:

    step = compute + recompute + tp_comm + cp_comm + bubble + p2p + dp_comm + optimizer

``compute`` times weight GEMMs at the GEMM roofline and, with fused (flash)
attention, the attention core at its own kernel efficiency (forward, and a
backward that recomputes the scores: ``_flash_attention_times``); it includes
a fixed per-layer per-micro-batch framework cost
(``PerfConstants.layer_overhead_s`` of ``SoftwareFeatures.framework``), which
makes small micro-batches slower than their FLOPs say, and, where the stack does
not fuse gradient accumulation into the weight-gradient GEMMs, one more pass
over every gradient the stage holds per micro-batch at HBM speed
(``grad_accum_bytes_per_param``: 10 bytes per parameter with an fp32
accumulator, 18 with DeepSpeed's BF16 optimizer, which casts to an fp32
temporary first).

``p2p`` counts every pipeline send and receive where they block the compute
stream (1F1B; Megatron-DeepSpeed; 2021 Megatron) and only what a chunk's
compute cannot hide where the interleaved schedule overlaps them
(``SoftwareFeatures.overlap_p2p_comm``: ``_exposed_p2p_s``).

Every term is per GPU of the slowest stage. The constants live in ``heuristics/perf.yaml``;
the software features of the run (flash attention, overlapped gradient
reduce, gradient reduce dtype) in ``SoftwareFeatures``.
"""

from dataclasses import dataclass, field
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from autoconfig.core.comm import (hierarchical_allreduce_s, members_in_domain, p2p_s,
                                  ring_gather_s)
from autoconfig.training.memory import (dense_layer_params_per_gpu, fp8_stores_inputs,
                                       moe_layer_params_per_gpu)
from autoconfig.errors import CatalogError
from autoconfig.core.hardware import Cluster, GPU
from autoconfig.core.model import (Linear, ModelSpec, attention_core_flops_per_token,
                                   attention_linears, banded_keys_per_query,
                                   cross_attention_linears, embedding_params,
                                   kind_params, layer_params, mlp_linears, model_flops_per_token,
                                   mtp_kind, output_layer_params)
from autoconfig.training import offload
from autoconfig.training.activations import cross_attention_bytes, layer_activation_bytes
from autoconfig.paths import heuristics_dir
from autoconfig.core.plan import (RECOMPUTE_KINDS, RECOMPUTE_METHODS, PlanTable, Workload,
                                  stage_kind_columns, stage_layer_columns)
from autoconfig.training.fp8 import (expert_quantisation_kernels, gemm_time_vs_per_tensor,
                                     quantised_cast_bytes, quantised_gemm, workload_recipe)
from autoconfig.training.context_parallel import a2a_group_size
from autoconfig.training.moe_overlap import a2a_overlap_allowed
from autoconfig.training.stack import SoftwareFeatures, grad_accum_bytes_per_param
from autoconfig.yamlio import load_yaml, sourced_number

BF16_BYTES = 2
_FULL = RECOMPUTE_KINDS.index("full")
_SELECTIVE = RECOMPUTE_KINDS.index("selective")
_BLOCK = RECOMPUTE_METHODS.index("block")


@dataclass(frozen=True)
class PerfConstants:
    """The few constants of the model (see heuristics/perf.yaml for sources)."""

    gemm_efficiency_max: dict = field(default_factory=dict)
    """Generation -> large-GEMM fraction of the bf16 dense peak."""
    gemm_size_factor: float = 1.0
    attention_tile_keys: dict = field(default_factory=dict)
    """Generation -> fixed cost of a fused attention kernel per query tile, in keys
    (``_flash_attention_times``); absent: 0."""
    attention_causal_keys: dict = field(default_factory=dict)
    """Generation -> extra per-query-tile cost of a causal mask, in keys; absent: 0."""
    elementwise_traffic_factor: float = 1.0
    fp8_gemm_speedup: float = 1.5
    comm_bandwidth_efficiency: float = 0.8
    comm_latency_s: float = 1e-5
    """A point-to-point send's latency and a ring step's over the scale-out network."""
    nvlink_step_latency_s: float = 1e-5
    """A ring step's latency over NVLink (``allreduce_s``)."""
    collective_base_latency_s: float = 0.0
    """A collective's fixed latency beyond its steps (``allreduce_s``)."""
    hbm_efficiency: float = 0.8
    optimizer_bytes_per_param: float = 30.0
    tp_comm_overlap: float = 0.0
    gemm_tile_m: float = 0.0
    gemm_tile_n: float = 0.0
    """Output tile of the tensor-core GEMM kernels (``wave_quantization``); 0: off."""
    layer_overhead_s: dict = field(default_factory=dict)
    """Framework -> fixed seconds per layer per micro-batch (forward, backward and
    recompute together) that do not shrink with the micro-batch: host-side work of
    the framework's per-layer modules (Megatron-DeepSpeed's PipelineModule runs
    every layer through DeepSpeed's per-layer activation checkpoint with its
    RNG-state save/restore). Frameworks absent here cost 0."""

    moe_layer_overhead_s: float = 0.0
    """Fixed seconds per MoE layer per micro-batch (forward, backward and a
    recompute together): the all-to-all and flex dispatchers copy the per-rank
    token counts to the host before sizing their buffers (megatron-core
    ``token_dispatcher.py``: the split sizes go ``.tolist()``/``.cpu()``), which
    drains the launch queue, so the GPU then waits for the launches of the rest
    of the layer: about a hundred kernels at ~10 us each, forward and backward,
    ~2 ms. Fitted (benchmarks/fit_perf.py) on the MoE rows."""
    moe_expert_kernels: dict = field(default_factory=dict)
    """Kernels Transformer Engine's grouped expert MLP runs for each local expert in
    one micro-batch (heuristics/perf.yaml): ``gemms`` (forward and backward) and,
    in FP8/NVFP4, ``quantisations`` of each expert's GEMM inputs. ``{}``: none
    counted (``expert_kernels_s``)."""
    kernel_launch_host_s: float = 0.0
    """Host seconds to launch one kernel from C++ (a CUDA launch), paid on the
    GPU's clock where the launches are not inside a CUDA graph and the GPU waits
    for them (``expert_kernels_s``)."""
    kernel_gpu_floor_s: float = 0.0
    """GPU seconds below which no kernel runs (its start, the first wave's memory
    latency, the tail), whatever its FLOPs and bytes (``expert_kernels_s``)."""
    grad_bucket_params: dict = field(default_factory=lambda: {"min": 4e7, "per_rank": 1e6})
    """Parameters per data-parallel bucket of an overlapped grad reduce / param
    gather: max(``min``, ``per_rank`` x group size) (heuristics/perf.yaml)."""
    cross_entropy_bytes_per_logit: dict = field(default_factory=dict)
    """Cross-entropy implementation (``SoftwareFeatures.cross_entropy``) -> HBM bytes
    its forward and backward move per logit element (heuristics/perf.yaml)."""
    attention_efficiency: dict = field(default_factory=dict)
    """Attention kernel -> generation -> fraction of the bf16 dense peak that the fused
    (flash) causal attention kernel reaches on the FLOPs it executes (causal half,
    backward recompute included), forward and backward alike. A kernel or
    generation absent falls back to the ``fused`` kernel, then to the large-GEMM
    efficiency."""

    def attention_tile_costs(self, gpu: GPU) -> tuple[float, float]:
        """(per-query-tile, causal extra) fixed cost of fused attention, in keys."""
        return (self.attention_tile_keys.get(gpu.generation, 0.0),
                self.attention_causal_keys.get(gpu.generation, 0.0))

    def efficiency_max(self, gpu: GPU) -> float:
        return self._per_generation(self.gemm_efficiency_max, "gemm_efficiency_max", gpu)

    def cross_entropy_bytes(self, kernel: str) -> float:
        if kernel not in self.cross_entropy_bytes_per_logit:
            raise CatalogError(f"heuristics/perf.yaml: no cross_entropy_bytes_per_logit for "
                               f"{kernel!r}: add it there")
        return self.cross_entropy_bytes_per_logit[kernel]

    def attention_efficiency_of(self, gpu: GPU, kernel: str = "fused") -> float:
        generation = gpu.generation
        for name in (kernel, "fused"):
            table = self.attention_efficiency.get(name) or {}
            if generation in table:
                return table[generation]
        return self.efficiency_max(gpu)

    def _per_generation(self, table: dict, name: str, gpu: GPU) -> float:
        generation = gpu.generation
        if generation not in table:
            raise CatalogError(f"heuristics/perf.yaml: no {name} for generation "
                               f"{generation!r} of GPU {gpu.name!r}: add it there, or set the "
                               "GPU file's 'generation' to one it has")
        return table[generation]


@dataclass(frozen=True)
class StepTimeBreakdown:
    """Seconds per optimizer step and rates; each field a numpy array (one entry per plan)."""

    compute_s: np.ndarray
    """Forward + backward GEMM/attention/logits/elementwise work on the slowest stage, all micro-batches."""
    recompute_s: np.ndarray
    """Extra forward of activation recomputation."""
    offload_s: np.ndarray
    """Exposed host copies of offloaded activations (``autoconfig.training.offload``)."""
    tp_comm_s: np.ndarray
    """Exposed tensor-parallel (and SP) communication."""
    cp_comm_s: np.ndarray
    """Exposed context-parallel communication."""
    ep_comm_s: np.ndarray
    """Exposed expert-parallel token dispatch and combine (MoE layers)."""
    pp_bubble_s: np.ndarray
    """Pipeline fill/drain bubble: (pp - 1) / vp micro-batch times of the stages
    without the output layer."""
    pp_p2p_s: np.ndarray
    """Exposed pipeline point-to-point sends."""
    dp_comm_s: np.ndarray
    """Exposed data-parallel gradient reduce (+ distributed-optimizer all-gather)."""
    optimizer_s: np.ndarray
    """Optimizer step (HBM bound)."""
    step_time_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    model_tflops_per_gpu: np.ndarray
    """Model FLOPs (no recompute) per second per GPU / 1e12."""
    mfu: np.ndarray
    """model_tflops_per_gpu / dense peak of the workload precision (0..1)."""
    cross_attention_s: np.ndarray | float = 0.0
    """Encoder-decoder models: the decoder layers' cross-attention, forward and
    backward, all micro-batches (a part of compute_s, shown apart)."""


def load_constants(path: Path | None = None) -> PerfConstants:
    """Read heuristics/perf.yaml (every number must carry its source)."""
    path = path or heuristics_dir() / "perf.yaml"
    return _load_constants_cached(str(path))


@lru_cache(maxsize=8)
def _load_constants_cached(path_text: str) -> PerfConstants:
    path = Path(path_text)
    data = load_yaml(path)
    eff = data.get("gemm_efficiency_max")
    if not isinstance(eff, dict) or not eff:
        raise CatalogError(f"{path}: missing mapping 'gemm_efficiency_max'")
    scalars = ("gemm_size_factor", "elementwise_traffic_factor", "fp8_gemm_speedup",
               "comm_bandwidth_efficiency", "comm_latency_s", "nvlink_step_latency_s",
               "collective_base_latency_s", "hbm_efficiency",
               "optimizer_bytes_per_param", "tp_comm_overlap", "gemm_tile_m", "gemm_tile_n",
               "moe_layer_overhead_s", "kernel_launch_host_s", "kernel_gpu_floor_s")
    tiles = {name: {g: float(sourced_number(data[name], g, path)) for g in data[name]}
             for name in ("attention_tile_keys", "attention_causal_keys") if data.get(name)}
    overheads = data.get("layer_overhead_s") or {}
    entropy = data.get("cross_entropy_bytes_per_logit") or {}
    buckets = data.get("grad_bucket_params") or {}
    if buckets and set(buckets) != {"min", "per_rank"}:
        raise CatalogError(f"{path}: 'grad_bucket_params' needs 'min' and 'per_rank'")
    kernels = data.get("moe_expert_kernels") or {}
    attention = data.get("attention_efficiency") or {}
    if not all(isinstance(v, dict) and "value" not in v for v in attention.values()):
        raise CatalogError(f"{path}: 'attention_efficiency' maps kernel -> generation -> number")
    return PerfConstants(
        gemm_efficiency_max={k: float(sourced_number(eff, k, path)) for k in eff},
        attention_efficiency={kernel: {g: float(sourced_number(table, g, path)) for g in table}
                              for kernel, table in attention.items()},
        layer_overhead_s={k: float(sourced_number(overheads, k, path)) for k in overheads},
        cross_entropy_bytes_per_logit={k: float(sourced_number(entropy, k, path))
                                       for k in entropy},
        moe_expert_kernels={k: float(sourced_number(kernels, k, path)) for k in kernels},
        **({"grad_bucket_params": {k: float(sourced_number(buckets, k, path))
                                   for k in buckets}} if buckets else {}),
        **tiles, **{k: float(sourced_number(data, k, path)) for k in scalars})


def gemm_time_s(flops, m, n, k, peak_flops, eff_max, ridge_flop_per_elem, size_factor,
                fp8_speedup=None, input_bytes=1.0):
    """Time of GEMMs with ``flops`` work and shape M x K by K x N.

    Roofline with additive memory time (Williams et al. 2009): a GEMM moves at
    least (MK + KN + MN) elements for 2MNK FLOPs, so
    t = flops / (eff_max * peak) * (1 + f * r * (1/M + 1/N + 1/K)),
    with r = peak / (2 * HBM elements/s) the ridge point per bf16 element and
    ``f`` a fitted factor for tiling and cache reuse. Each term is one operand's
    bytes: 1/M the weights (N K elements), 1/N the activations (M K), 1/K the
    output (M N).

    FP8 (``fp8_speedup`` the tensor cores' gain over bf16): the compute runs
    that much faster and both inputs are 1-byte elements, so their terms halve,
    while the bf16 output moves as before:
    t = flops / (eff_max * peak) * (1/speedup + f * r * (1/2M + 1/2N + 1/K)).
    So a small or thin GEMM gains less than a large one (measured on an H200,
    benchmarks/gpu/h200/grouped_gemm.csv: Qwen3-30B-A3B's experts 1.34-1.68x
    bf16, DeepSeek-V3's 1.71-1.97x).

    NVFP4 the same with its own speed-up and ``input_bytes`` 0.5625 (4-bit
    elements and a 1-byte scale per 16): the input terms take 0.5625/2 of bf16's.
    """
    compute, inputs = ((1.0, 1.0) if fp8_speedup is None
                       else (1.0 / fp8_speedup, input_bytes / BF16_BYTES))
    penalty = compute + size_factor * ridge_flop_per_elem * (inputs / m + inputs / n + 1.0 / k)
    return flops / (eff_max * peak_flops) * penalty


def wave_quantization(m, n, tile_m: float, tile_n: float, sm_count: int):
    """Factor (>= 1) by which an M x N GEMM output runs slower than its FLOPs say
    because it is computed in whole tiles, a wave of ``sm_count`` tiles at a
    time (NVIDIA "Matrix Multiplication Background" user's guide, tile and wave
    quantization): ceil(M/tm) ceil(N/tn) tiles take ceil(tiles/SMs) waves,
    against M N / (tm tn SMs) waves of useful work. Narrow TP slices (N = out/t)
    and short CP chunks (M = s b/cp) pay most. tile_m = 0 turns it off."""
    if not tile_m:
        return 1.0
    tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n)
    waves = np.ceil(tiles / sm_count)
    return waves * sm_count * tile_m * tile_n / (m * n)


def _gemm_timer(gpu: GPU, c: PerfConstants, fp8_speedup: float | None = None,
                input_bytes: float = 1.0):
    """seconds(flops, m, n, k) of GEMMs on one GPU: ``gemm_time_s``'s roofline at
    the generation's efficiency, times ``wave_quantization``; FP8 or NVFP4 GEMMs
    where ``fp8_speedup`` is given (``_quantised_gemm``)."""
    peak = gpu.peak_bf16_tflops * 1e12
    ridge = peak / (gpu.hbm_bandwidth_gb_per_s * 1e9 / BF16_BYTES)
    eff = c.efficiency_max(gpu)

    def seconds(flops, m, n, k):
        return gemm_time_s(flops, m, n, k, peak, eff, ridge, c.gemm_size_factor,
                           fp8_speedup, input_bytes) * \
            wave_quantization(m, n, c.gemm_tile_m, c.gemm_tile_n, gpu.sm_count)
    return seconds


def _linear_gemm(x: Linear, t):
    """(flops per token per GPU, N, K, M scale) of one weight matrix under tp
    ranks: column-parallel splits N, row-parallel splits K; a replicated one
    (MLA's down-projections) runs whole on each rank's 1/t of the tokens
    (megatron-core computes the latents before gathering the sequence), so
    its FLOPs split too and its M is tokens/t."""
    flops = 2.0 * x.in_features * x.out_features / t
    if x.parallel == "column":
        return flops, x.out_features / t, x.in_features, 1.0
    if x.parallel == "row":
        return flops, x.out_features, x.in_features / t, 1.0
    return flops, x.out_features + 0.0 * t, x.in_features, 1.0 / t


def _layer_gemms(model: ModelSpec, t, ffn: int | None = None):
    """(flops per token per GPU, N, K, M scale) (``_linear_gemm``) of the weight
    GEMMs of one layer: the attention's (GQA: QKV h x (h + 2 kv_h) / t and
    projection h/t x h) and an MLP of width ``ffn`` (default the dense FFN; 0: none): up h x u f / t with
    u = 2 for SwiGLU, down f/t x h. Megatron column/row parallel layers
    (Shoeybi et al. 2019, Sec. 3)."""
    ffn = model.ffn_hidden_size if ffn is None else ffn
    linears = attention_linears(model) + (mlp_linears(model, ffn) if ffn else ())
    return tuple(_linear_gemm(x, t) for x in linears)


def _elementwise_bytes_per_layer(model: ModelSpec, s, b, t, cp, sp, flash: bool):
    """Activation bytes of one layer's forward per GPU (Korthikanti et al. 2022, eqs. 2-4).

    sbh(10 + 24/t) without SP, sbh(34/t) with SP, plus 5 a s^2 b / t for the
    attention scores, softmax and dropout unless attention is fused (flash).
    Non-GEMM kernels read and write about this much, so it sets their time.
    """
    h, a = model.hidden_size, model.num_heads
    tokens = s * b / cp
    linear = np.where(sp, 34.0 / t, 10.0 + 24.0 / t) * tokens * h
    scores = 0.0 if flash else 5.0 * a * (s / cp) * s * b / t
    return linear + scores


def step_time(model: ModelSpec, workload: Workload, plans: PlanTable, cluster: Cluster,
              constants: PerfConstants | None = None,
              software: SoftwareFeatures | None = None) -> StepTimeBreakdown:
    """Step time and rates of every plan (vectorised; plans assumed valid)."""
    c = constants or load_constants()
    sw = software or SoftwareFeatures()
    gpu = cluster.gpu
    t, pp, dp, cp, vp = (plans.tp.astype(float), plans.pp.astype(float), plans.dp.astype(float),
                         plans.cp.astype(float), plans.vp.astype(float))
    b = plans.mbs.astype(float)
    tokens = b * workload.seq_len / cp
    micro = workload.global_batch_size / (b * dp)
    stages = stage_layer_columns(model.num_layers, pp, plans.first_stage_layers,
                                 plans.last_stage_layers)

    hbm = gpu.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    single = pp == 1
    kinds = {}
    if model.is_moe:
        times = {"dense": _forward_times(model, workload, plans, gpu, c, sw),
                 "moe": _forward_times(model, workload, plans, gpu, c, sw, "moe", cluster)}
        kinds = stage_kind_columns(model, pp, plans.first_stage_layers, plans.last_stage_layers)
        # The MTP modules run on the stage that holds the output layer.
        kind = mtp_kind(model)
        for name, holds in (("first", single), ("middle", single), ("last", True)):
            kinds[name][kind] = kinds[name][kind] + np.where(holds, model.mtp_layers, 0)
    elif model.is_encoder_decoder:
        times = _encoder_decoder_times(model, workload, plans, gpu, c, sw)
        kinds = stage_kind_columns(model, pp, plans.first_stage_layers, plans.last_stage_layers)
    else:
        times = _forward_times(model, workload, plans, gpu, c, sw)

    accum_bytes = grad_accum_bytes_per_param(sw)

    def stage(name, logits: float | np.ndarray):
        out = _stage_microbatch(model, cluster, c, sw, plans, times, t, cp, vp, tokens,
                                stages[name], logits, kinds.get(name))
        if accum_bytes:
            # An unfused gradient accumulation streams every gradient the stage
            # holds once per micro-batch, after its backward, on the compute stream.
            own = _stage_grad_params(model, t, stages[name], plans, kinds.get(name), name,
                                     single)
            accum = own * accum_bytes / hbm
            out = {**out, "fixed": out["fixed"] + accum, "total": out["total"] + accum}
        return out

    first = stage("first", np.where(single, 1.0, 0.0))
    middle = stage("middle", np.where(single, 1.0, 0.0))
    last = stage("last", 1.0)
    per_stage = np.stack([first["total"], middle["total"], last["total"]])
    slowest = np.argmax(per_stage, axis=0)
    pick = {k: np.choose(slowest, [first[k], middle[k], last[k]]) for k in last}
    # Fill and drain (1F1B: Narayanan et al. 2021 Sec. 2.2.1): the slowest stage
    # waits for one micro-batch through every other stage before its first
    # forward and after its last backward; the interleaved schedule cuts that by
    # vp. With even stages this is (p - 1)/v micro-batch times of the other stages.
    all_stages = first["total"] + np.maximum(pp - 2.0, 0.0) * middle["total"] + np.where(
        single, 0.0, last["total"])
    bubble = np.where(single, 0.0, (all_stages - pick["total"]) / vp)

    split = plans.sp | sw.p2p_scatter_gather
    p2p_bytes = tokens * model.hidden_size * BF16_BYTES / np.where(split, t, 1.0)
    pp_bw = np.where(t * cp * dp * pp <= cluster.nvlink_domain_gpus,
                     gpu.nvlink_bandwidth_gb_per_s, gpu.internode_bandwidth_gb_per_s)
    p2p_one = p2p_s(p2p_bytes, pp_bw * 1e9 * c.comm_bandwidth_efficiency, c.comm_latency_s)
    pp_p2p = np.where(pp > 1, _exposed_p2p_s(p2p_one, micro, vp, pick["total"],
                                             sw.overlap_p2p_comm), 0.0)

    # Gradients and optimizer state: the last stage holds the output layer, the most parameters.
    layers = stages["last"]
    params, experts = _stage_params_per_gpu(model, t, layers, plans, kinds.get("last"))
    if sw.param_gathers_per_microbatch > 0:
        dp_comm = micro * _sharded_dp_comm_per_microbatch(
            model, cluster, c, sw, t, cp, dp, layers, params + experts, window_s=last["total"])
    else:
        windows = (last["backward"], last["compute"] - last["backward"])
        dp_comm = _dp_comm(cluster, c, sw, plans, params, dp * cp, t, *windows)
        if model.is_moe:
            dp_comm = dp_comm + _dp_comm(cluster, c, sw, plans, experts, plans.edp,
                                         plans.ep * plans.etp, *windows)
    optimizer = _optimizer_s(c, plans, t, cp, dp, params, experts, hbm)

    step = micro * pick["total"] + bubble + pp_p2p + dp_comm + optimizer
    num_gpus = t * pp * dp * cp
    tokens_per_gpu = workload.tokens_per_step / step / num_gpus
    model_tflops = tokens_per_gpu * model_flops_per_token(model, workload.seq_len) / 1e12
    cross = np.zeros_like(step)
    if model.is_encoder_decoder:
        cross = micro * kinds["last"]["decoder"] * times["decoder"]["cross_attention_fwd_bwd"]
    return StepTimeBreakdown(
        cross_attention_s=cross,
        compute_s=micro * (pick["compute"] + pick["fixed"]), recompute_s=micro * pick["recompute"],
        offload_s=micro * pick["offload"],
        tp_comm_s=micro * pick["tp"], cp_comm_s=micro * pick["cp"], ep_comm_s=micro * pick["ep"],
        pp_bubble_s=bubble,
        pp_p2p_s=pp_p2p, dp_comm_s=dp_comm, optimizer_s=optimizer, step_time_s=step,
        tokens_per_s_per_gpu=tokens_per_gpu, model_tflops_per_gpu=model_tflops,
        mfu=model_tflops / gpu.peak_tflops(workload.precision))


def _exposed_p2p_s(p2p_one_s, micro, vp, microbatch_s, overlapped: bool):
    """Pipeline send/receive seconds on the slowest stage's critical path.

    Each micro-batch crosses every chunk boundary twice (activation forward,
    gradient backward): ``micro * vp * 2`` transfers. Blocking (1F1B, or the
    interleaved schedule without ``overlap_p2p_comm``) every transfer waits on
    the compute stream. Overlapped (interleaved, megatron-core ``overlap_p2p_comm``)
    a transfer is posted asynchronously and waited on only when the next chunk
    needs it, so it hides behind one chunk's forward and backward
    (``microbatch_s / vp``); only what exceeds that, plus one fill and one drain
    transfer that nothing precedes, is exposed.
    """
    blocking = micro * vp * 2.0 * p2p_one_s
    if not overlapped:
        return blocking
    hidden = micro * vp * np.maximum(2.0 * p2p_one_s - microbatch_s / vp, 0.0) + 2.0 * p2p_one_s
    return np.where(vp > 1, hidden, blocking)


def _stage_microbatch(model, cluster, c, sw, plans, times, t, cp, vp, tokens, layers,
                      logits, kinds: dict | None = None) -> dict:
    """Seconds one micro-batch spends on a stage of ``layers`` transformer layers
    (forward + backward), with ``logits`` = 1 where the stage holds the output
    layer: compute, recompute, exposed TP, CP and expert-parallel communication
    and the framework's fixed per-layer cost, their total, and the backward part
    (the window the gradient reduce can hide behind).

    ``kinds`` maps each layer kind to its count on the stage (MoE models; MTP
    modules counted on the stage with the output layer); ``times`` then maps
    each kind to its forward times. Recomputed layers are shared among the
    kinds in proportion to their counts."""
    full_layers = np.where(
        (plans.recompute_method == _BLOCK) & (plans.recompute_num_layers > 0),
        np.minimum(plans.recompute_num_layers * vp, layers), layers)
    rc_layers = np.where(plans.recompute == _FULL, full_layers, 0.0)
    offloaded = offload.offloaded_layers(plans, sw)
    if kinds is None:
        parts = [(times, layers, rc_layers, offloaded)]
        head, heads = times, 1.0
    elif model.is_encoder_decoder:
        # Encoder and decoder are two blocks with the same recompute settings:
        # block recomputes the first N layers of each.
        parts = [(times[k], kinds[k], np.where(plans.recompute == _FULL, np.where(
            (plans.recompute_method == _BLOCK) & (plans.recompute_num_layers > 0),
            np.minimum(plans.recompute_num_layers, kinds[k]), kinds[k]), 0.0), 0.0)
            for k in ("encoder", "decoder")]
        head, heads = times["decoder"], 1.0
    else:
        total = np.maximum(kinds["dense"] + kinds["moe"], 1.0)
        parts = [(times[k], kinds[k], rc_layers * kinds[k] / total, offloaded * kinds[k] / total)
                 for k in ("dense", "moe")]
        # Each MTP module has its own output layer and loss.
        head, heads = times["dense"], 1.0 + model.mtp_layers
    logits_fwd = logits * heads * head["logits"]
    out = None
    for kind_times, n, rc, off in parts:
        one = _layers_microbatch(model, cluster, c, sw, plans, kind_times, t, cp,
                                 kind_times.get("tokens", tokens), n, rc, off)
        out = one if out is None else {k: out[k] + one[k] for k in out}
    # Forward + backward of the output layer: 3 x forward, like any GEMM; then its loss.
    out["compute"] = out["compute"] + 3.0 * logits_fwd + logits * heads * head["loss"]
    out["backward"] = out["backward"] + 2.0 * logits_fwd
    out["total"] = (out["compute"] + out["recompute"] + out["tp"] + out["cp"] + out["ep"]
                    + out["fixed"] + out["offload"])
    return out


def _layers_microbatch(model, cluster, c, sw, plans, times, t, cp, tokens, layers,
                       rc_layers, offloaded=0.0) -> dict:
    """One micro-batch through ``layers`` layers of one kind (``rc_layers`` of them
    recomputed in full, ``offloaded`` of them with their activations copied to the
    host): the terms of ``_stage_microbatch`` without the output layer."""
    layer_fwd, attn, attn_bwd = times["layer"], times["attention"], times["attention_backward"]
    # Recompute: full -> forward of the recomputed layers; selective -> attention core.
    # Selective recompute modules (``RECOMPUTE_MODULES``): MLA's up-projections and
    # the whole MLP ("mlp", dense layers only: megatron-core skips it on MoE layers)
    # or MoE block ("moe") run their forward again (the norms and the experts'
    # activation are elementwise and cheap: not counted).
    block = plans.recomputes("moe" if "ep_comm" in times else "mlp")
    modules = (np.where(plans.recomputes("mla_up_proj"), times["mla_up"], 0.0)
               + np.where(block, times["mlp_fwd"], 0.0))
    full = layer_fwd - (times["last_gemm"] if sw.recompute_early_stop else 0.0)
    recompute = np.where(plans.recompute == _FULL, rc_layers * full,
                         np.where(plans.recompute == _SELECTIVE,
                                  layers * (attn + times["scores"] + modules), 0.0))
    # Forward + backward: 3 x forward for the GEMMs, the attention core its own backward.
    compute = layers * (3.0 * (layer_fwd - attn) + attn + attn_bwd)
    tp = _tp_comm_per_microbatch(model, cluster, c, t, tokens, layers, rc_layers,
                                 times["column_parallel_gemms"] if sw.tp_async_backward else None)
    if "cross_kv_tokens" in times:
        # A decoder layer has three blocks with TP collectives (self-attention,
        # cross-attention, MLP) against two, and its key-value projection
        # gathers (SP) or reduces the gradient of the encoder output: one more
        # collective pair over the encoder's tokens.
        tp = 1.5 * tp + 0.5 * _tp_comm_per_microbatch(model, cluster, c, t,
                                                      times["cross_kv_tokens"], layers,
                                                      rc_layers)
    if sw.tp_comm_overlap:
        tp = np.maximum(0.0, tp - (3.0 * layers + rc_layers) * times["weight_gemm"])
    cp_comm = _cp_comm_per_microbatch(model, cluster, c, sw, t, cp, tokens, layers, rc_layers,
                                      attn + attn_bwd, times["cp_correction"])
    fixed = layers * c.layer_overhead_s.get(sw.framework, 0.0)
    backward = layers * (2.0 * (layer_fwd - attn) + attn_bwd)
    ep = 0.0
    if "ep_comm" in times:
        kernels_fwd, kernels_bwd = times["expert_kernels"]
        # A recomputed MoE block runs its experts' forward kernels again, and
        # dispatches and combines its tokens again.
        recomputed = rc_layers + np.where(block, layers, 0.0)
        fixed = (fixed + layers * (c.moe_layer_overhead_s + kernels_fwd + kernels_bwd)
                 + recomputed * kernels_fwd)
        ep = _exposed_ep_comm(times["ep_comm"], layers, recomputed,
                              3.0 * layer_fwd - 2.0 * attn + attn_bwd,
                              sw.moe_a2a_overlap
                              & a2a_overlap_allowed(model, plans, sw.moe_dispatcher))
    copies = 0.0
    if sw.cpu_offload_layers:
        copy_s = times["kept_bytes"] / offload.host_bytes_per_s(cluster.gpu,
                                                                c.comm_bandwidth_efficiency)
        copies = offload.exposed_s(offloaded, copy_s, layer_fwd,
                                   2.0 * (layer_fwd - attn) + attn_bwd)
    return {"compute": compute, "recompute": recompute, "tp": tp, "cp": cp_comm, "ep": ep,
            "fixed": fixed, "backward": backward, "offload": copies}


def _exposed_ep_comm(dispatch_combine_s, layers, rc_layers, layer_compute_s, overlapped):
    """Exposed expert-parallel token traffic of one micro-batch.

    Each MoE layer dispatches its tokens to their experts and combines the
    results back: once in forward, once (the gradients, the same volume) in
    backward, and once more in a full recompute's forward (megatron-core
    recomputes the whole layer, dispatch included). Without overlap every one
    waits on the compute stream. With megatron-core's expert-parallel comm
    overlap (--overlap-moe-expert-parallel-comm) the 1F1B schedule runs one
    micro-batch's dispatch and combine while another computes the same layer,
    so only what exceeds the layer's forward and backward compute is exposed.
    ``overlapped`` is per plan: megatron-core refuses the overlap for some
    layouts (``a2a_overlap_allowed``), and those run it exposed."""
    total = (2.0 * layers + rc_layers) * dispatch_combine_s
    return np.where(overlapped, np.maximum(0.0, total - layers * layer_compute_s), total)


def _forward_times(model: ModelSpec, workload: Workload, plans: PlanTable, gpu: GPU,
                   c: PerfConstants, sw: SoftwareFeatures, kind: str = "dense",
                   cluster: Cluster | None = None, causal: bool = True) -> dict:
    """Forward seconds of one micro-batch on one GPU: a whole layer, its attention
    core (and that core's backward), its s^2 score traffic (unfused attention
    only) and the output layer.

    Weight GEMMs and logits at the roofline efficiency (``gemm_time_s``), FP8
    speeding up only those; fused attention at its own kernel efficiency
    (``_flash_attention_times``); non-GEMM kernels at HBM speed on the
    Korthikanti activation bytes. ``kind`` ``moe``: the MLP is the MoE block
    (``_moe_block_times``: router, experts, shared experts, token traffic).
    ``causal`` False: attention without a mask (an encoder's), every key for
    every query.
    """
    t, cp, b = plans.tp.astype(float), plans.cp.astype(float), plans.mbs.astype(float)
    ffn = 0 if kind == "moe" else model.ffn_hidden_size
    s = float(workload.seq_len)
    peak = gpu.peak_bf16_tflops * 1e12
    hbm = gpu.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    tokens = b * s / cp
    timer = _gemm_timer(gpu, c)
    weight_timer = _gemm_timer(gpu, c, *_quantised_gemm(c, workload, sw, gpu))

    def gemm(flops_per_token, n, k, m=tokens):
        return timer(flops_per_token * tokens, m, n, k)

    def weight_gemm_s(flops_per_token, n, k, m=tokens):
        return weight_timer(flops_per_token * tokens, m, n, k)

    gemms = [weight_gemm_s(fl, n, k, m=tokens * scale)
             for fl, n, k, scale in _layer_gemms(model, t, ffn)]
    weight_gemm = sum(gemms)
    names = [x.name for x in attention_linears(model)]
    attention_gemms = len(names)
    mla_up = sum((g for g, name in zip(gemms, names) if name in ("q_up", "kv_up")), 0.0 * tokens)
    mlp_fwd = sum(gemms[attention_gemms:])
    if sw.flash_attention:
        attn, attn_bwd = _flash_attention_times(model, s, tokens, t, peak,
                                                c.attention_efficiency_of(gpu, sw.attention_kernel),
                                                cp, *c.attention_tile_costs(gpu), causal=causal)
    else:
        # Unfused attention: two batched GEMMs per head, (s/cp) x d by d x s, over the
        # whole score matrix, at GEMM efficiency with the 1/K (= 1/d) traffic term
        # (the s x s scores are written to HBM); backward = 2 x forward, like any GEMM.
        attn = gemm(attention_core_flops_per_token(model, s) / t, s, model.head_dim, m=s / cp)
        attn = attn * _misaligned_head_slowdown(model, gpu)
        attn_bwd = 2.0 * attn
    linear = _elementwise_bytes_per_layer(model, s, b, t, cp, plans.sp, True)
    total = _elementwise_bytes_per_layer(model, s, b, t, cp, plans.sp, sw.flash_attention)
    if workload.precision != "bf16":
        total = total + _fp8_cast_bytes_per_layer(model, tokens, t,
                                                  quantised_cast_bytes(workload, sw, gpu), kind)
    factor = c.elementwise_traffic_factor / hbm
    logits = weight_gemm_s(2.0 * model.hidden_size * model.vocab_size / t,
                           model.vocab_size / t, model.hidden_size)
    loss = tokens * model.vocab_size / t * c.cross_entropy_bytes(sw.cross_entropy) / hbm
    extra, traffic = {}, 0.0
    if kind == "moe":
        block = _moe_block_times(model, workload, plans, cluster, c, sw, gemm, weight_gemm_s,
                                 tokens)
        weight_gemm = weight_gemm + block["gemm"]
        mlp_fwd = block["gemm"] + block["traffic_s"]
        # The dense MLP's share of the elementwise traffic goes; the MoE block's
        # own traffic is counted at streaming speed (``_routed_copy_bytes``).
        moe_bytes = -_dense_mlp_bytes(model, tokens, t, plans.sp)
        linear, total = linear + moe_bytes, total + moe_bytes
        traffic = block["traffic_s"]
        extra = {"ep_comm": block["ep_comm"], "expert_kernels": block["expert_kernels_s"]}
        gemms = gemms + [block["up_gemm"]]
    # What an offloaded layer copies to the host; only priced when offloading.
    kept = layer_activation_bytes(model, s, b, t, plans.sp, 0,
                                  flash_attention=sw.flash_attention, cp=cp,
                                  fp8_inputs=fp8_stores_inputs(workload, sw), kind=kind,
                                  etp=plans.etp) if sw.cpu_offload_layers else 0.0 * tokens
    return {**extra, "layer": weight_gemm + traffic + attn + factor * total, "attention": attn,
            "kept_bytes": kept,
            "mla_up": mla_up, "mlp_fwd": mlp_fwd,
            "attention_backward": attn_bwd, "weight_gemm": weight_gemm,
            # Column-parallel GEMMs whose weight gradient hides the backward TP
            # collective: the attention's input GEMMs and the MLP's up GEMM.
            "column_parallel_gemms": (sum(gemms[:attention_gemms - 1]),
                                      gemms[attention_gemms] if len(gemms) > attention_gemms
                                      else 0.0),
            "scores": factor * (total - linear), "logits": logits, "loss": loss,
            "cp_correction": _cp_correction_s(model, s, b, t, cp, hbm),
            # The MLP's down projection, the last GEMM of a dense layer: what a
            # recompute that stops early skips (``SoftwareFeatures.recompute_early_stop``,
            # ``_layers_microbatch``). An MoE block's combine saves the experts'
            # outputs after their down GEMM, so nothing is skipped there.
            "last_gemm": gemms[-1] if kind != "moe" and len(gemms) > attention_gemms else 0.0}


def _encoder_decoder_times(model: ModelSpec, workload: Workload, plans: PlanTable, gpu: GPU,
                           c: PerfConstants, sw: SoftwareFeatures) -> dict:
    """``_forward_times`` of an encoder layer and of a decoder layer.

    An encoder layer is a dense layer over the encoder's ``seq_len`` tokens
    whose attention is bidirectional: a fused kernel computes the whole score
    matrix (``_flash_attention_times`` without the causal mask). A decoder
    layer is a dense layer over the decoder's tokens plus its cross-attention
    (``_cross_attention_times``)."""
    b = plans.mbs.astype(float)
    encoder = dict(_forward_times(model, workload, plans, gpu, c, sw, causal=False))
    encoder["tokens"] = b * workload.seq_len
    decoder_workload = replace(workload, seq_len=model.decoder_seq_len)
    decoder = dict(_forward_times(model, decoder_workload, plans, gpu, c, sw))
    cross = _cross_attention_times(model, workload, plans, gpu, c, sw)
    decoder.update({
        "layer": decoder["layer"] + cross["forward"],
        "attention": decoder["attention"] + cross["core"],
        "attention_backward": decoder["attention_backward"] + cross["core_backward"],
        "weight_gemm": decoder["weight_gemm"] + cross["gemm"],
        "tokens": b * model.decoder_seq_len, "cross_kv_tokens": b * workload.seq_len,
        # Forward and backward, as ``_layers_microbatch`` counts a layer's.
        "cross_attention_fwd_bwd": 3.0 * (cross["forward"] - cross["core"]) + cross["core"]
        + cross["core_backward"]})
    return {"encoder": encoder, "decoder": decoder}


def _cross_attention_times(model: ModelSpec, workload: Workload, plans: PlanTable, gpu: GPU,
                           c: PerfConstants, sw: SoftwareFeatures) -> dict:
    """Forward seconds of one decoder layer's cross-attention on one GPU.

    GEMMs (``_linear_gemm``): the query and output projections over the
    micro-batch's decoder tokens, the key-value projection over its encoder
    tokens. Core: every decoder query against every encoder key, no causal
    mask, so the fused kernel does all 4 s_enc d FLOPs per query and head
    (backward 2.5 x, as ``_flash_attention_times``); unfused, two batched
    GEMMs per head as the self-attention's. Elementwise work at HBM speed on
    the bytes ``cross_attention_bytes`` keeps."""
    t, b = plans.tp.astype(float), plans.mbs.astype(float)
    s_enc, s_dec = float(workload.seq_len), float(model.decoder_seq_len)
    peak = gpu.peak_bf16_tflops * 1e12
    hbm = gpu.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    timer = _gemm_timer(gpu, c)
    weight_timer = _gemm_timer(gpu, c, *_quantised_gemm(c, workload, sw, gpu))
    gemms = 0.0
    for x in cross_attention_linears(model):
        tokens = b * (s_enc if x.name == "cross_kv" else s_dec)
        flops, n, k, scale = _linear_gemm(x, t)
        gemms = gemms + weight_timer(flops * tokens * scale, tokens * scale, n, k)
    core_flops = 4.0 * s_enc * model.q_width / t * b * s_dec
    if sw.flash_attention:
        core = core_flops / (peak * c.attention_efficiency_of(gpu, sw.attention_kernel))
        core_backward = 2.5 * core
    else:
        core = timer(core_flops, b * s_dec, s_enc, model.head_dim)
        core_backward = 2.0 * core
    traffic = c.elementwise_traffic_factor / hbm * cross_attention_bytes(
        model, s_enc, s_dec, b, t, plans.sp, 0, sw.flash_attention)
    return {"forward": gemms + core + traffic, "gemm": gemms, "core": core,
            "core_backward": core_backward}


def _dense_mlp_bytes(model: ModelSpec, tokens, t, sp):
    """The MLP's share of ``_elementwise_bytes_per_layer`` for GPT shapes: of
    Korthikanti's 34 s b h per layer, 4 h (the second norm's and the MLP's
    inputs) kept whole without SP and the 16 h of a 4h GeLU MLP split over tp."""
    h = model.hidden_size
    return tokens * (np.where(sp, 4.0 / t, 4.0) * h + 16.0 * h / t)


def _moe_block_times(model: ModelSpec, workload: Workload, plans: PlanTable, cluster: Cluster,
                     c: PerfConstants, sw: SoftwareFeatures, gemm, weight_gemm,
                     tokens) -> dict:
    """Forward seconds and bytes of one MoE block (in place of the MLP) on one GPU.
    ``gemm`` times bf16 GEMMs (the router), ``weight_gemm`` the run's precision
    (the experts, the shared experts).

    Tokens: with sequence parallelism each of the tp ranks routes its 1/t of
    the micro-batch's s b / cp tokens (``tokens``). Each token goes to top-k
    experts; balanced routing sends as many copies to a rank as it sends out,
    and expert tensor parallelism gathers the etp ranks' copies, so a rank's
    E/ep local experts see ``tokens/t * k * etp`` copies, ``M = tokens/t * k *
    etp * ep / E`` per expert. The expert GEMMs (up: h x u F/etp, down:
    F/etp x h) go through the same roofline as every GEMM, so a small M (many
    experts, small micro-batches) runs below the large-GEMM efficiency (the
    1/M term of ``gemm_time_s``); FLOPs are the balanced share times the
    busiest rank's load (``SoftwareFeatures.moe_expert_load``). The router's h x E GEMM runs on
    every rank's tokens; the shared experts are a dense MLP split over tp.

    Traffic (``traffic_s``): what the permute, activation, FP8-cast and unpermute
    kernels stream per routed copy (``_routed_copy_bytes``) at HBM speed.

    Token traffic (``ep_comm``, dispatch and combine of one forward): with the
    all-to-all dispatchers each rank sends each of its copies to the rank of
    its expert, (ep - 1)/ep of them leave the GPU, over NVLink to ranks of its
    domain and over the scale-out network to the others (the expert group is
    ep ranks at stride etp in megatron-core's tp-cp-ep-dp-pp order), and etp >
    1 adds an all-gather of the copies over the etp ranks. The allgather
    dispatcher instead gathers every token of the ep x etp group on each rank
    and reduce-scatters the outputs. Combine moves what dispatch moved. FP8
    training keeps the dispatch in bf16 (megatron-core casts inside the
    experts), so 2 bytes an element.
    """
    h, k, n_exp = model.hidden_size, model.moe_topk, model.num_experts
    t = plans.tp.astype(float)
    ep, etp = plans.ep.astype(float), plans.etp.astype(float)
    up = 2 if model.mlp_kind == "swiglu" else 1
    ffn_e = model.moe_ffn_hidden_size
    local = tokens / t
    copies = local * k * etp
    per_expert = copies * ep / n_exp
    load = sw.moe_expert_load
    expert_up = weight_gemm(2.0 * h * up * ffn_e * k / t * load, up * ffn_e / etp, h,
                            m=per_expert)
    expert_down = weight_gemm(2.0 * ffn_e * h * k / t * load, h, ffn_e / etp, m=per_expert)
    router = gemm(2.0 * h * n_exp / t, n_exp + 0.0 * t, h, m=local)
    shared_up = shared_down = 0.0
    if model.moe_shared_expert_ffn_hidden_size:
        shared = mlp_linears(model, model.moe_shared_expert_ffn_hidden_size)
        shared_up, shared_down = (weight_gemm(fl, n, kk, m=tokens * scale)
                                  for fl, n, kk, scale in (_linear_gemm(x, t) for x in shared))
    hbm = cluster.gpu.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    regroups = np.where((n_exp / ep > 1) & (sw.moe_dispatcher == "alltoall"), 2.0, 0.0)
    traffic = copies * _routed_copy_bytes(model, workload.precision != "bf16", etp,
                                          quantised_cast_bytes(workload, sw, cluster.gpu),
                                          regroups) * load / hbm
    return {"gemm": expert_up + expert_down + router + shared_up + shared_down,
            "up_gemm": expert_up + shared_up, "traffic_s": traffic,
            "ep_comm": _dispatch_combine_s(model, cluster, c, sw, local, ep, etp),
            "expert_kernels_s": expert_kernels_s(
                c, sw, n_exp / ep, expert_quantisation_kernels(workload, sw, cluster.gpu))}


def expert_kernels_s(c: PerfConstants, sw: SoftwareFeatures, local_experts,
                     quant_kernels: tuple = (0.0, 0.0)) -> tuple:
    """(forward, backward) seconds of one MoE layer's per-expert kernel costs in
    one micro-batch on one GPU: what its local experts' kernels cost beyond their
    FLOPs and bytes.

    megatron-core's grouped expert MLP (``TEGroupedMLP``, Transformer Engine's
    ``GroupedLinear``) runs one GEMM per local expert (TE's grouped GEMM loops
    over the experts' GEMMs in C++), and in FP8 quantises each expert's GEMM
    input apart (TE ``split_quantize``): per expert the fc1 and fc2 forward GEMMs,
    their data- and weight-gradient GEMMs, and in FP8 the quantisation of the two
    forward inputs and the two output gradients (``moe_expert_kernels``). Each
    such kernel takes at least ``kernel_gpu_floor_s`` on the GPU. A
    quantisation is ``quant_kernels`` = (per local expert, per group) kernels
    by recipe (``fp8.expert_quantisation_kernels``): current scaling computes
    each expert's amax and scale before its cast (3 an expert), MXFP8 and
    blockwise cast each expert in one, delayed scaling casts them all in one
    fused kernel. Until 2026-11-29 every recipe was priced at one kernel an
    expert. Its launch,
    ``kernel_launch_host_s`` of host time, is on the GPU's clock too unless the
    step runs as one CUDA graph (``cuda_graph`` ``full-iteration``): the MoE
    layer copies its token counts to the host before sizing its buffers
    (``moe_layer_overhead_s``), so the queue is empty when the experts' kernels
    are launched, and the GPU waits for each. Transformer Engine's scoped graphs
    (attention, router, preprocess) leave the experts eager. So the cost grows
    with the local experts, E / ep: DeepSeek-V3 at EP 8 keeps 32 a GPU, at EP 64
    four. Nothing here is fitted."""
    kernels = c.moe_expert_kernels
    if not kernels:
        return 0.0, 0.0
    per_kernel = c.kernel_gpu_floor_s + (
        0.0 if sw.cuda_graph == "full-iteration" else c.kernel_launch_host_s)
    gemms = kernels.get("gemms", 0.0)
    sites = kernels.get("quantisations", 0.0)
    per_expert, per_group = quant_kernels
    local = np.asarray(local_experts, float)
    # A third of the GEMMs (fc1, fc2) and half of the quantisations (the inputs)
    # run in the forward; the rest in the backward.
    quants = sites / 2.0 * (per_expert * local + per_group)
    forward = (gemms / 3.0 * local + quants) * per_kernel
    backward = (2.0 * gemms / 3.0 * local + quants) * per_kernel
    return forward, backward


def _routed_copy_bytes(model: ModelSpec, quantised: bool, etp, cast_bytes: float,
                       regroups=0.0) -> float:
    """HBM bytes the forward of one MoE layer moves per routed token copy outside
    its GEMMs, at streaming speed (not the dense layers' fitted elementwise
    factor: these are whole-tensor copies and casts, megatron-core
    ``moe_utils.permute``/``unpermute`` and the expert activation):

    * permute: read the token (2h), write its copy (2h); unpermute: read the
      expert output (2h), write the weighted copy back (2h) before the sum;
    * the activation: read the up-projection output (2 x 2F for SwiGLU's gate
      and up, 2F for GeLU) and write its output (2F), F = expert FFN / etp;
    * ``regroups`` more copies of the token (read 2h, write 2h each):
      megatron-core's alltoall dispatcher sorts the received copies by local
      expert after the exchange and back before it (token_dispatcher.py
      "Permutation 2" / "Unpermutation 2", ``sort_chunks_by_idxs``) wherever a
      rank holds more than one expert, 2 there (``_moe_block_times``); the
      fused dispatchers write the copies in place;
    * FP8 and NVFP4: quantise the copy (h) and the activation output (F) for
      the expert GEMMs at the recipe's bytes per element (``cast_bytes``,
      heuristics/fp8.yaml: the bf16 read, twice for current scaling, and both
      layouts written), as the dense layers' inputs are (``quantised_cast_bytes``).
      Until 2026-11-28 a flat 3 B (one read, one layout): with the recipe's
      bytes, before a refit, S19 4.9% -> 4.4%, FP8 tensorwise 11.8% -> 9.9%.

    Counted for every dispatcher, although HybridEP writes the copies
    expert-major itself (megatron-core 0.16 ``_HybridEPManager``: no permute):
    counting 0, 1 or 2 passes by dispatcher raised the refit MoE MAPE (S18 6.1%
    -> 8.1%, S19 9.9% -> 11.4%), so these bytes stand for HybridEP's own HBM
    traffic too. The alltoall dispatcher's regrouping copies, counted since the
    per-expert kernels are priced (``expert_kernels_s``), took the MoE rows
    from 4.9% to 4.6% in-sample (refitted).
    """
    h = model.hidden_size
    f = model.moe_ffn_hidden_size / np.asarray(etp, dtype=float)
    up = 2.0 if model.mlp_kind == "swiglu" else 1.0
    copy = 8.0 * h + 2.0 * up * f + 2.0 * f + regroups * 4.0 * h
    if quantised:
        copy = copy + cast_bytes * (h + f)
    return copy


def _dispatch_combine_s(model: ModelSpec, cluster: Cluster, c: PerfConstants,
                        sw: SoftwareFeatures, local_tokens, ep, etp):
    """Seconds of one MoE layer's forward dispatch plus combine on one GPU
    (``_moe_block_times``)."""
    gpu = cluster.gpu
    nv = gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ib = gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    token_bytes = model.hidden_size * BF16_BYTES
    group = ep * etp
    if sw.moe_dispatcher == "allgather":
        k_in = members_in_domain(group, 1, cluster.nvlink_domain_gpus)
        gathered = group * local_tokens * token_bytes
        one = gather_s(c, gathered, group, k_in, nv, ib)
        return np.where(group > 1, 2.0 * one, 0.0)
    in_domain = members_in_domain(ep, etp, cluster.nvlink_domain_gpus)
    if sw.moe_dispatcher.startswith("flex"):
        nvlink_copies, network_copies = _fused_dispatch_copies(model, ep, in_domain)
    else:
        # megatron-core's alltoall dispatcher permutes top-k copies of each token
        # and sends every copy to its expert's rank, duplicates included.
        nvlink_copies = model.moe_topk * (in_domain - 1.0) / ep
        network_copies = model.moe_topk * (ep - in_domain) / ep
    over_nvlink = local_tokens * token_bytes * nvlink_copies
    over_network = local_tokens * token_bytes * network_copies
    copies = local_tokens * model.moe_topk * token_bytes
    a2a = np.maximum(over_nvlink / nv, over_network / ib) + c.comm_latency_s
    gather = np.where(etp > 1, gather_s(c, copies * etp, etp, etp, nv, ib), 0.0)
    return np.where(ep > 1, 2.0 * a2a, 0.0) + 2.0 * gather


def _distinct_holders(num_experts: int, topk: int, holders):
    """Expected number of ``holders`` (ranks or NVLink domains, each holding an
    equal share of the experts) that a token's ``topk`` distinct experts touch,
    with the experts drawn uniformly, as a force-balanced router draws them:
    holders x (1 - P(none of one holder's experts is drawn)), the hypergeometric
    C(E - E/n, k) / C(E, k)."""
    holders = np.asarray(holders, dtype=float)
    own = num_experts / holders
    miss = np.ones_like(holders)
    for i in range(topk):
        miss = miss * np.maximum(0.0, num_experts - own - i) / (num_experts - i)
    return holders * (1.0 - miss)


def _fused_dispatch_copies(model: ModelSpec, ep, in_domain):
    """(NVLink, network) copies of one token that DeepEP/HybridEP (megatron-core's
    flex dispatcher) move, per token of the sending GPU.

    Across NVLink domains DeepEP sends a token once over the network to each
    remote domain that holds any of its experts, to the GPU of the same local
    index there, which forwards it over NVLink to the target ranks (DeepSeek-V3
    report, section 3.2.2; DeepEP's ``get_dispatch_layout`` counts
    ``num_tokens_per_rdma_rank`` once per node, not per expert; HybridEP is
    hierarchical the same way). So the network carries one copy per distinct
    remote domain instead of one per remote expert: at EP 32 over four 8-GPU
    nodes with top-8 of 256 experts, 2.7 copies instead of 6.

    Within the domain each routed copy is counted, as for the alltoall
    dispatcher. DeepEP also sends a token once per target rank there, but
    counting that (Qwen3-30B-A3B at EP 8: 4.6 copies instead of 7) overpredicts
    the in-domain published runs by a further 10 points (26-28% over), so the
    in-domain exchange is bound by more than its bytes; the per-copy count is
    the one the measurements support until that is modelled."""
    ep = np.asarray(ep, dtype=float)
    domains = ep / in_domain
    network = _distinct_holders(model.num_experts, model.moe_topk, domains) \
        * (domains - 1.0) / domains
    nvlink = model.moe_topk * (in_domain - 1.0) / ep
    return nvlink, network


def _misaligned_head_slowdown(model: ModelSpec, gpu: GPU) -> float:
    """How much slower unfused attention's batched GEMMs run when the head dimension
    breaks the tensor cores' alignment.

    Each head's score and context GEMMs have the head dimension d as their K (or
    N) and as the stride between heads. Half-precision tensor-core kernels load
    operands in 16-byte vectors, so they need d a multiple of 8 elements (NVIDIA
    Matrix Multiplication Background User's Guide, "Tensor Core Requirements":
    FP16 dimensions in multiples of 8); otherwise cuBLAS runs the GEMM on the CUDA
    cores, at the GPU's non-tensor FP16 peak instead of its tensor-core peak
    (A100: 78 against 312 TFLOPS, a factor 4). Fused (flash) attention kernels
    take only aligned head dimensions, so this concerns the unfused path. 1 where
    d is aligned or the GPU publishes no non-tensor figure. The FP16 figure: the
    model does not tell fp16 from bf16 (A100's non-tensor BF16 peak is half, 39
    TFLOPS), and the shipped rows that reach this term (BLOOM's search) ran fp16.
    """
    if model.head_dim % 8 == 0 or not gpu.peak_fp16_vector_tflops:
        return 1.0
    return gpu.peak_bf16_tflops / gpu.peak_fp16_vector_tflops


def _cp_correction_s(model: ModelSpec, s: float, b, t, cp, hbm_bytes_per_s):
    """Forward + backward seconds per layer that ring attention spends merging
    its cp partial results. Transformer Engine's context-parallel attention
    (``AttnFuncWithCPAndKVP2P``) runs one attention kernel per ring step on a
    (s/cp) x (s/cp) block and folds each step's output into an fp32 accumulator
    with the log-sum-exp correction: per step it reads the step output (2 B)
    and reads and writes the accumulator (4 + 4 B) per local query element of
    width h/t; the backward accumulates dQ, dK and dV in fp32 the same way, about
    twice that. (cp - 1) corrected steps of s b/cp tokens: a cost that grows with
    (cp - 1)/cp of the whole sequence while the rest of the layer shrinks by 1/cp.
    Zero without CP."""
    per_step = s * b / cp * model.num_heads * model.value_head_dim / t * (2.0 + 8.0) * 3.0
    return np.where(cp > 1, (cp - 1.0) * per_step / hbm_bytes_per_s, 0.0)


def _quantised_gemm(c: PerfConstants, workload: Workload, sw: SoftwareFeatures,
                    gpu: GPU) -> tuple[float | None, float]:
    """(speed-up over bf16, bytes per input element) of the run's weight GEMMs
    (``fp8.quantised_gemm``), FP8 at its recipe's measured GEMM time (Hopper's
    blockwise GEMMs apply their block scales in the main loop and run 1.34x
    longer)."""
    recipe = workload_recipe(workload, sw, gpu)
    recipe_time = 1.0 if recipe is None else gemm_time_vs_per_tensor(recipe, gpu.generation)
    return quantised_gemm(workload.precision, c.fp8_gemm_speedup, gpu, recipe_time)


def _fp8_cast_bytes_per_layer(model: ModelSpec, tokens, t, bytes_per_element: float = 4.0,
                              kind: str = "dense"):
    """Bytes one layer's forward moves to cast its GEMM inputs to FP8 on one GPU.

    Transformer Engine casts each linear layer's bf16 input to FP8 and writes its
    transpose for the weight-gradient GEMM in the same kernel (delayed scaling's
    ``fp8_cast_transpose_fused``: read 2 B, write 1 + 1 B per element; the other
    recipes' figures, ``bytes_per_element``, are derived in heuristics/fp8.yaml),
    for every linear of the layer (``attention_linears``, ``mlp_linears``): a
    column-parallel or replicated one's input whole (gathered over TP), a
    row-parallel one's split over t. For GPT shapes that is 2h + (h + f)/t per
    token (QKV and first-MLP inputs whole, projection and second-MLP inputs
    split; SwiGLU's f is after the gate); the projection's input is the heads'
    value width, and MLA casts its down- and up-projections' inputs too. An MoE
    layer's MLP is its shared experts' (the routed copies' casts are
    ``_routed_copy_bytes``'). The backward casts the output gradients the same
    way, which the 3 x forward of elementwise work already counts. Not there in
    bf16; NVFP4's casts (heuristics/fp8.yaml ``nvfp4``) take the same inputs."""
    ffn = model.moe_shared_expert_ffn_hidden_size if kind == "moe" else model.ffn_hidden_size
    # Each GEMM's K is its input's width on this GPU (split where row-parallel).
    widths = sum(k for _, _, k, _ in _layer_gemms(model, t, ffn))
    return bytes_per_element * tokens * widths


def _flash_attention_times(model: ModelSpec, s: float, tokens, t, peak_flops: float,
                           efficiency: float, cp=1.0, tile_keys: float = 0.0,
                           causal_keys: float = 0.0, causal: bool = True):
    """(forward, backward) seconds of one layer's fused attention core on one GPU
    for ``tokens`` query tokens (a micro-batch's s*b/cp).

    FLOPs as the FlashAttention benchmarks count them (Dao-AILab/flash-attention,
    benchmarks/benchmark_flash_attention.py, ``flops``): forward 4 s d per query
    token and head, 2 s (d_qk + d_v) where the value width differs (MLA), over the
    model's own heads (``attention_core_flops_per_token``: Qwen3's 32 heads of 128
    on a 2048-wide stream do twice the 4 s h a GPT shape would; DeepSeek-V3's MLA
    heads 2.86 times it), halved for a causal mask because the kernels skip the key
    blocks above the diagonal (FlashAttention-2, Dao 2023, Sec. 3.1.1: blocks whose
    column indices all exceed the row indices are skipped); backward 2.5 x forward,
    five matmuls against the forward's two, because it recomputes the scores
    (QK^T) instead of storing them. With context parallelism each rank's query
    chunk sees about s/2 causal keys on average (load-balanced chunks), so the
    per-token count is the same. Both run at ``efficiency`` of the bf16 peak
    (``heuristics/perf.yaml`` attention_efficiency); FP8 does not speed it up
    (Transformer Engine keeps attention in bf16 by default). Model FLOPs, and so
    MFU, still count the whole score matrix forward and 2 x forward backward.

    Short rows run below that: a kernel walks each query tile along its keys and
    pays a fixed cost per tile (loading the queries, the softmax rescale and the
    output / log-sum-exp writes; in the backward the dQ accumulation and the
    dK/dV writes) worth ``tile_keys`` keys of work, and a causal tile also
    computes the masked diagonal block (``causal_keys``). With L keys per query
    (s/2 causal, s without a mask) the efficiency is ``efficiency * L / (L +
    cp * tile_keys + causal_keys)``: ring context parallelism runs one kernel
    per ring step, so each query tile pays the fixed cost cp times. Measured on
    an H100 (benchmarks/gpu/attention.csv): 0.32 of the peak at 1K causal tokens,
    0.54 at 8K, 0.59 at 16K.
    """
    def seconds(keys: float, masked: bool) -> float:
        shortfall = keys / (keys + cp * tile_keys + (causal_keys if masked else 0.0))
        return attention_core_flops_per_token(model, keys) / t * tokens / (
            peak_flops * efficiency * shortfall)

    forward = seconds(0.5 * s if causal else s, causal)
    if causal and model.sliding_window:
        # Banded layers: each query sees at most the window's keys (the kernels skip
        # the blocks outside the band as they skip those above the diagonal), so the
        # row is short and the per-tile cost weighs: a 128-token band runs at about
        # a third of the kernel's efficiency. Averaged over the layers by their share.
        banded = seconds(banded_keys_per_query(model.sliding_window, s), True)
        share = model.banded_layers / model.num_layers
        forward = (1.0 - share) * forward + share * banded
    return forward, 2.5 * forward


def allreduce_s(c: PerfConstants, nbytes, n, members_per_domain, nvlink_bytes_per_s,
                ib_bytes_per_s):
    """Seconds of one training all-reduce of ``nbytes`` over ``n`` ranks
    (hierarchical where the group spans NVLink domains; reduce-scatter and
    all-gather are half of it). Its latency is the GPU's, as NCCL models it
    (``collective_base_latency_s`` plus ``nvlink_step_latency_s`` a ring step
    inside a domain, ``comm_latency_s`` across): in a training step the host
    runs ahead of the large GEMMs, so a collective's launch waits in the queue
    and only its own kernel's time is on the GPU's clock. Until 2026-11-29
    every ring step cost ``comm_latency_s``, the 10 us a step of a
    torch.distributed call timed from the host: a TP 8 all-reduce's 14 steps
    then cost 140 us against NCCL's 56 (refitted: S01 3.4% -> 2.8%, S15 held out
    19.4% -> 18.4%, S20 held out 8.4% -> 7.4%, S04 2.7% -> 3.0%; overall held out
    5.8% -> 5.7%)."""
    return hierarchical_allreduce_s(nbytes, n, members_per_domain, nvlink_bytes_per_s,
                                    ib_bytes_per_s, c.comm_latency_s, c.nvlink_step_latency_s,
                                    c.collective_base_latency_s)


def gather_s(c: PerfConstants, nbytes, n, members_per_domain, nvlink_bytes_per_s,
             ib_bytes_per_s):
    """Seconds of one training all-gather or reduce-scatter of a ``nbytes`` buffer
    over ``n`` ranks: NCCL's ring through every rank (``comm.ring_gather_s``), its
    steps at the latencies ``allreduce_s`` uses. Until 2026-12-02 half a
    hierarchical all-reduce, whose latency counted only k - 1 NVLink steps and
    half the collective's base."""
    return ring_gather_s(nbytes, n, members_per_domain, nvlink_bytes_per_s, ib_bytes_per_s,
                         c.comm_latency_s, c.nvlink_step_latency_s, c.collective_base_latency_s)


def _tp_comm_per_microbatch(model, cluster, c, t, tokens, layers, rc_layers,
                            async_backward_gemms=None):
    """Exposed TP communication of one micro-batch on one stage.

    Per layer 2 all-reduces forward and 2 backward of s*b*h bf16 (Shoeybi et
    al. 2019, Fig. 4); with SP the same volume as reduce-scatter + all-gather
    (Korthikanti et al. 2022, Sec. 4.2.2); full recompute repeats the forward
    pair. TP groups are innermost, so over NVLink while t fits the domain.

    The two backward collectives reduce the input gradients of the
    column-parallel layers (QKV and first MLP). megatron-core launches each
    asynchronously and computes that layer's weight gradient meanwhile
    (``LinearWithGradAccumulationAndAsyncCommunication``: "asynchronous
    communication overlapped with the weight gradient computation"), so with
    ``async_backward_gemms`` = (QKV, MLP-up) forward GEMM seconds, the size of
    those weight-gradient GEMMs, only what exceeds them is exposed.
    """
    gpu = cluster.gpu
    nbytes = tokens * model.hidden_size * BF16_BYTES
    k = members_in_domain(t, 1, cluster.nvlink_domain_gpus)
    one = allreduce_s(c, nbytes, t, k,
                      gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency,
                      gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency)
    if async_backward_gemms is None:
        backward = 2.0 * one
    else:
        backward = sum(np.maximum(0.0, one - g) for g in async_backward_gemms)
    exposed = layers * (2.0 * one + backward) + 2.0 * rc_layers * one
    return np.where(t > 1, (1.0 - c.tp_comm_overlap) * exposed, 0.0)


def _cp_comm_per_microbatch(model, cluster, c, sw, t, cp, tokens, layers, rc_layers,
                            attn_fwd_bwd_s, ring_correction_s):
    """Exposed context-parallel communication of one micro-batch on one stage,
    by the stack's scheme (``cp_comm_type``, ``context_parallel``): a ring over
    cp / a groups after an all-to-all inside groups of ``a`` ranks (p2p: a = 1;
    a2a: a = cp).

    Ring attention (Liu et al. 2023; Transformer Engine ``AttnFuncWithCPAndKVP2P``)
    passes each rank's K and V chunk (2 * tokens * kv_h / t bf16; after an
    all-to-all a rank holds a times the tokens of 1/a of the heads, the same
    bytes) around the ring, (ring - 1) sends forward and twice that backward (K,
    V and their grads), and overlaps each send with the attention block it
    feeds: only what exceeds the attention compute (forward + backward,
    ``attn_fwd_bwd_s``) is exposed. Each ring step past the first also merges
    its partial output (``ring_correction_s``, given for cp - 1 steps).

    The all-to-all (``AttnFuncWithCPAndQKVOA2A``, and the first stage of
    a2a+p2p) turns sequence-split Q, K and V into head-split ones before the
    attention and the output back after it, the backward their gradients: per
    layer and direction each rank sends (a - 1)/a of its tokens' Q (heads x
    d_qk), K and V (kv heads x (d_qk + d_v)) and output (heads x d_v) values
    over t, in bf16, over NVLink to the group's ranks in its domain and over
    the network to the others, each exchange waited for before the attention
    that reads it, so none of it hides; a recomputed layer exchanges its
    forward again. Nothing here is fitted.
    """
    gpu = cluster.gpu
    a = a2a_group_size(sw.cp_comm_type, model, t, cp, cluster.nvlink_domain_gpus).astype(float)
    ring = cp / a
    kv_bytes = 2.0 * tokens * model.kv_hidden_size / t * BF16_BYTES
    nv = gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ib = gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ring_bw = np.where(t * cp <= cluster.nvlink_domain_gpus, nv, ib)
    sends = 3.0 * (ring - 1.0) * p2p_s(kv_bytes, ring_bw, c.comm_latency_s)
    ring_s = np.where(ring > 1, layers * np.maximum(0.0, sends - attn_fwd_bwd_s), 0.0)
    ring_s = ring_s + layers * ring_correction_s * (ring - 1.0) / np.maximum(cp - 1.0, 1.0)
    per_token = (model.q_width + model.num_kv_heads * (model.head_dim + model.value_head_dim)
                 + model.num_heads * model.value_head_dim) / t * BF16_BYTES
    sent = tokens * per_token * (a - 1.0) / a
    in_domain = members_in_domain(a, t, cluster.nvlink_domain_gpus)
    one_way = np.maximum(sent * (in_domain - 1.0) / np.maximum(a - 1.0, 1.0) / nv,
                         sent * (a - in_domain) / np.maximum(a - 1.0, 1.0) / ib)
    exchange = one_way + 2.0 * c.comm_latency_s       # Q, K, V then the output
    a2a_s = np.where(a > 1, (2.0 * layers + rc_layers) * exchange, 0.0)
    return np.where(cp > 1, ring_s + a2a_s, 0.0)


def _output_params_per_gpu(model: ModelSpec, t):
    """The output layer (or the tied embedding copy) one GPU of the last stage holds."""
    return (output_layer_params(model) or embedding_params(model)) / t


def _stage_grad_params(model: ModelSpec, t, layers, plans: PlanTable, kinds, name: str,
                       single):
    """Parameters per GPU whose gradients the ``name`` stage holds: its layers
    (routed experts included) and its tables: the first stage the input
    embedding, the last the output layer (or the tied copy), a single stage the
    embedding and any untied output layer."""
    body, experts = _stage_params_per_gpu(model, t, layers, plans, kinds)
    if model.is_encoder_decoder:
        # One stage holds both stacks and the tables: already all in ``body``.
        return body + experts
    layers_only = body - _output_params_per_gpu(model, t)
    embedding, output = embedding_params(model) / t, output_layer_params(model) / t
    tables = {"first": embedding, "middle": 0.0, "last": _output_params_per_gpu(model, t)}
    return layers_only + experts + np.where(single, embedding + output, tables[name])


def _stage_params_per_gpu(model: ModelSpec, t, layers, plans: PlanTable, kinds=None):
    """(non-expert, routed-expert) parameters one GPU of the last stage holds:
    its layers and the output layer (or the tied embedding copy Megatron keeps
    there), split over TP; MoE layers' experts split over ep x etp."""
    output = _output_params_per_gpu(model, t)
    if model.is_encoder_decoder:
        # One stage holds both stacks, the shared embedding and T5's output bias.
        stacks = sum(kinds[k] * kind_params(model, k) for k in ("encoder", "decoder"))
        return (stacks + embedding_params(model) + output_layer_params(model)) / t, 0.0
    if not model.is_moe:
        return layers * layer_params(model) / t + output, 0.0
    non_expert, expert = moe_layer_params_per_gpu(model, t, plans.ep, plans.etp)
    return (kinds["dense"] * dense_layer_params_per_gpu(model, t) + kinds["moe"] * non_expert
            + output, kinds["moe"] * expert)


def _dp_comm(cluster, c, sw, plans, params, group, stride, backward_window_s,
             forward_window_s):
    """Exposed data-parallel gradient reduction (+ distributed-optimizer gather)
    of ``params`` per GPU over a group of ``group`` ranks ``stride`` apart.

    Without the distributed optimizer: all-reduce of the gradients
    (``grad_reduce_bytes`` each). With it (Megatron distributed optimizer,
    ZeRO-1 like): reduce-scatter of the gradients plus all-gather of the bf16
    parameters, each half an all-reduce of its bytes. Dense parameters reduce
    over dp*cp ranks at stride t; routed experts over their expert data-parallel
    group, tp*cp*dp/(ep*etp) ranks at stride ep*etp (megatron-core's expert rank
    order etp-ep-edp-pp).

    The two collectives hide behind different windows. With --overlap-grad-reduce
    the gradient buckets go out while the last micro-batch's backward runs
    (``backward_window_s``), so only the part longer than that backward is
    exposed. With --overlap-param-gather the parameter all-gather of each bucket
    is started after the optimizer step and waited on by the forward pre-hook of
    the bucket's first module in the next step (megatron-core
    ``DistributedDataParallel._make_forward_pre_hook``), so it hides behind the
    first micro-batch's forward (``forward_window_s``). Without an overlap its
    collective is all exposed. Overlapped, the parameters go in buckets of
    max(40M, 1M x group) parameters (megatron-core's default, ``grad_bucket_params``
    in heuristics/perf.yaml), filled from the last layer back: the bucket holding the
    first layers is complete only when the backward ends, and the first forward
    needs its own bucket gathered before it starts, so one bucket's share of each
    collective is always exposed (all of it where one bucket holds everything).
    """
    gpu = cluster.gpu
    k = members_in_domain(group, stride, cluster.nvlink_domain_gpus)
    nv = gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ib = gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    grad_bytes = params * sw.grad_reduce_bytes
    reduce = np.where(plans.distributed_optimizer, gather_s(c, grad_bytes, group, k, nv, ib),
                      allreduce_s(c, grad_bytes, group, k, nv, ib))
    gather = np.where(plans.distributed_optimizer,
                      gather_s(c, params * BF16_BYTES, group, k, nv, ib), 0.0)
    bucket = np.maximum(c.grad_bucket_params["min"], c.grad_bucket_params["per_rank"] * group)
    last = np.minimum(1.0, bucket / np.maximum(params, 1.0))
    if sw.overlap_grad_reduce:
        reduce = np.maximum(last * reduce, reduce - backward_window_s)
    if sw.overlap_param_gather and sw.overlap_grad_reduce:
        # Megatron-LM accepts --overlap-param-gather only with --overlap-grad-reduce.
        gather = np.maximum(last * gather, gather - forward_window_s)
    return reduce + gather


def _sharded_dp_comm_per_microbatch(model, cluster, c, sw, t, cp, dp, layers, stage_params,
                                    window_s):
    """Exposed fully-sharded data-parallel traffic of one micro-batch (PyTorch FSDP).

    Per layer (FSDP wraps each transformer block as a unit) and for the
    embedding/output unit: ``param_gathers_per_microbatch`` all-gathers of the
    bf16 parameters and one reduce-scatter of the gradients
    (``grad_reduce_bytes`` each), each half a (hierarchical) all-reduce of its
    bytes over the dp*cp group, every micro-batch. With overlap only the part
    longer than the micro-batch's compute ``window_s`` is exposed, and never
    less than the first unit's gather, which nothing can hide.
    """
    gpu = cluster.gpu
    group = dp * cp
    k = members_in_domain(group, t, cluster.nvlink_domain_gpus)
    nv = gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ib = gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency

    def unit(params):
        gather = gather_s(c, params * BF16_BYTES, group, k, nv, ib)
        reduce = gather_s(c, params * sw.grad_reduce_bytes, group, k, nv, ib)
        return gather, sw.param_gathers_per_microbatch * gather + reduce

    output = (output_layer_params(model) or embedding_params(model)) / t
    first_gather, per_layer = unit((stage_params - output) / np.maximum(layers, 1.0))
    _, per_output = unit(output)
    comm = layers * per_layer + per_output
    if not sw.overlap_sharded_comm:
        return comm
    return np.maximum(first_gather, comm - window_s)


def _optimizer_s(c, plans, t, cp, dp, params, experts, hbm_bytes_per_s):
    """Adam step: memory bound, ``optimizer_bytes_per_param`` per parameter of
    this GPU's shard (sharded over dp*cp by the distributed optimizer, routed
    experts over their expert data-parallel group)."""
    shard = np.where(plans.distributed_optimizer, params / (dp * cp) + experts / plans.edp,
                     params + experts)
    return shard * c.optimizer_bytes_per_param / hbm_bytes_per_s
