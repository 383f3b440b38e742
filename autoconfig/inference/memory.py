"""Memory per GPU of a serving plan: weights, KV cache, activations, runtime.

    memory = weights + kv_cache + activations + context

- weights: the parameters of the last pipeline stage (its ``L/pp`` layers plus
  the output layer, or the embedding it is tied to) split over ``tp``, at 2
  bytes (bf16) or 1 (fp8) each. The stage split is the training model's
  (``autoconfig.training.memory.stage_params``).
- KV cache (GQA-aware): keys and values of every layer of the stage for every
  token of every request of the batch, ``2 * (L/pp) * kv_heads/tp * head_dim *
  bytes`` per token. KV heads are split over ``tp`` and replicated when ``tp >
  kv_heads`` (at least one per GPU). Tokens held per request
  (``kv_tokens_per_request``): a contiguous cache reserves the whole sequence
  up front (megatron-core's StaticInferenceContext allocates ``max_batch_size x
  max_sequence_length``, ``megatron/core/inference/contexts/static_context.py``;
  FasterTransformer likewise); a paged cache holds only the tokens written so
  far, in whole blocks (Kwon et al. 2023, PagedAttention, Sec. 4.2), so at
  steady state under continuous batching a request holds ``input + output/2``
  on average with fixed lengths (``InferenceWorkload.held_output_tokens`` with
  spread ones), rounded up to the engine's block, and a static batch peaks at
  the whole sequence. A paged engine allocates its pool once at start
  (``pool_tokens``): the tokens its user set, or what its memory rule gives
  (``Engine.kv_pool``: TensorRT-LLM a share of the memory free once the model
  is loaded, vLLM a share of the GPU less its whole footprint, SGLang a share
  of the GPU for weights and pool); requests are admitted against that pool.
  Each engine sizes it from what it measured once the weights were loaded
  (SGLang's free memory after loading, vLLM's 'Loading model weights took',
  TensorRT-LLM's free memory after the engine loads), so the rule counts the
  weights at their bytes: parameters are allocated once, each rounded to the
  allocator's 2 MiB blocks, which leaves no fragmentation to speak of; the
  activations' peak keeps it, and so does the check that the pool fits.
  An engine that reserves the output at admission
  (TensorRT-LLM's GUARANTEED_NO_EVICT, ``Engine.kv_reserves_output``) holds
  the whole sequence's blocks from the first step.
- activations: nothing is kept for a backward pass, so only the largest
  tensors of one layer on the largest forward pass (the latency model's
  ``activation_tokens``: a prefill micro-batch, or a continuous step's budget) are alive at once:
  the residual stream and the normed input (2h), the QKV output ((h + 2 kv)/t)
  and the MLP intermediate (u f / t, u = 2 for SwiGLU), in bf16, plus the fp32
  logits of the last token of each request (4 V / t bytes; megatron-core's
  static inference materialises only the last token's logits,
  ``materialize_only_last_token_logits=True``).
- overhead: allocator fragmentation, ``(factor - 1) * allocated`` with
  megatron-core's ``fragmentation_factor`` of heuristics/memory.yaml (shared
  with training; a KV pool set at start is one allocation and leaves none), or
  the engine's own allocator's (``Engine.allocator_fragmentation``: a C++
  engine that allocates exact sizes from the CUDA memory pool leaves none),
  plus the runtime's memory outside the allocator (``runtime_context_bytes``):
  the CUDA context and library workspaces of every GPU, and communicator
  buffers where the replica has peers (TP or PP > 1), as vLLM's memory profile
  measured them (heuristics/inference.yaml).

A plan fits when the sum is within the usable HBM of
``autoconfig.training.memory.usable_bytes``.
"""

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from autoconfig.core.hardware import GPU
from autoconfig.core.model import ModelSpec, attention_linears, expert_params
from autoconfig.inference.plan import InferencePlanTable, InferenceWorkload, stage_layers
from autoconfig.core.plan import stage_kind_columns
from autoconfig.inference.constants import inference_constant
from autoconfig.training.memory import load_constants, stage_params, usable_bytes
from autoconfig.units import GIB

FRAMEWORK = "megatron-core"
"""Whose allocator fragmentation of heuristics/memory.yaml applies: megatron-core's
static inference runs in the same PyTorch caching allocator as its training."""
ACTIVATION_BYTES = 2
"""bf16 activations (fp8 runs still keep activations in bf16)."""
LOGITS_BYTES = 4
"""Logits are cast to fp32 for sampling."""


@dataclass(frozen=True)
class InferenceMemory:
    """Bytes per GPU of each plan (numpy arrays, one entry per plan)."""

    weights_bytes: np.ndarray
    kv_cache_bytes: np.ndarray
    activation_bytes: np.ndarray
    overhead_bytes: np.ndarray
    """Allocator fragmentation and CUDA context/NCCL/framework buffers."""
    total_bytes: np.ndarray


@lru_cache(maxsize=None)
def _context_gib() -> tuple[float, float]:
    return (inference_constant("runtime_context_gib", "GiB"),
            inference_constant("communicator_buffers_gib", "GiB"))


def runtime_context_bytes(plans: InferencePlanTable) -> np.ndarray:
    """Device memory of each plan's GPU outside the caching allocator: the CUDA
    context and library workspaces, plus communicator buffers where the replica
    spans more than one GPU (none to allocate at TP 1 and PP 1)."""
    alone, peers = _context_gib()
    return (alone + np.where(plans.tp * plans.pp > 1, peers, 0.0)) * GIB


def kv_heads_per_gpu(model: ModelSpec, tp):
    """KV heads one GPU holds: kv_heads/tp, at least 1 (replicated beyond)."""
    return np.maximum(1.0, model.num_kv_heads / np.asarray(tp, dtype=float))


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp, pp, bytes_per_value: float):
    """2 (K and V) * layers of the stage * kv heads per GPU * head dim * bytes.

    Multi-latent attention caches one compressed latent and the shared rope key
    per token and layer, kv_lora + rope values, for all heads at once (DeepSeek-V2
    arXiv 2405.04434 Sec. 2.1.2, Table 1: (d_c + d_h^R) l elements per token), so
    every TP rank holds all of it."""
    layers = stage_layers(model.num_layers, pp)
    if model.attention_kind == "mla":
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        return layers * latent * bytes_per_value + 0.0 * np.asarray(tp, dtype=float)
    return 2.0 * layers * kv_heads_per_gpu(model, tp) * model.head_dim * bytes_per_value


def expert_tp(tp, ep):
    """Expert tensor parallelism of a serving plan: whole experts (1) when spread
    over ep > 1 GPUs, else split over the replica's tp ranks."""
    return np.where(np.asarray(ep) > 1, 1, np.asarray(tp))


def weights_bytes_per_gpu(model: ModelSpec, tp, pp, bytes_per_value: float, ep=1):
    """Parameters of the heavier of the first and last stage, over tp (routed
    experts over ep, ``expert_tp``), times bytes."""
    tp = np.asarray(tp, dtype=np.int64)
    pp = np.asarray(pp, dtype=np.int64)
    ep = np.asarray(ep, dtype=np.int64)
    # A serving job asks this once per simulated step with the same layouts.
    shape = np.broadcast_shapes(tp.shape, pp.shape, ep.shape)
    columns = tuple(tuple(np.broadcast_to(a, shape).ravel().tolist()) for a in (tp, pp, ep))
    return _weights_bytes_cached(model, columns, shape, bytes_per_value).copy()


@lru_cache(maxsize=256)
def _weights_bytes_cached(model: ModelSpec, columns: tuple, shape: tuple,
                          bytes_per_value: float) -> np.ndarray:
    tp, pp, ep = (np.array(c, dtype=np.int64).reshape(shape) for c in columns)
    return _weights_bytes(model, tp, pp, bytes_per_value, ep)


def _weights_bytes(model: ModelSpec, tp, pp, bytes_per_value: float, ep) -> np.ndarray:
    layers, single = stage_layers(model.num_layers, pp), pp == 1
    experts = {}
    if model.is_moe:
        # Uneven stages: the heaviest at either end, where the embedding and the
        # output layer also sit (each end taken on its own).
        heavy = np.where(model.num_layers % pp == 0, 0, layers).astype(np.int64)
        kinds = stage_kind_columns(model, pp, heavy, heavy)
        experts = {"ep": ep, "etp": expert_tp(tp, ep)}
    params = np.maximum(
        stage_params(model, tp, layers, "first", single,
                     kinds=kinds["first"] if experts else None, **experts),
        stage_params(model, tp, layers, "last", single,
                     kinds=kinds["last"] if experts else None, **experts))
    return np.asarray(params, dtype=float) * bytes_per_value


def moe_layer_share(model: ModelSpec) -> float:
    """Share of ``model``'s layers that are MoE layers (0 for a dense model): a
    pipeline stage of ``L / pp`` layers holds that share of them, as the serving
    model spreads a model's kinds evenly over its stages."""
    return model.layers_of("moe") / model.num_layers


def per_layer_mean(model: ModelSpec, dense, moe):
    """A per-layer quantity averaged over ``model``'s layers: ``dense`` for its dense
    layers, ``moe`` for its MoE layers, in their shares (``moe_layer_share``)."""
    share = moe_layer_share(model)
    return (1.0 - share) * dense + share * moe


def expert_bytes_per_gpu(model: ModelSpec, tp, pp, bytes_per_value: float, ep=1):
    """Routed-expert weights of the heavier stage on one GPU (0 for dense models)."""
    if not model.is_moe:
        return 0.0 * np.asarray(tp, dtype=float)
    layers = stage_layers(model.num_layers, pp)
    local = model.num_experts / np.asarray(ep, dtype=float) / expert_tp(tp, ep)
    return layers * moe_layer_share(model) * local * expert_params(model) * bytes_per_value


def kv_tokens_per_request(workload: InferenceWorkload, block_tokens: int | None,
                          steady_state: bool, reserves_output: bool = False) -> float:
    """KV-cache tokens one request holds (module doc): the whole sequence for a
    contiguous cache or a static batch's peak; ``input + output/2`` in whole
    blocks for a paged cache at steady state, or its whole sequence where the
    engine reserves the output at admission (``Engine.kv_reserves_output``: the
    blocks are held from the first token, not filled as it decodes)."""
    if not block_tokens:
        return float(workload.total_len_tokens)
    grows = steady_state and not reserves_output
    held = workload.input_len_tokens + (workload.held_output_tokens if grows
                                        else workload.output_len_tokens)
    return float(np.ceil(held / block_tokens) * block_tokens)


def allocator_fragmentation(engine=None) -> float:
    """Device bytes per allocated byte: the engine's allocator's
    (``Engine.allocator_fragmentation``), else megatron-core's caching
    allocator's (heuristics/memory.yaml)."""
    if engine is not None and engine.allocator_fragmentation is not None:
        return engine.allocator_fragmentation
    return load_constants().overhead_of(FRAMEWORK)[0]


def memory_per_gpu(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
                   activation_tokens, kv_tokens: float | None = None,
                   pooled: bool = False, engine=None) -> InferenceMemory:
    """Memory per GPU of every plan; ``activation_tokens``: tokens of the largest
    forward pass the latency model chose (array, one per plan); ``kv_tokens``:
    KV tokens per request (default the whole sequence). ``pooled``: the KV cache
    is a pool of a size its user set, allocated once at start in whole blocks,
    so it leaves no fragments (the allocator's overhead is on the rest).
    ``engine``: whose allocator (``allocator_fragmentation``)."""
    fragmentation = allocator_fragmentation(engine)
    context_bytes = runtime_context_bytes(plans)
    tp = plans.tp.astype(float)
    weights = weights_bytes_per_gpu(model, plans.tp, plans.pp, workload.weight_bytes_per_value,
                                    plans.ep)
    kv = (kv_bytes_per_token_per_gpu(model, plans.tp, plans.pp, workload.kv_bytes_per_value)
          * plans.batch * (workload.total_len_tokens if kv_tokens is None else kv_tokens))
    h, f = model.hidden_size, model.ffn_hidden_size
    if model.is_moe:  # the routed copies of a token and the shared experts
        f = model.moe_topk * model.moe_ffn_hidden_size + model.moe_shared_expert_ffn_hidden_size
    up = 2 if model.mlp_kind == "swiglu" else 1
    tokens = np.asarray(activation_tokens, dtype=float)
    # The residual stream and its norm (2h), the attention projections' outputs
    # (``_attention_outputs``) and the MLP's up projection, per token of the pass.
    per_token = 2.0 * h + _attention_outputs(model, tp) + up * f / tp
    activations = (tokens * per_token * ACTIVATION_BYTES
                   + plans.batch * model.vocab_size / tp * LOGITS_BYTES)
    allocated = weights + kv + activations
    overhead = (allocated - (kv if pooled else 0.0)) * (fragmentation - 1.0) + context_bytes
    return InferenceMemory(weights_bytes=weights, kv_cache_bytes=kv,
                           activation_bytes=activations, overhead_bytes=overhead,
                           total_bytes=allocated + overhead)


def _attention_outputs(model: ModelSpec, tp):
    """Values per token the attention's input projections write on one GPU
    (``attention_linears``: a column-parallel one's output split over tp, a
    replicated one's whole): q + 2 kv over tp for GQA, with q the heads' width,
    not the hidden size (Qwen3: twice it); MLA's latents whole and its up
    projections' heads split."""
    return sum(x.out_features / np.where(x.parallel == "column", tp, 1.0)
               for x in attention_linears(model) if x.parallel != "row")


def kv_capacity_tokens(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
                       activation_tokens, gpu: GPU, pool_tokens=None,
                       engine=None) -> np.ndarray:
    """KV-cache tokens each plan's replica has room for once its weights,
    activations and overheads are placed (0 when they alone do not fit): the
    pool a paged engine admits requests against. ``pool_tokens`` (a number or
    one per plan): the pool the engine allocates at start, as its user set it
    (``Engine.kv_cache_tokens``) or its memory rule sizes it (``pool_tokens``),
    once and unfragmented (``memory_per_gpu`` ``pooled``): the capacity where
    the room left beside the rest holds it, 0 where it does not (the engine
    cannot allocate it and does not start)."""
    fragmentation = allocator_fragmentation(engine)
    context_bytes = runtime_context_bytes(plans)
    fixed = memory_per_gpu(model, workload, plans, activation_tokens, 0.0, engine=engine)
    rest = fixed.weights_bytes + fixed.activation_bytes
    per_token = kv_bytes_per_token_per_gpu(model, plans.tp, plans.pp, workload.kv_bytes_per_value)
    if pool_tokens is None:
        room = (usable_bytes(gpu) - context_bytes) / fragmentation - rest
        return np.maximum(room, 0.0) / per_token
    pool = np.broadcast_to(np.asarray(pool_tokens, dtype=float), per_token.shape)
    room = usable_bytes(gpu) - context_bytes - fragmentation * rest
    return np.where((pool > 0) & (room >= pool * per_token), pool, 0.0)


def pool_tokens(model: ModelSpec, workload: InferenceWorkload, plans: InferencePlanTable,
                activation_tokens, gpu: GPU, engine) -> np.ndarray | None:
    """The KV pool of each plan's replica in tokens as the engine allocates it at
    start: its user's (``Engine.kv_cache_tokens``) or its memory rule's
    (``Engine.kv_pool``, ``KvPoolRule``: the loaded weights at their bytes and the
    activations with the allocator's fragmentation, plus the runtime context,
    against the GPU's usable memory); None for an engine without either (its cache takes what
    memory leaves, ``kv_capacity_tokens``). A rule that leaves nothing gives 0:
    the layout does not fit."""
    if engine.kv_cache_tokens is not None:
        return np.full(len(plans), float(engine.kv_cache_tokens))
    rule = engine.kv_pool
    if rule is None or not engine.paged:
        return None
    fragmentation = allocator_fragmentation(engine)
    total = usable_bytes(gpu)
    context = runtime_context_bytes(plans)
    fixed = memory_per_gpu(model, workload, plans, activation_tokens, 0.0, engine=engine)
    weights = fixed.weights_bytes       # measured by the engine once loaded (module doc)
    loaded = weights + fragmentation * fixed.activation_bytes + context
    share = rule.share_of(total, engine.max_batched_tokens, plans.tp, plans.pp,
                          engine.graph_max_seqs(plans.tp))
    if rule.of == "free":
        pool = share * (total - loaded)
    elif rule.of == "total":
        pool = share * total - loaded
    else:                                   # static: weights and pool within the share
        pool = share * total - weights - context
    per_token = kv_bytes_per_token_per_gpu(model, plans.tp, plans.pp, workload.kv_bytes_per_value)
    block = float(engine.kv_block_tokens)             # allocated in whole blocks
    return np.floor(np.maximum(pool, 0.0) / per_token / block) * block


def fits(memory: InferenceMemory, gpu: GPU) -> np.ndarray:
    return memory.total_bytes <= usable_bytes(gpu)
