"""Analytical latency of static-batch inference, vectorised over an InferencePlanTable.

One request batch of ``b`` prompts of ``s_in`` tokens is prefilled, then
``s_out - 1`` decode steps generate the rest (the prefill's logits give the
first output token):

    TTFT    = prefill time
    TPOT    = one decode step
    latency = TTFT + (s_out - 1) * TPOT

**One pipeline stage, one micro-batch of ``n`` requests** (per GPU; the last
stage, which holds the output layer, is the slowest and sets the pace):

    t_stage = max(compute, memory) + tp_comm + p2p

- compute: the four weight GEMMs of each layer of the stage and the output
  layer (2 FLOPs per weight per token: Kaplan et al. 2020, Table 1), timed by
  the training model's GEMM roofline ``step_time.gemm_time_s`` (large-GEMM
  efficiency and size penalty of heuristics/perf.yaml, fp8 weight GEMMs
  ``fp8_gemm_speedup`` faster, as in training) without its 1/M term, which is
  the weight traffic that ``memory`` below counts explicitly, plus the attention core ``4 * context * h / tp`` per token and
  layer (QK^T and AV; prefill averages the causal context ``s_in / 2``) at the
  large-GEMM efficiency;
- memory: every weight of the stage once per micro-batch, plus the KV cache
  read (decode: ``n * context`` tokens of K and V) and written, at HBM
  bandwidth times ``hbm_efficiency`` (perf.yaml). Decode at small batch is
  memory-bound, at large batch compute-bound: the max of the two (roofline,
  Williams et al. 2009);
- tp_comm: 2 all-reduces per layer of ``n * tokens * h`` bf16 activations
  (after attention and after the MLP; Shoeybi et al. 2019, Sec. 3), costed
  with the alpha-beta ring of ``autoconfig.core.comm`` (``comm_latency_s`` per
  hop): at decode's small messages the 2 (t-1) hop latencies dominate;
- p2p: one send of the activations to the next stage (NVLink inside a node,
  InfiniBand when a replica spans nodes), alpha-beta.

**Pipeline.** With ``pp > 1`` the batch is split into ``m`` micro-batches of
``b/m`` requests that flow through the stages one behind the other:

- prefill (one pass): ``(m + pp - 1) * t_stage(b/m)``, the GPipe fill/drain
  formula (Huang et al. 2019, Sec. 2.2: bubble ``(K-1)/(M+K-1)``); megatron-core's
  static inference does this split in
  ``AbstractModelInferenceWrapper.forward_pass_with_pipeline_parallel_large_input_batch``;
- decode (steady state): each micro-batch's next token needs one trip through
  all ``pp`` stages, and each stage serves the ``m`` micro-batches in turn, so
  a token step of the whole batch takes ``max(m, pp) * t_stage(b/m)``
  (FasterTransformer's pipelined GPT splits the batch into micro-batches the
  same way: docs/gpt_guide.md). Memory-bound stages gain nothing from
  splitting (m = 1 is best), compute-bound ones up to ``pp`` times.

Each plan takes the ``m`` (a power of two <= b) that minimises its time,
separately for prefill and decode.
"""

from dataclasses import dataclass

import numpy as np

from autoconfig.core.comm import hierarchical_allreduce_s, members_in_domain, p2p_s
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import (ModelSpec, attention_core_flops_per_token,
                                   attention_weight_params, layer_matmul_flops_per_token,
                                   logits_flops_per_token)
from autoconfig.inference.memory import (ACTIVATION_BYTES, expert_bytes_per_gpu,
                                         kv_bytes_per_token_per_gpu, weights_bytes_per_gpu)
from autoconfig.inference.plan import InferencePlanTable, InferenceWorkload
from autoconfig.training.step_time import (BF16_BYTES, PerfConstants, _layer_gemms,
                                           gemm_time_s, load_constants)

ALLREDUCES_PER_LAYER = 2
"""Forward of a Megatron layer: one after the attention output projection, one
after the MLP down projection (Shoeybi et al. 2019, Sec. 3, the g operator)."""


@dataclass(frozen=True)
class InferenceLatency:
    """Seconds and rates of every plan (numpy arrays, one entry per plan)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    latency_s: np.ndarray
    prefill_microbatches: np.ndarray
    decode_microbatches: np.ndarray
    prefill_microbatch_requests: np.ndarray
    """Requests per prefill micro-batch (sets the activation memory)."""
    decode_tp_comm_s: np.ndarray
    """TP all-reduce seconds inside one decode step (for reports)."""


def _stage_times(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
                 cluster: Cluster, c: PerfConstants, requests, tokens_per_request: float,
                 context: float, logits_tokens_per_request: float) -> tuple:
    """(stage seconds, its tp-comm part) of micro-batches of ``requests`` (broadcast shape)."""
    gpu = cluster.gpu
    tp = plans.tp.astype(float)[:, None]
    pp = plans.pp.astype(float)[:, None]
    layers = model.num_layers / pp
    tokens = requests * tokens_per_request
    nbytes = workload.bytes_per_value

    speedup = c.fp8_gemm_speedup if workload.precision == "fp8" else 1.0
    peak = gpu.peak_bf16_tflops * 1e12
    eff = c.efficiency_max(gpu)
    ridge = peak / (gpu.hbm_bandwidth_gb_per_s * 1e9 / BF16_BYTES)
    weights = weights_bytes_per_gpu(model, plans.tp, plans.pp, nbytes, plans.ep)[:, None]
    # M = inf: the size penalty's 1/M term is the weight traffic, which ``memory`` counts.
    layer_gemms = sum(gemm_time_s(flops * tokens, np.inf, n, k, peak, eff, ridge,
                                  c.gemm_size_factor)
                      for flops, n, k, _ in _layer_gemms(model, tp))
    ep_comm = 0.0
    if model.is_moe:
        moe_gemms = sum(gemm_time_s(flops * tokens, np.inf, n, k, peak, eff, ridge,
                                    c.gemm_size_factor)
                        for flops, n, k, _ in _layer_gemms(model, tp, 0))
        moe_gemms = moe_gemms + gemm_time_s(_moe_flops_per_token(model) / tp * tokens, np.inf,
                                            model.hidden_size, model.moe_ffn_hidden_size, peak,
                                            eff, ridge, c.gemm_size_factor)
        share = model.layers_of("moe") / model.num_layers
        layer_gemms = (1.0 - share) * layer_gemms + share * moe_gemms
        weights = weights - _untouched_expert_bytes(model, plans, nbytes, tokens)
        ep_comm = layers * share * _dispatch_combine_s(model, cluster, c, plans, tokens)
    logits_tokens = requests * logits_tokens_per_request
    logits = gemm_time_s(logits_flops_per_token(model) / tp * logits_tokens, np.inf,
                         model.vocab_size / tp, model.hidden_size, peak, eff, ridge,
                         c.gemm_size_factor)
    attention = layers * attention_core_flops_per_token(model, context) / tp * tokens
    compute = (layers * layer_gemms + logits) / speedup + attention / (eff * peak)

    hbm = gpu.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    kv_per_token = kv_bytes_per_token_per_gpu(model, plans.tp, plans.pp, nbytes)[:, None]
    kv_read = kv_per_token * requests * (context if tokens_per_request == 1 else 0.0)
    kv_write = kv_per_token * tokens
    memory = (weights + kv_read + kv_write) / hbm

    message = tokens * model.hidden_size * ACTIVATION_BYTES
    nv = gpu.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    ib = gpu.internode_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    k = members_in_domain(tp, 1, cluster.nvlink_domain_gpus)
    tp_comm = (layers * ALLREDUCES_PER_LAYER
               * hierarchical_allreduce_s(message, tp, k, nv, ib, c.comm_latency_s))
    within_domain = tp * pp <= cluster.nvlink_domain_gpus
    link = np.where(within_domain, nv, ib)
    p2p = np.where(pp > 1, p2p_s(message, link, c.comm_latency_s), 0.0)
    return np.maximum(compute, memory) + tp_comm + p2p + ep_comm, tp_comm


def _moe_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of an MoE block per token (router, top-k experts, shared):
    an MoE layer's weight-matmul FLOPs less its attention's."""
    return layer_matmul_flops_per_token(model, "moe") - 2.0 * attention_weight_params(model)


def _untouched_expert_bytes(model: ModelSpec, plans: InferencePlanTable, nbytes: int, tokens):
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
            cluster: Cluster, constants: PerfConstants | None = None) -> InferenceLatency:
    """TTFT, TPOT and request latency of every plan (formulas in the module doc)."""
    c = constants or load_constants()
    batch = plans.batch.astype(float)
    pp = plans.pp.astype(float)[:, None]
    m = _microbatch_choices(batch)
    m = np.where(pp > 1, m, np.where(m == 1, 1.0, np.nan))   # no split without a pipeline
    requests = batch[:, None] / m

    prefill_stage, _ = _stage_times(model, workload, plans, cluster, c, requests,
                                    workload.input_len_tokens,
                                    workload.input_len_tokens / 2.0, 1.0)
    prefill = np.where(np.isnan(m), np.inf, (m + pp - 1.0) * prefill_stage)
    context = workload.input_len_tokens + workload.output_len_tokens / 2.0
    decode_stage, tp_comm = _stage_times(model, workload, plans, cluster, c, requests, 1,
                                         context, 1.0)
    decode = np.where(np.isnan(m), np.inf, np.maximum(m, pp) * decode_stage)

    rows = np.arange(len(plans))
    best_prefill = np.argmin(prefill, axis=1)
    best_decode = np.argmin(decode, axis=1)
    ttft = prefill[rows, best_prefill]
    tpot = decode[rows, best_decode]
    return InferenceLatency(
        ttft_s=ttft, tpot_s=tpot,
        latency_s=ttft + (workload.output_len_tokens - 1) * tpot,
        prefill_microbatches=m[rows, best_prefill], decode_microbatches=m[rows, best_decode],
        prefill_microbatch_requests=requests[rows, best_prefill],
        decode_tp_comm_s=np.broadcast_to(tp_comm, m.shape)[rows, best_decode]
        * np.maximum(m, pp)[rows, best_decode])
