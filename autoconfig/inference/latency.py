"""Analytical latency of serving, vectorised over an InferencePlanTable.

**One engine step of one pipeline stage** processes ``n_d`` sequences that
each generate one token (decode, reading a KV context of ``c_d`` tokens) and
``n_p`` prompt tokens (prefill, causal context ``c_p``), on each GPU of the
stage:

    t_stage = max(t_gpu, kernels * t_launch)
    t_gpu   = GEMM kernels + attention kernels + elementwise passes + tp_comm + p2p
              (+ MoE dispatch) + kernel floor

Kernels run one after another, each bound by its own compute or memory traffic
(a roofline per kernel, Williams et al. 2009), and the step is their sum:

- GEMM kernels: ``max(GEMM compute, weights + KV written)``. Compute is the
  weight GEMMs of the stage's layers and the output layer (2 FLOPs per weight
  per token, Kaplan et al. 2020, Table 1) by the training model's GEMM law
  ``step_time.gemm_time_s``: decode tokens at the large-GEMM efficiency (M =
  infinity: their weight stream is the memory side), prompt tokens at the
  efficiency of a GEMM as tall as the step's tokens, ``1 + f r (1/M + 1/N +
  1/K)`` slower, the same law training is validated with. A 128-token prompt
  pays about 2x, a 2,048-token one about 1.1x: short prompts are not
  compute-bound at the large-GEMM rate. (Tried instead, 2026-11-29: prompt
  tokens at M = infinity too, so the step is the plain roofline max(compute,
  weights streamed), which isolated GEMMs follow: CUDA-graph replays on an H100,
  benchmarks/gpu/graph_gemm.csv, matrices >= 4096 x 4096, measured/roofline
  0.89-1.10 at every M from 1 to 16K, against 0.49 at M = 256 and 0.66 at
  1,024 with the penalty. LMDeploy 0.1's TTFT improved 23.3% -> 20.7%, but
  SGLang's went 29.9% -> 37.7% (TPOT 34.9% -> 39.5%), TensorRT-LLM's latency
  23.3% -> 26.9% and vLLM's TTFT 20.2% -> 24.5%: the penalty stands in for
  costs of mixed and prefill steps the step model lacks, not taken.) fp8
  weights compute ``fp8_gemm_speedup`` faster and read half the input bytes, as
  in training (``gemm_time_s``; tried instead: the forward-only FP8 GEMM speed
  measured on an H100, 1.84x,
  benchmarks/gpu/gemm_fp8.csv; TensorRT-LLM's H200
  offline rows moved from 13-23% low to 2-14% low, but its H100 rows from
  -5..+11% to +5..+24% and vLLM's FP8 rows from 7-42% to 18-52% high, FP8
  throughput MAPE 17.2% -> 17.6%: not taken). The stage's weights stream once per step at
  ``hbm_efficiency``: decode at small batch is memory-bound, at large batch
  compute-bound.
- attention kernels: the prompt tokens' attention core ``2 * context * a *
  (d_qk + d_v) / tp`` per token and layer (QK^T and AV) at the large-GEMM efficiency, plus the
  decode attention, bound by reading each sequence's KV cache (``n_d * c_d``
  tokens of K and V) at the engine's ``decode_attention_hbm_efficiency``, and no
  faster than its measured rate per SM allows on the GPU's SMs
  (``Engine.decode_attention_bytes_per_s``):
  paged or masked decode kernels stream it well below the copy bandwidth, and
  at large batch and long context this read is a cost beside the compute-bound
  GEMMs, not hidden under them; its compute side is the decode form of the
  core (``decode_attention_flops_per_token``: MLA's latent scored by every
  head, 3.4x the expanded count for DeepSeek-V3, which makes it compute-bound).
- elementwise passes: the residual-add + norm kernels and the MLP's activation
  read and write every token's activations (``_elementwise_excess_s``): each
  takes the larger of that traffic at HBM speed and the kernel floor below.
- unfused attention (``Engine.attention_score_bytes`` > 0: megatron-core's local
  DotProductAttention, no flash kernel) writes every score to HBM and reads it
  back through mask, softmax and the value product: a prompt scores its whole
  window (the causal half masked, not skipped), a decode step its context, each
  score that many bytes at ``hbm_efficiency``. Fused kernels keep them on chip (0).
- tp_comm: 2 all-reduces per layer of ``tokens * h`` bf16 activations
  (Shoeybi et al. 2019, Sec. 3) by the engine's algorithm for that size
  (``autoconfig.inference.collectives``: one-shot for small decode messages,
  NCCL's ring for the rest and across nodes). Where the engine fuses each
  row-parallel GEMM with its all-reduce (TensorRT-LLM's ``gemm_allreduce_plugin``:
  finished output tiles are reduced through the NVLink switch while the GEMM
  computes the next), the pair takes ``max(GEMM, all-reduce)`` instead of their
  sum, so each all-reduce shows only for what it outlasts its GEMM
  (``_fused_allreduce_hidden_s``); only inside one NVLink domain, on the GPU
  generations the kernel is built for, and for dense layers.
- p2p: the activations sent to the next stage (NVLink in a domain, else InfiniBand).
- kernel floor: a stage launches ``layers * kernels_per_layer`` kernels; the GPU
  can run a step no faster than the host issues them (``kernel_launch_s``:
  eager launches, or CUDA-graph replay). Launches are asynchronous, hence the
  max: a small model at batch 1 is launch-bound whatever its FLOPs, a large one
  never is. Where an engine's graphs cover only decode batches up to a size
  (``Engine.graph_steps``, SGLang's ``cuda_graph_max_bs``), a larger batch and a
  prefill launch eagerly (``Engine.launch_s``), each kernel paying its Python
  dispatch: a 70B model at TP 4 then takes ~30 ms of host time a step, more
  than its GPU needs for a decode step just past the cap. This is the per-step
  cost that does not shrink with the model. An engine that runs an MoE layer's
  router, dispatch and experts as operators of their own launches more there,
  some per local expert
  (``Engine.moe_layer_kernels``: the worker's SequentialMLP calls every expert).
- kernel floor: no kernel runs shorter than ``kernel_gpu_floor_s`` of GPU time
  (heuristics/inference.yaml, measured under CUDA-graph replay: start, the
  first wave's memory latency, the tail), so each layer's small kernels
  (norms, rotary, activation, KV append, attention at small batch, GEMMs
  whose weights stream in less) take the floor instead of their rooflines
  (``_kernel_floor_excess_s``). Unlike the launch floor this is GPU time: CUDA
  graphs do not remove it, and a small model at small batch spends most of
  its step on it.
- the engine's host ``step_overhead_s`` (scheduling, sampling, input
  preparation) is added once per engine step, outside the stages.

**Static batches** (every engine, and the ``static`` mode of in-flight ones:
``b`` requests that arrive together). Prefill of the whole batch, then
``s_out - 1`` decode steps:

    TTFT    = (m + pp - 1) * t_stage(prefill of b/m prompts) + prefill steps * overhead
              (+ TPOT where the engine's prefill stops a token short and the first
              decode step samples the first token: ``Engine.prefill_samples_first_token``)
    TPOT    = max(m, pp) * t_stage(decode of b/m) + overhead
              (m + pp - 1) * t_stage(decode of b/m) + overhead   where steps do not overlap
    latency = TTFT + (s_out - 1) * TPOT

with ``m`` micro-batches (GPipe fill and drain, Huang et al. 2019, Sec. 2.2) as
the engine splits the batch (``Engine.pipeline_split``). An in-flight engine keeps
``pp`` micro-batches in flight, so the next step's first micro-batch enters stage
1 as the last one leaves it; an engine whose step loop runs every micro-batch
through the stages, then samples at the last stage and broadcasts the tokens
before the next step (FasterTransformer's ``ParallelGpt::forward``: the ``ite``
loop, then ``ftNcclBroadCast`` of the output ids and a stream synchronise; the
``decode_overlaps_steps`` flag), fills and drains the pipeline every token, as
its prefill does. Where the split is a
setting, the fastest power of two <= b for each phase; FasterTransformer's
fixed rule (``b / pp`` requests a micro-batch where ``pp`` divides ``b``, else
the whole batch, a prefill's halved to at most 1,024 tokens), so a batch of 4
on 8 stages runs whole; megatron-core's static path cuts a decode step only
past the batch x tokens threshold its prefill set. An engine that chunks prompts runs
``ceil(b s_in / max_batched_tokens)`` prefill steps, each paying its overhead.

**Continuous batching at steady state** (``continuous`` mode): ``C`` requests
in flight per replica, each arriving as another leaves (a closed loop, as
serving benchmarks at a fixed concurrency run). A request lives about
``s_out`` steps, so each step starts ``C / s_out`` new requests: beside ``C``
decode tokens it prefills ``C s_in / s_out`` prompt tokens (Agrawal et al.
2024, Sarathi-Serve: chunked prefills piggybacked on decodes). With ``pp``
stages the engine keeps ``pp`` micro-batches of ``C/pp`` in flight (an engine
whose steps cross the stages one at a time, ``decode_overlaps_steps`` false,
one of ``C``):

    TPOT = pp * t_stage(C/pp decodes + their prompt share) + overhead / k
    TTFT = (k / 2 + o) * TPOT + steps * (pp * t_stage(decodes + window) + overhead)

(half a run of ``k`` decode steps waiting for the scheduler, ``k =
Engine.decode_steps``, 1 unless multi-step scheduling is asked: then the host
overhead is paid once per run; ``o`` = 1 where the scheduler builds each step
while the one before runs (``Engine.overlap_schedule``): the step built when the
request arrived runs without it; then the steps that prefill its prompt beside
the ``C / s_out`` others that arrived in the same step (``prompt_window``: the
window holds ``1 + C / s_out`` prompts as an arrival sees it, in chunks of the
step's token budget, or whole where the engine does not chunk); then, where the
engine's prefill stops a token short, the decode step that samples the first
token). Poisson arrivals come in bursts, which lengthen the steps an arrival
meets and crowd the one that admits it (``burst_wait_s``, added where no token
budget cuts the window short).

An engine that does not mix (``Engine.mixed_prefill`` False: prefill-first)
runs the prompts as forwards of their own while the decodes wait: a decode
step carries no prompt tokens, and per decode step ``n = C / s_out`` prompts
are prefilled, batched into one forward when ``n >= 1`` and one at a time
every ``1 / n`` steps otherwise, so TPOT adds ``min(n, 1) * (pp *
t_stage(max(n, 1) prompts) + overhead)``: each such forward streams the
weights again, which a mixed step shares with the decodes (with multi-step
scheduling one forward per run of ``k`` steps takes the ``k n`` prompts the run
gathered). A new prompt's forward then holds no decodes either, and an arrival
waits for the decode run or the forward under way, in proportion to the time
each takes, rather than for ``k / 2`` mean steps.
"""

from dataclasses import dataclass, fields

import numpy as np

from autoconfig.core.comm import members_in_domain, p2p_s
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import (ModelSpec, attention_core_flops_per_token,
                                   attention_linears, attention_weight_params,
                                   banded_keys_per_query, layer_matmul_flops_per_token,
                                   logits_flops_per_token, mlp_linears)
from autoconfig.inference.collectives import (kernel_gpu_floor_s, moe_block_extra_kernels,
                                              tp_allreduce_s)
from autoconfig.inference.dispatch import arrival_cv2
from autoconfig.inference.constants import fp8_attention_speedup
from autoconfig.inference.engine import Engine, fp8_prompt_attention, get_engine
from autoconfig.inference.memory import (ACTIVATION_BYTES, expert_bytes_per_gpu,
                                         kv_bytes_per_token_per_gpu, moe_layer_share,
                                         per_layer_mean, weights_bytes_per_gpu)
from autoconfig.inference.plan import InferencePlanTable, InferenceWorkload, stage_layers
from autoconfig.training.fp8 import quantised_gemm
from autoconfig.training.step_time import (BF16_BYTES, PerfConstants, _layer_gemms,
                                           _linear_gemm, gemm_time_s, load_constants)

ALLREDUCES_PER_LAYER = 2
"""Forward of a Megatron layer: one after the attention output projection, one
after the MLP down projection (Shoeybi et al. 2019, Sec. 3, the g operator)."""
MODES = ("static", "continuous")
COUNTED_GEMMS = 4
"""Weight GEMMs among an engine's ``kernels_per_layer`` (QKV, output projection,
MLP up and down, as each engine file counts them for a dense layer)."""


@dataclass(frozen=True)
class InferenceLatency:
    """Seconds and rates of every plan (numpy arrays, one entry per plan)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    latency_s: np.ndarray
    prefill_microbatches: np.ndarray
    decode_microbatches: np.ndarray
    activation_tokens: np.ndarray
    """Tokens of the largest forward pass a GPU runs (sets the activation memory)."""
    tpot_parts: "TpotParts"
    """TPOT by part (for reports)."""
    ttft_parts: "TtftParts"
    """TTFT by part (for reports)."""

    @property
    def decode_tp_comm_s(self) -> np.ndarray:
        """TP all-reduce seconds of a token's decode step(s)."""
        return self.tpot_parts.tp_allreduce_s


@dataclass(frozen=True)
class StepLoad:
    """What one engine step of one stage processes (arrays broadcast against (plans, K))."""

    decode_seqs: object
    decode_context: float
    prefill_tokens: object
    prefill_context: float
    logits_rows: object
    prefill_step_share: object = None
    """Where the load is an average over steps (steady state): the share of them
    that carry prompt tokens, the rest decoding only; None: every step carries
    ``prefill_tokens``. It decides how many launch through the engine's graphs."""


@dataclass(frozen=True)
class StepTerms:
    """The GPU's terms of an engine step (seconds, arrays), run one after another."""

    gemm_s: np.ndarray
    """Weight and logits GEMMs (compute or weight stream, whichever binds)."""
    attention_s: np.ndarray
    """Attention cores: the prompts' FLOPs and the decodes' KV-cache reads."""
    tp_allreduce_s: np.ndarray
    pipeline_send_s: np.ndarray
    expert_dispatch_s: np.ndarray
    small_kernels_s: np.ndarray
    """Kernel floors, norms and activations, unfused attention's score traffic."""

    def gpu_s(self) -> np.ndarray:
        return sum(getattr(self, f.name) for f in fields(StepTerms))


@dataclass(frozen=True)
class StageParts(StepTerms):
    """One engine step of one pipeline stage by term (arrays broadcast like the
    load): the terms of ``stage_seconds``. ``seconds`` is the step, the larger of
    the GPU's terms and the host's launches, so ``host_launch_s`` is what the
    host adds where it cannot keep up."""

    seconds: np.ndarray

    @property
    def host_launch_s(self) -> np.ndarray:
        return np.maximum(self.seconds - self.gpu_s(), 0.0)


@dataclass(frozen=True)
class TpotParts(StepTerms):
    """Each plan's TPOT by part (seconds, one entry per plan), summing to it: the
    decode step's ``StageParts`` times the stage passes a token takes, the engine's
    host time a step, and, where prompts run as forwards of their own, their share
    of a token's time."""

    host_launch_s: np.ndarray
    engine_overhead_s: np.ndarray
    prefill_forwards_s: np.ndarray


def _part_names(parts: type) -> tuple[str, ...]:
    """A parts dataclass's fields without their ``_s``, in declaration order."""
    return tuple(f.name.removesuffix("_s") for f in fields(parts))


TPOT_PARTS = _part_names(TpotParts)
"""What a token's time (TPOT) is made of, in the order reports list it."""


@dataclass(frozen=True)
class TtftParts:
    """Each plan's TTFT by part (seconds, one entry per plan), summing to it."""

    waiting_s: np.ndarray
    """For the steps under way when the request arrives (half a run on average),
    and under an overlap scheduler the step already built."""
    prefill_s: np.ndarray
    """The steps that run its prompt (a static batch's whole prefill)."""
    queueing_s: np.ndarray
    """Behind prompts that arrived before it: Poisson bursts, or the queue for a
    token budget the prompts outgrow."""
    first_decode_s: np.ndarray
    """The decode step that samples the first token, where the engine's prefill
    stops a token short (``Engine.prefill_samples_first_token`` false)."""


TTFT_PARTS = _part_names(TtftParts)
"""What the time to a request's first token is made of, in report order."""


def _tpot_parts(parts: StageParts, passes, pick, overhead, prefill_forwards) -> TpotParts:
    """``TpotParts`` of a decode step's ``parts`` crossed ``passes`` times a token,
    each array reduced to one entry per plan by ``pick``."""
    def per_plan(x):
        return pick(np.broadcast_to(passes * x, np.shape(parts.seconds)))
    rows = np.shape(pick(np.asarray(parts.seconds)))

    def each(x):
        return np.broadcast_to(np.asarray(x, dtype=float), rows).copy()
    return TpotParts(**{f.name: per_plan(getattr(parts, f.name)) for f in fields(StepTerms)},
                     host_launch_s=per_plan(parts.host_launch_s),
                     engine_overhead_s=each(overhead), prefill_forwards_s=each(prefill_forwards))


def attended_keys(model: ModelSpec, decode_context, prefill_context):
    """(keys a decoded token, keys a prompt token attends to), as means over the
    model's layers: ``decode_context`` cached tokens and ``prefill_context`` (half
    the prompt: causal) in a full-attention layer; in a banded one (every other
    layer with ``sliding_window``, ``ModelSpec.banded_layers``) at most the
    window, which the fused kernels read and compute and no more. The KV cache
    itself is still priced whole (``inference.memory``), as an engine without a
    sliding-window pool holds it; unfused attention (``attention_score_bytes``)
    masks the band over the whole score matrix and is priced at the full context."""
    if not model.sliding_window:
        return decode_context, prefill_context
    share = model.banded_layers / model.num_layers
    window = model.sliding_window
    decode = (1.0 - share) * np.asarray(decode_context, dtype=float) + share * np.minimum(
        decode_context, window)
    prompt = 2.0 * np.asarray(prefill_context, dtype=float)
    banded = np.where(prompt > 0, banded_keys_per_query(window, np.maximum(prompt, 1.0)), 0.0)
    return decode, (1.0 - share) * np.asarray(prefill_context, dtype=float) + share * banded


def decode_attention_flops_per_token(m: ModelSpec, context: float) -> float:
    """Attention-core FLOPs of one decoded token against ``context`` cached tokens
    in one layer, as a serving engine that caches MLA's latent runs it.

    Such an engine (the KV cache ``inference.memory.kv_bytes_per_token_per_gpu``
    prices) never expands the cache into per-head keys and values: it folds the
    key up-projection into the query and the value up-projection into the
    output (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1.2; vLLM
    ``v1/attention/backends/mla/common.py``: decode "simulates" multi-head
    attention with multi-query compute), so every head scores the kv_lora +
    rope wide cached entry and sums kv_lora-wide values: 2 c a (2 d_c + d_r),
    3.4x the expanded form's 2 c a (d_qk + d_v) for DeepSeek-V3. The folded
    projections stay weight GEMMs of the token (``layer_matmul_flops_per_token``
    counts kv_up once per token either way). Other attention: the expanded
    count (``attention_core_flops_per_token``)."""
    if m.attention_kind == "mla":
        return 2.0 * context * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    return attention_core_flops_per_token(m, context)


def _both_phases(timer, decode_tokens, prefill_tokens):
    """GEMM time of a step's decode tokens (M = infinity: their weight stream is
    the memory side) plus its prompt tokens (M = the step's tokens), as a
    function of (FLOPs per token, N, K)."""
    height = np.where(prefill_tokens > 0, np.maximum(decode_tokens + prefill_tokens, 1.0),
                      np.inf)

    def both(flops, n, k):
        return timer(flops * decode_tokens, np.inf, n, k) + \
            timer(flops * prefill_tokens, height, n, k)
    return both


def _gemms_s(model: ModelSpec, tp, decode_tokens, prefill_tokens, timer) -> tuple:
    """(weight GEMMs of one layer, of one MoE layer or None): decode tokens at M =
    infinity, prompt tokens at M = the step's tokens (module doc)."""
    both = _both_phases(timer, decode_tokens, prefill_tokens)
    dense = sum(both(flops, n, k) for flops, n, k, _ in _layer_gemms(model, tp))
    if not model.is_moe:
        return dense, None
    moe = sum(both(flops, n, k) for flops, n, k, _ in _layer_gemms(model, tp, 0))
    moe = moe + both(_moe_flops_per_token(model) / tp, model.hidden_size,
                     model.moe_ffn_hidden_size)
    return dense, moe


def stage_seconds(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
                  cluster: Cluster, c: PerfConstants, engine: Engine, load: StepLoad) -> tuple:
    """(seconds of one engine step of one stage, its tp-comm part): the module doc's t_stage."""
    parts = stage_parts(model, workload, plans, cluster, c, engine, load)
    return parts.seconds, parts.tp_allreduce_s


def stage_parts(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
                cluster: Cluster, c: PerfConstants, engine: Engine,
                load: StepLoad) -> StageParts:
    """One engine step of one stage by part (``StageParts``): the module doc's t_stage."""
    gpu = cluster.gpu
    tp = plans.tp.astype(float)[:, None]
    pp = plans.pp.astype(float)[:, None]
    layers = stage_layers(model.num_layers, pp)
    n_d = np.asarray(load.decode_seqs, dtype=float)
    n_p = np.asarray(load.prefill_tokens, dtype=float)
    tokens = n_d + n_p
    nbytes = workload.weight_bytes_per_value

    speedup, input_bytes = quantised_gemm(workload.precision, c.fp8_gemm_speedup, gpu)
    peak = gpu.peak_bf16_tflops * 1e12
    eff = c.efficiency_max(gpu)
    ridge = peak / (gpu.hbm_bandwidth_gb_per_s * 1e9 / BF16_BYTES)

    def timer(flops, m, n, k):
        return gemm_time_s(flops, m, n, k, peak, eff, ridge, c.gemm_size_factor, speedup,
                           input_bytes)

    dense, moe = _gemms_s(model, tp, n_d, n_p, timer)
    weights = weights_bytes_per_gpu(model, plans.tp, plans.pp, nbytes, plans.ep)[:, None]
    ep_comm = 0.0
    layer_gemms = dense
    if model.is_moe:
        layer_gemms = per_layer_mean(model, dense, moe)
        weights = weights - _untouched_expert_bytes(model, plans, nbytes, tokens)
        ep_comm = layers * moe_layer_share(model) * _dispatch_combine_s(model, cluster, c,
                                                                        plans, tokens)
    logits = timer(logits_flops_per_token(model) / tp * load.logits_rows, np.inf,
                   model.vocab_size / tp, model.hidden_size)
    decode_keys, prefill_keys = attended_keys(model, load.decode_context, load.prefill_context)
    decode_attention = layers / tp * decode_attention_flops_per_token(model, decode_keys) * n_d
    prefill_attention = layers / tp * attention_core_flops_per_token(model, prefill_keys) * n_p
    gemm_compute = layers * layer_gemms + logits

    hbm = gpu.hbm_bandwidth_gb_per_s * 1e9
    kv_per_token = kv_bytes_per_token_per_gpu(model, plans.tp, plans.pp,
                                              workload.kv_bytes_per_value)[:, None]
    kv_read = kv_per_token * n_d * decode_keys
    streamed = (weights + kv_per_token * tokens) / (hbm * c.hbm_efficiency)
    # Kernels run one after another, each bound by its own compute or memory
    # (a roofline per kernel): the step is their sum.
    gemms = np.maximum(gemm_compute, streamed)
    # FP8 context FMHA: the prompts' attention on FP8 tensor cores (heuristics/inference.yaml).
    fmha = (fp8_attention_speedup()
            if fp8_prompt_attention(engine, workload.precision, gpu.generation) else 1.0)
    attention = prefill_attention / (eff * peak * fmha) + np.maximum(
        decode_attention / (eff * peak),
        kv_read / engine.decode_attention_bytes_per_s(gpu))

    message = tokens * model.hidden_size * ACTIVATION_BYTES
    nv = gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ib = gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    k = members_in_domain(tp, 1, cluster.nvlink_domain_gpus)
    one_allreduce = tp_allreduce_s(message, tp, k, nv, ib, c.comm_latency_s, engine)
    tp_comm = layers * ALLREDUCES_PER_LAYER * one_allreduce
    if engine.gemm_allreduce_fusion and gpu.generation in engine.gemm_fusion_generations \
            and not model.is_moe:
        hidden = _fused_allreduce_hidden_s(model, tp, n_d, n_p, timer, one_allreduce)
        tp_comm = tp_comm - np.where((k >= tp) & (tp > 1), layers * hidden, 0.0)
    within_domain = tp * pp <= cluster.nvlink_domain_gpus
    link = np.where(within_domain, nv, ib)
    p2p = np.where(pp > 1, p2p_s(message, link, c.comm_latency_s), 0.0)
    kernels = engine.kernels_for(model)
    floor = _kernel_floor_excess_s(model, tp, n_d, n_p, timer,
                                   nbytes / (hbm * c.hbm_efficiency), kernels)
    # Unfused attention materialises every score in HBM: a prompt of the window's
    # length scores the whole window (masked, not skipped), a decode its context.
    scores = (n_p * 2.0 * load.prefill_context + n_d * load.decode_context) \
        * model.num_heads / tp
    score_traffic = layers * scores * engine.attention_score_bytes / (hbm * c.hbm_efficiency)
    elementwise = _elementwise_excess_s(model, tp, tokens, ACTIVATION_BYTES
                                        / (hbm * c.hbm_efficiency))
    gpu_s = gemms + attention + score_traffic + tp_comm + p2p + ep_comm \
        + layers * (floor + elementwise)
    per_kernel = engine.launch_s(tp, n_d, n_p)
    if load.prefill_step_share is not None:
        prefilling = np.asarray(load.prefill_step_share, dtype=float)
        per_kernel = prefilling * per_kernel + (1.0 - prefilling) * engine.launch_s(tp, n_d, 0.0)
    launches = step_kernels(model, engine, pp, plans.ep.astype(float)[:, None]) * per_kernel
    return StageParts(gemm_s=gemms, attention_s=attention, tp_allreduce_s=tp_comm,
                      pipeline_send_s=p2p, expert_dispatch_s=ep_comm,
                      small_kernels_s=score_traffic + layers * (floor + elementwise),
                      seconds=np.maximum(gpu_s, launches))


def _fused_allreduce_hidden_s(model: ModelSpec, tp, decode_tokens, prefill_tokens, timer,
                              allreduce_s):
    """Seconds of one layer's all-reduces that run under their row-parallel GEMMs
    when the two are one fused kernel: each pair costs ``max(g, a)`` instead of
    ``g + a``, which hides ``min(g, a)`` of the all-reduce. The row-parallel GEMMs
    are the attention's output projection and the MLP's down projection, each
    followed by one of the layer's two all-reduces (Shoeybi et al. 2019, Sec. 3)."""
    both = _both_phases(timer, decode_tokens, prefill_tokens)
    linears = attention_linears(model) + mlp_linears(model, model.ffn_hidden_size)
    return sum(np.minimum(both(*_linear_gemm(x, tp)[:3]), allreduce_s)
               for x in linears if x.parallel == "row")


def step_kernels(model: ModelSpec, engine: Engine, pp, ep):
    """Kernels one engine step of one pipeline stage launches (arrays allowed):
    its layers' (an MoE layer's with ``ep``-way expert parallelism) and one more."""
    kernels = engine.kernels_for(model)
    if model.is_moe:
        kernels = per_layer_mean(model, kernels,
                                 engine.moe_layer_kernels(model, model.num_experts / ep))
    return stage_layers(model.num_layers, pp) * kernels + 1.0


def _elementwise_excess_s(model: ModelSpec, tp, tokens, seconds_per_value: float):
    """Seconds one layer's memory-bound activation kernels take beyond the GPU
    floor ``_kernel_floor_excess_s`` already gives each of them: each kernel's time
    is max(its traffic at HBM speed, the floor). Every engine file's kernel list
    has two residual-add + RMSNorm passes (each reads the input and the residual
    and writes both back: 4h values a token; vLLM's and SGLang's fused_add_rms_norm,
    TurboMind's invokeFusedAddBiasResidualRMSNorm, FasterTransformer's
    add-bias-residual-LayerNorm, TensorRT-LLM's fused with its all-reduce) and
    the MLP's activation (a gated one reads gate and up and writes their product,
    3f/tp values; GELU reads and writes f/tp). Rotary embeddings and the KV
    append ride in the attention kernels of half the engines: not counted. At a
    decode of a few sequences these passes move KBs and the floor is their time;
    a 500-token prompt of Llama 3 70B at TP 4 moves 7.0 GB through them, 1.8 ms
    on an H200 (1.1 ms beyond the floors), beside its GEMMs' 28 ms; a step of
    8,192 prompt tokens of Llama 3 8B on an H100, 14.8 ms beside 209 ms. Nothing
    is fitted: the traffic is counted from the kernels, at the HBM efficiency
    every stream here uses."""
    h = float(model.hidden_size)
    gated = 3.0 if model.mlp_kind == "swiglu" else 2.0
    norms = 4.0 * h * tokens * seconds_per_value
    floor = kernel_gpu_floor_s()

    def passes(ffn_values_per_token) -> object:
        act = gated * ffn_values_per_token / tp * tokens * seconds_per_value
        return 2.0 * np.maximum(0.0, norms - floor) + np.maximum(0.0, act - floor)
    dense = passes(float(model.ffn_hidden_size))
    if not model.is_moe:
        return dense
    routed = model.moe_topk * model.moe_ffn_hidden_size \
        + (model.moe_shared_expert_ffn_hidden_size or 0)
    return per_layer_mean(model, dense, passes(float(routed)))


def _kernel_floor_excess_s(model: ModelSpec, tp, decode_tokens, prefill_tokens, timer,
                           seconds_per_weight: float, kernels_per_layer: int):
    """Seconds one layer's kernels spend beyond their rooflines because none
    runs shorter than ``kernel_gpu_floor_s`` (heuristics/inference.yaml): each
    kernel's time is max(roofline, floor), so a weight GEMM adds ``floor - its
    time`` where it is shorter, and every other kernel of the layer (norms,
    rotary, activation, KV append, attention: ``kernels_per_layer`` less the
    GEMMs and the two all-reduces, whose own synchronisation is priced by the
    collectives) adds the floor. At decode of a small batch these kernels move
    a few KB to MB and their rooflines are well under a microsecond, so the
    floor is their time; at large batch or in prefill the GEMMs exceed it and
    add nothing. An MoE layer runs ``moe_block_extra_kernels`` more small
    kernels than a dense one (router GEMM, top-k, token alignment and the
    weighted sum beside the experts' activation) and its shared experts' GEMMs
    and activation; its two grouped expert GEMMs stream many experts' weights
    and exceed the floor."""
    floor = kernel_gpu_floor_s()
    both = _both_phases(timer, decode_tokens, prefill_tokens)
    small = max(kernels_per_layer - COUNTED_GEMMS - ALLREDUCES_PER_LAYER, 0)

    def excess(gemms, others: int) -> object:
        short = sum(np.maximum(0.0, floor - np.maximum(both(flops, n, k),
                                                       n * k * seconds_per_weight))
                    for flops, n, k, _ in gemms)
        return short + others * floor
    dense = excess(_layer_gemms(model, tp), small)
    if not model.is_moe:
        return dense
    shared = model.moe_shared_expert_ffn_hidden_size or 0
    moe = excess(_layer_gemms(model, tp, shared),
                 small + moe_block_extra_kernels() + (1 if shared else 0))
    return per_layer_mean(model, dense, moe)


def _moe_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of an MoE block per token (router, top-k experts, shared):
    an MoE layer's weight-matmul FLOPs less its attention's."""
    return layer_matmul_flops_per_token(model, "moe") - 2.0 * attention_weight_params(model)


def _untouched_expert_bytes(model: ModelSpec, plans: InferencePlanTable, nbytes: float, tokens):
    """Routed-expert weights a GPU does not read in one step: with N token copies
    routed at random over E experts, each expert is hit with probability
    1 - (1 - 1/E)^N, so a decode step of a small batch reads only the experts
    its tokens chose. N counts the tokens of every replica sharing the experts
    (ep/tp of them with expert parallelism)."""
    ep = plans.ep.astype(float)[:, None]
    tp = plans.tp.astype(float)[:, None]
    sharing = np.where(ep > 1, ep / tp, 1.0)
    copies = tokens * sharing * model.moe_topk
    hit = 1.0 - (1.0 - 1.0 / model.num_experts) ** copies
    experts = expert_bytes_per_gpu(model, plans.tp, plans.pp, nbytes, plans.ep)[:, None]
    return experts * (1.0 - hit)


def _dispatch_combine_s(model: ModelSpec, cluster: Cluster, c: PerfConstants,
                        plans: InferencePlanTable, tokens):
    """Seconds one MoE layer spends sending its token copies to the experts' GPUs
    and back (expert parallelism only): (ep - 1)/ep of the copies leave the GPU,
    over NVLink within the domain, else over the scale-out network."""
    gpu = cluster.gpu
    ep = plans.ep.astype(float)[:, None]
    tp = plans.tp.astype(float)[:, None]
    copies = tokens / tp * model.moe_topk * model.hidden_size * ACTIVATION_BYTES
    link = np.where(ep <= cluster.nvlink_domain_gpus, gpu.nvlink_bandwidth_gb_per_s,
                    gpu.internode_bandwidth_gb_per_s) * 1e9 * c.comm_bandwidth_efficiency
    one_way = copies * (ep - 1.0) / ep / link + c.comm_latency_s
    return np.where(ep > 1, 2.0 * one_way, 0.0)


def _microbatch_choices(batch: np.ndarray) -> np.ndarray:
    """(plans, K) candidate micro-batch counts: powers of two, NaN beyond the batch."""
    powers = 2.0 ** np.arange(int(np.log2(max(1, int(batch.max())))) + 1)
    choices = np.broadcast_to(powers, (len(batch), len(powers))).copy()
    choices[choices > batch[:, None]] = np.nan
    return choices


def latency(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
            cluster: Cluster, constants: PerfConstants | None = None,
            engine: Engine | None = None, mode: str = "static") -> InferenceLatency:
    """TTFT, TPOT and request latency of every plan (formulas in the module doc);
    ``plans.batch`` is the static batch, or the concurrency in ``continuous`` mode."""
    c = constants or load_constants()
    engine = engine or get_engine(None)
    if mode == "continuous":
        return _continuous(model, workload, plans, cluster, c, engine)
    return _static(model, workload, plans, cluster, c, engine)


def _prefill_steps(engine: Engine, prompt_tokens):
    """Engine steps a prefill of ``prompt_tokens`` takes (chunks of the step budget)."""
    if engine.chunked_prefill and engine.max_batched_tokens:
        return np.ceil(np.asarray(prompt_tokens, dtype=float) / engine.max_batched_tokens)
    return np.ones_like(np.asarray(prompt_tokens, dtype=float))


def _largest_pass(engine: Engine, prompt_tokens):
    """Tokens of the largest forward pass: the prompts, or one step's budget where
    the engine chunks them."""
    if engine.chunked_prefill and engine.max_batched_tokens:
        return np.minimum(prompt_tokens, engine.max_batched_tokens)
    return prompt_tokens


def _static(model, workload, plans, cluster, c, engine) -> InferenceLatency:
    batch = plans.batch.astype(float)
    pp = plans.pp.astype(float)[:, None]
    s_in, s_out = workload.input_len_tokens, workload.output_len_tokens
    split = engine.pipeline_split
    overhead = engine.step_overhead_s
    rows = np.arange(len(plans))

    m_prefill = prefill_microbatches(split, batch, pp[:, 0], s_in)
    requests = batch[:, None] / m_prefill
    prefill_stage, _ = stage_seconds(model, workload, plans, cluster, c, engine, StepLoad(
        decode_seqs=0.0, decode_context=0.0, prefill_tokens=requests * s_in,
        prefill_context=s_in / 2.0, logits_rows=requests))
    prefill = np.where(np.isnan(m_prefill), np.inf, (m_prefill + pp - 1.0) * prefill_stage
                       + _prefill_steps(engine, batch[:, None] * s_in) * overhead)
    best_prefill = np.argmin(prefill, axis=1)
    prefill_m = m_prefill[rows, best_prefill]

    m_decode = decode_microbatches(split, batch, pp[:, 0], s_in, prefill_m)
    decode_parts = stage_parts(model, workload, plans, cluster, c, engine, StepLoad(
        decode_seqs=batch[:, None] / m_decode, decode_context=s_in + s_out / 2.0,
        prefill_tokens=0.0, prefill_context=0.0, logits_rows=batch[:, None] / m_decode))
    decode_stage = decode_parts.seconds
    passes = split.decode_stage_passes(m_decode, pp)
    decode = np.where(np.isnan(m_decode), np.inf, passes * decode_stage + overhead)
    best_decode = np.argmin(decode, axis=1)
    tpot = decode[rows, best_decode]
    # An engine whose prefill stops a token short samples the first token in the
    # first decode step.
    first = np.zeros_like(tpot) if engine.prefill_samples_first_token else tpot
    ttft = prefill[rows, best_prefill] + first
    return InferenceLatency(
        ttft_s=ttft, tpot_s=tpot, latency_s=ttft + (s_out - 1) * tpot,
        prefill_microbatches=prefill_m, decode_microbatches=m_decode[rows, best_decode],
        activation_tokens=_largest_pass(engine, requests[rows, best_prefill] * s_in),
        tpot_parts=_tpot_parts(decode_parts, passes, lambda x: x[rows, best_decode],
                               overhead, 0.0),
        ttft_parts=TtftParts(waiting_s=np.zeros_like(ttft), prefill_s=ttft - first,
                             queueing_s=np.zeros_like(ttft), first_decode_s=first))


def _candidates(batch: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """(plans, K) micro-batch counts the planner may choose: powers of two up to
    the batch, and only 1 without a pipeline."""
    m = _microbatch_choices(batch)
    return np.where(pp[:, None] > 1, m, np.where(m == 1, 1.0, np.nan))


def per_stage_requests(batch: np.ndarray, pp: np.ndarray) -> np.ndarray:
    """Requests a micro-batch holds under a fixed per-stage split: ``b / pp`` where
    ``pp`` divides the batch, else the whole batch (FasterTransformer's
    ``getLocalBatchSize``)."""
    return np.where(np.mod(batch, pp) == 0, batch / pp, batch)


def prefill_microbatches(split, batch: np.ndarray, pp: np.ndarray, s_in: float) -> np.ndarray:
    """(plans, K) prefill micro-batch counts under the engine's ``PipelineSplit``:
    the planner's candidates, or the fixed rule's one count (``per_stage``
    requests, halved while even and over ``prefill_max_tokens`` prompt tokens)."""
    if split.prefill == "chosen":
        return _candidates(batch, pp)
    if split.prefill == "whole":
        return np.ones((len(batch), 1))
    local = per_stage_requests(batch, pp)
    while True:
        halve = (pp > 1) & (local * s_in > split.prefill_max_tokens) & (np.mod(local, 2) == 0)
        if not halve.any():
            return (batch / local)[:, None]
        local = np.where(halve, local / 2.0, local)


def decode_microbatches(split, batch: np.ndarray, pp: np.ndarray, s_in: float,
                        prefill_m: np.ndarray) -> np.ndarray:
    """(plans, K) decode micro-batch counts under the engine's ``PipelineSplit``;
    ``prefill_m`` is the prefill's (the ``threshold`` rule cuts decode steps by
    the batch x tokens threshold it set: ``b / m_p`` requests x ``s_in`` tokens)."""
    if split.decode == "chosen":
        return _candidates(batch, pp)
    if split.decode == "whole":
        return np.ones((len(batch), 1))
    if split.decode == "per_stage":
        return (batch / per_stage_requests(batch, pp))[:, None]
    threshold = np.maximum(np.floor(batch / prefill_m), 1.0) * s_in
    cut = (prefill_m > 1) & (batch > threshold)
    return np.where(cut, np.ceil(batch / threshold), 1.0)[:, None]


def prompt_room(limit, beside):
    """Prompt tokens a step has room for beside ``beside`` decodes under a step
    token ``limit`` (``max_batched_tokens``): at least one, unbounded without a
    limit."""
    beside = np.asarray(beside, dtype=float)
    if not limit:
        return np.full_like(beside, np.inf)
    return np.maximum(limit - beside, 1.0)


def prompt_window(s_in: float, arrivals_per_step, budget, beside):
    """(full steps, tokens of a full step, prompt tokens of the last step) that
    prefill one arriving request at steady state, with ``arrivals_per_step`` new
    requests a step on average and ``beside`` decodes sharing each step.

    The step that takes a request's prompt also takes those that arrived in the
    same step interval: for Poisson arrivals, seen from an arrival, the others of
    its interval are Poisson with the same mean ``n`` (Palm's theorem; Wolff 1982,
    PASTA), so the prefill carries ``1 + n`` prompts on average, not the ``n``
    of a mean step nor the request's prompt alone. First come first served, ``n
    / 2`` of them are ahead of it: under a token budget (chunked prefill: ``room =
    budget - beside`` prompt tokens a step) its last chunk runs once the ``A = (1
    + K) s_in`` tokens ahead and its own are done, ``K ~ Poisson(n / 2)`` prompts
    ahead: ``ceil(A / room) - 1`` full steps, then a last one with what is left
    of ``A`` and the tokens behind it that still fit, averaged over ``K`` (the
    mean of ``ceil`` is not the ``ceil`` of the mean: a prompt just under the
    room fits in one step unless another is ahead of it). At low load (n -> 0)
    this is the request's own prompt in chunks. Checked against the job
    simulator (``autoconfig.inference.job``, which admits every step's arrivals
    together) at the concurrency of a
    3,000-request Poisson job by Little's law: Llama 3 8B on one H100, 512 / 128
    tokens, 5-40 requests/s: steady TTFT / simulated 0.99-1.03 for vLLM and
    TensorRT-LLM with ``burst_wait_s`` (0.63-0.95 with the prompt alone), SGLang
    1.03-1.13 at 5-20/s and 0.89 at 40/s, 616 requests in flight. At the
    concurrencies MLPerf v4.1-v5.1's TensorRT-LLM Server runs held (rate times
    latency), their mean TTFT came out with a median error of -4.1% instead of
    -39.9% (``benchmarks/infer_steady_state.py``)."""
    n = np.asarray(arrivals_per_step, dtype=float)
    window = s_in * (1.0 + n)
    if budget is None:
        return np.zeros_like(n), np.zeros_like(n), window
    room = prompt_room(budget, beside)
    weights, k = _poisson_weights(n / 2.0)
    ahead = s_in * (1.0 + k)                        # done when its own last chunk is
    full = np.ceil(ahead / room[..., None]) - 1.0
    rest = ahead - full * room[..., None]
    # Behind it, Poisson(n / 2) more prompts fill what room the step has left:
    # when any come (1 - e^-mu), they bring s_in mu / (1 - e^-mu) tokens on average.
    mu = n[..., None] / 2.0
    some = -np.expm1(-mu)
    behind = s_in * mu / np.where(some > 0, some, 1.0)
    last = rest + some * np.minimum(behind, room[..., None] - rest)
    return (weights * full).sum(axis=-1), room, (weights * last).sum(axis=-1)


def _poisson_weights(mean):
    """(Poisson probabilities of 0..K events, for each mean in ``mean`` along a new
    last axis and renormalised, and the counts 0..K), K far enough into the tail
    (mean + 6 sd + 6) that the cut-off mass is negligible."""
    mean = np.asarray(mean, dtype=float)
    top = float(np.max(mean)) if mean.size else 0.0
    k = np.arange(int(np.ceil(top + 6.0 * np.sqrt(top) + 6.0)) + 1, dtype=float)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(k[1:]))])
    safe = np.maximum(mean, 1e-300)[..., None]
    log_p = k * np.log(safe) - safe - log_fact
    weights = np.where(mean[..., None] > 0, np.exp(log_p), (k == 0).astype(float))
    return weights / weights.sum(axis=-1, keepdims=True), k


def burst_wait_s(prompt_s, arrivals_per_s):
    """Mean TTFT a Poisson stream adds over a steady state of mean steps, where
    each step's length grows with the prompts it admits.

    A step (or a decode run and its prefill forward) that admits ``K`` prompts
    lasts ``C = c0 + p K``, ``p = prompt_s`` a prompt's share, and admits what
    arrived during the one before: ``K ~ Poisson(lambda C_prev)``. Its mean is
    ``c0 / (1 - u)`` with ``u = lambda p``, its variance ``p^2 lambda E[C] / (1 -
    u^2)`` (the recursion's stationary moments). An arrival lands in a step with
    probability proportional to its length (the inspection paradox), so it waits
    ``E[C^2] / (2 E[C])``, ``Var / (2 E[C])`` more than half a mean step, and it is
    admitted with the ``lambda E[C^2] / E[C]`` others of that longer step,
    ``lambda Var / E[C]`` more prompts of ``p`` each than the mean step's:
    together ``p u (1/2 + u) / (1 - u^2)``. Burstiness adds nothing at low load
    (u -> 0); ``u`` is held below ``MAX_PROMPT_LOAD``, where the steady state's
    means no longer describe a queue that grows. A stream less bunched than
    Poisson (a replica behind a round-robin router) has counts of variance
    ``c^2`` times their mean, ``c^2`` its gaps' squared coefficient of variation,
    and the term scales by ``c^2`` (``autoconfig.inference.dispatch``; the caller
    multiplies)."""
    u = np.clip(np.asarray(arrivals_per_s, dtype=float) * prompt_s, 0.0, MAX_PROMPT_LOAD)
    return prompt_s * u * (0.5 + u) / (1.0 - u * u)


def prompt_queue_s(service_s, arrivals_per_s):
    """Mean wait of a prompt for the prompts ahead of it where each step's token
    budget holds less than the prompts that arrive in a step: the steps then
    serve the queue ``room`` tokens at a time, one prompt after another, each
    taking ``service_s`` of full steps, and Poisson arrivals meet the M/D/1
    queue's mean wait ``u S / (2 (1 - u))``, ``u = lambda S`` (Pollaczek-Khinchine;
    Kleinrock 1975, Sec. 5.6). Arrivals with gaps of squared coefficient of
    variation ``c^2`` wait ``c^2`` times as long (Kingman's G/G/1 form, ``(c_a^2 +
    c_s^2) / 2`` with ``c_s^2 = 0`` for a fixed service; the caller multiplies). Checked against the job simulator: Llama 3 8B on
    an H100 under vLLM, 8,000-token prompts and 50-token outputs at 2.73
    requests/s, 11 in flight: steady TTFT 319 ms without the queue, 0.58 of the
    simulated 547 ms."""
    u = np.clip(np.asarray(arrivals_per_s, dtype=float) * service_s, 0.0, MAX_PROMPT_LOAD)
    return u * service_s / (2.0 * (1.0 - u))


QUEUE_ITERATIONS = 4
"""Fixed-point passes of ``C = lambda (TTFT + queue + (s_out - 1) TPOT)`` for a
queue of prompts: the wait lowers the rate that C in flight means, which lowers
the wait; the passes alternate around the fixed point and close in on it."""

MAX_PROMPT_LOAD = 0.9
"""Largest share of a step's time the arriving prompts are counted at in
``burst_wait_s``: 1 / (1 - u^2) is 5.3 there and unbounded at 1."""


def _continuous(model, workload, plans, cluster, c, engine) -> InferenceLatency:
    """Steady state of an in-flight engine at concurrency ``plans.batch`` (module doc)."""
    pp = plans.pp.astype(float)[:, None]
    s_in, s_out = workload.input_len_tokens, workload.output_len_tokens
    # Sequences per micro-batch: pp micro-batches in flight, or the whole batch in
    # one where each step crosses the stages before the next starts.
    lanes = engine.pipeline_split.lanes(pp)
    running = plans.batch.astype(float)[:, None] / lanes
    mixed = engine.mixed_prefill
    none = np.zeros_like(running)
    prompt_share = running * s_in / s_out
    overhead = engine.step_overhead_s
    context = s_in + workload.held_output_tokens
    limit = engine.max_batched_tokens
    budget = limit if engine.chunked_prefill and limit else None
    beside = running if mixed else none     # decodes sharing a prompt's step
    space = prompt_room(limit, beside)      # prompt tokens a step takes
    chunk = np.full_like(running, float(s_in)) if budget is None else \
        np.minimum(space, float(s_in))
    # Each step starts running / s_out prompts, each over ceil(s_in / chunk) steps:
    # below one such step in every step, the others decode alone.
    step_parts = stage_parts(model, workload, plans, cluster, c, engine, StepLoad(
        decode_seqs=running, decode_context=context,
        prefill_tokens=prompt_share if mixed else none,
        prefill_context=s_in / 2.0, logits_rows=running,
        prefill_step_share=np.minimum(running / s_out * np.ceil(s_in / chunk), 1.0)))
    step = step_parts.seconds
    decode = pp * step + engine.decode_step_overhead_s
    tpot = decode
    forwards = np.zeros_like(running)        # prompts' own forwards, a token's share
    k = engine.decode_steps
    arriving = k * running / s_out          # prompts one admission interval gathers
    if not mixed:
        # One forward per run of k decode steps takes what arrived during it.
        alone, _ = stage_seconds(model, workload, plans, cluster, c, engine, StepLoad(
            decode_seqs=none, decode_context=context,
            prefill_tokens=np.maximum(arriving, 1.0) * s_in, prefill_context=s_in / 2.0,
            logits_rows=np.maximum(arriving, 1.0)))
        forward = pp * alone + overhead
        forwards = np.minimum(arriving, 1.0) / k * forward
        tpot = tpot + forwards
    full, room, tokens = prompt_window(s_in, arriving, budget, beside)
    prompts = tokens / s_in
    chunk_step, _ = stage_seconds(model, workload, plans, cluster, c, engine, StepLoad(
        decode_seqs=beside, decode_context=context, prefill_tokens=tokens,
        prefill_context=s_in / 2.0, logits_rows=beside + prompts))
    # Where the window outgrows a step's token budget, the prompts queue for it:
    # chunked, ``room`` tokens a step; whole, as many prompts as fit (one at least).
    capped = s_in * (1.0 + arriving) > space
    whole_prompts = np.maximum(np.floor(space / s_in), 1.0)
    full_step = 0.0
    if np.any(full > 0) or (budget is not None and np.any(capped)):
        full_step, _ = stage_seconds(model, workload, plans, cluster, c, engine, StepLoad(
            decode_seqs=beside, decode_context=context, prefill_tokens=room,
            prefill_context=s_in / 2.0, logits_rows=beside))
    # An arrival waits for the decode run under way (half of it on average:
    # one step, or a whole multi-step run of ``decode_steps``), and under an
    # overlap scheduler for the step already built after it, then the steps
    # that prefill it beside the prompts that arrived with it. Where prefills
    # run alone, it lands in a decode run or in a prefill forward in proportion
    # to the time each takes, and waits for the rest of that one.
    built = 1.0 if engine.overlap_schedule else 0.0
    if mixed:
        wait = (k / 2.0 + built) * tpot
    else:
        in_decode = decode / tpot
        wait = (in_decode * k * decode / 2.0 + (1.0 - in_decode) * forward / 2.0
                + built * tpot)
    ttft = wait + full * (pp * full_step + overhead) + pp * chunk_step + overhead
    # Poisson bursts lengthen the steps an arrival meets where a step takes every
    # prompt waiting (no token budget cuts the window short).
    held = running if mixed else np.maximum(arriving, 1.0)
    admitted = prompts - (running / s_out if mixed else held)
    whole = ~capped & (admitted > 0)
    base = step if mixed else alone
    prompt_s = np.where(whole, pp * (chunk_step - base) / np.where(whole, admitted, 1.0), 0.0)
    # Requests arrive at C over their lifetime (Little's law), the first token
    # counted without the waits these terms add.
    arrivals_per_s = running / (ttft + (s_out - 1) * tpot)
    # Bunching scales with how irregular one replica's arrivals are (c^2: 1 for a
    # Poisson stream, 1/k for a k-replica round-robin; ``autoconfig.inference.dispatch``).
    cv2 = arrival_cv2(workload.dispatch, plans.replicas)[:, None]
    bursts = cv2 * burst_wait_s(np.maximum(prompt_s, 0.0), arrivals_per_s)
    if np.any(capped):
        if budget is not None:              # chunks: room tokens a step
            own_full, _, own_last = prompt_window(s_in, np.zeros_like(arriving), budget,
                                                  beside)
            per_step, service = room, pp * full_step + overhead
        else:                               # whole prompts, as many as fit
            own_full, own_last = np.zeros_like(running), whole_prompts * s_in
            per_step = own_last
        own_step, _ = stage_seconds(model, workload, plans, cluster, c, engine, StepLoad(
            decode_seqs=beside, decode_context=context, prefill_tokens=own_last,
            prefill_context=s_in / 2.0, logits_rows=beside + own_last / s_in))
        if budget is None:
            service = pp * own_step + overhead
        own = wait + own_full * service + pp * own_step + overhead
        ttft = np.where(capped, own, ttft)
        queue = np.zeros_like(ttft)
        for _ in range(QUEUE_ITERATIONS):    # the wait lengthens the lifetime C spans
            arrivals_per_s = running / (ttft + queue + (s_out - 1) * tpot)
            queue = cv2 * prompt_queue_s(s_in / per_step * service, arrivals_per_s)
        bursts = np.where(capped, queue, bursts)
    ttft = ttft + bursts
    waiting = np.broadcast_to(wait, ttft.shape)
    prompt_steps = ttft - bursts - waiting
    first = np.zeros_like(ttft)
    if not engine.prefill_samples_first_token:      # then the decode step that samples it
        first = first + pp * step + engine.decode_step_overhead_s
        ttft = ttft + first
    ttft, tpot = ttft[:, 0], tpot[:, 0]
    return InferenceLatency(
        ttft_s=ttft, tpot_s=tpot, latency_s=ttft + (s_out - 1) * tpot,
        prefill_microbatches=lanes[:, 0], decode_microbatches=lanes[:, 0],
        activation_tokens=(running + np.maximum(prompt_share,
                                                np.where(full > 0, room, tokens)))[:, 0],
        tpot_parts=_tpot_parts(step_parts, pp, lambda x: x[:, 0],
                               engine.decode_step_overhead_s, forwards[:, 0]),
        ttft_parts=TtftParts(waiting_s=waiting[:, 0].copy(), prefill_s=prompt_steps[:, 0],
                             queueing_s=np.broadcast_to(bursts, first.shape)[:, 0].copy(),
                             first_decode_s=first[:, 0]))
