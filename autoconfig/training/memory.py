"""Per-GPU memory of a training plan on its most loaded pipeline stage.

Vectorised over a PlanTable: every formula works on numpy columns, so a
million plans take a fraction of a second. The numbers (bytes per parameter,
logits bytes, overhead constants, usable HBM) live in heuristics/memory.yaml
with their sources; the two overhead constants are fitted by
benchmarks/fit_memory.py on the measured rows of benchmarks/published_runs.csv
(mapped to plans by autoconfig/validation/runs.py, as ``autoconfig validate`` does).

Model states (Megatron-LM ``theoretical_memory_usage.py`` and
``docs/user-guide/features/dist_optimizer.md``): bf16 weights 2 B/param,
fp32 main grads 4 B/param, fp32 master params + Adam m and v 12 B/param,
the last sharded over DP x CP with the distributed optimizer: 18 vs
6 + 12/d bytes per parameter. FP8 (Transformer Engine) keeps the bf16
weights and casts per GEMM, so it is counted as bf16.
"""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from autoconfig.training.fp8 import nvfp4_value
from autoconfig.training.offload import held_layers, offloaded_layers
from autoconfig.training.activations import (chunks_in_flight, cross_attention_bytes,
                                             encoder_output_bytes, layer_activation_bytes,
                                             microbatches_per_step, recompute_chunk_bytes,
                                             recompute_transient_bytes)
from autoconfig.errors import CatalogError, InputError
from autoconfig.core.hardware import GPU
from autoconfig.core.model import (ModelSpec, attention_block_params, attention_extra_params,
                                   attention_linears, cross_attention_linears,
                                   cross_attention_params, final_norm_params,
                                   expert_params, kind_params, layer_params, mlp_linears,
                                   mtp_kind, mtp_params, norm_params, router_params,
                                   embedding_params, output_layer_params,
                                   logits_tokens_per_sample,
                                   shared_expert_params,
                                   total_params)
from autoconfig.paths import heuristics_dir
from autoconfig.core.plan import (RECOMPUTE_KINDS, RECOMPUTE_METHODS, PlanTable, Workload,
                                  stage_kind_columns, stage_layer_columns)
from autoconfig.training.stack import SoftwareFeatures
from autoconfig.yamlio import load_yaml, sourced_number

_FULL = RECOMPUTE_KINDS.index("full")
_BLOCK = RECOMPUTE_METHODS.index("block")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-GPU bytes on the most loaded pipeline stage; each field is a numpy array (one entry per plan)."""

    weights_bytes: np.ndarray
    """bf16 model weights of the stage (incl. embedding/output where that stage holds them)."""
    gradients_bytes: np.ndarray
    """Main grads (fp32 in Megatron DDP) of the stage."""
    optimizer_bytes: np.ndarray
    """fp32 master params + Adam m and v, sharded by DP x CP with the distributed optimizer."""
    activations_bytes: np.ndarray
    """In-flight activations (Korthikanti et al. 2022 + pipeline schedule)."""
    logits_bytes: np.ndarray
    """Output logits / loss buffers on the stage that holds the output layer."""
    overhead_bytes: np.ndarray
    """Communication buffers + allocator fragmentation + CUDA context (calibrated)."""
    total_bytes: np.ndarray


@dataclass(frozen=True)
class StateRecipe:
    """Bytes per parameter of one mixed-precision recipe."""

    weight_bytes: float
    grad_bytes: float
    sharded_bytes: float
    """fp32 master copy and optimizer moments: what the distributed optimizer shards."""


@dataclass(frozen=True)
class MemoryConstants:
    """The numbers of heuristics/memory.yaml (each sourced there)."""

    recipes: dict
    logits_bytes_per_element: float
    overheads: dict
    """Framework -> (fragmentation factor, fixed context bytes): device memory =
    factor x allocated + context."""
    fp8_weight_cache_bytes: float
    datasheet_gb_bytes: float
    usable_fraction: float

    def overhead_of(self, framework: str) -> tuple[float, float]:
        if framework not in self.overheads:
            raise CatalogError(f"heuristics/memory.yaml: no overhead for framework "
                               f"{framework!r}: add it under 'overhead' (known: "
                               f"{', '.join(sorted(self.overheads))})")
        return self.overheads[framework]


@lru_cache(maxsize=None)
def load_constants(path: Path | None = None) -> MemoryConstants:
    """Read heuristics/memory.yaml once; every number must carry a source."""
    path = path or heuristics_dir() / "memory.yaml"
    data = load_yaml(path)
    recipes_raw = data.get("bytes_per_param")
    if not isinstance(recipes_raw, dict) or "bf16" not in recipes_raw:
        raise CatalogError(f"{path}: 'bytes_per_param' must map recipes (at least bf16) "
                           "to weights/main_grads/sharded_states")
    recipes = {name: StateRecipe(*(float(sourced_number(entry, key, path)) for key in
                                   ("weights", "main_grads", "sharded_states")))
               for name, entry in recipes_raw.items()}
    overhead = data.get("overhead") or {}
    return MemoryConstants(
        recipes=recipes,
        logits_bytes_per_element=float(sourced_number(data, "logits_bytes_per_element", path)),
        overheads={name: (float(sourced_number(entry, "fragmentation_factor", path)),
                          float(sourced_number(entry, "context_gib", path)) * 2**30)
                   for name, entry in overhead.items()},
        fp8_weight_cache_bytes=float(sourced_number(data, "fp8_weight_cache_bytes_per_param",
                                                    path)),
        datasheet_gb_bytes=float(sourced_number(data, "datasheet_gb_bytes", path)),
        usable_fraction=float(sourced_number(data, "usable_fraction", path)))


def distributed_optimizer_bytes_per_param(recipe: StateRecipe, shards, distributed):
    """Megatron dist_optimizer.md table: ``w + g + k`` bytes per parameter,
    or ``w + g + k / d`` when the distributed optimizer shards over d ranks
    (bf16: 18 vs 6 + 12/d; fp16: 20 vs 4 + 16/d; fp32: 16 vs 8 + 8/d)."""
    shards = np.where(distributed, shards, 1)
    return recipe.weight_bytes + recipe.grad_bytes + recipe.sharded_bytes / shards


def _replicated_layer_params(model: ModelSpec) -> int:
    """Parameters of one layer whole on every TP rank: the two norms, the
    row-parallel biases (attention output, MLP output), MLA's down-projections
    and latent norms, Q/K norms."""
    h = model.hidden_size
    linears = sum(x.params for x in attention_linears(model) if x.parallel == "replicated")
    return 2 * norm_params(model) + (2 * h if model.has_bias else 0) + linears \
        + attention_extra_params(model)


def dense_layer_params_per_gpu(model: ModelSpec, tp):
    """One dense layer on one GPU: Megatron TP splits the matmul weights and the
    column-parallel biases; ``_replicated_layer_params`` stay whole."""
    replicated = _replicated_layer_params(model)
    return (layer_params(model) - replicated) / tp + replicated


def cross_attention_params_per_gpu(model: ModelSpec, tp):
    """One decoder layer's cross-attention on one GPU: its matmul weights and
    column-parallel biases split over TP; its norm and the row-parallel
    output bias whole on every rank."""
    whole = norm_params(model) + (model.hidden_size if model.has_bias else 0)
    return (cross_attention_params(model) - whole) / tp + whole


def kind_layer_params_per_gpu(model: ModelSpec, kind: str, tp):
    """One dense-style layer of a kind on one GPU (MoE layers: see
    ``moe_layer_params_per_gpu``): encoder layers are dense layers, decoder
    layers add their cross-attention."""
    dense = dense_layer_params_per_gpu(model, tp)
    return dense + cross_attention_params_per_gpu(model, tp) if kind == "decoder" else dense


def moe_layer_params_per_gpu(model: ModelSpec, tp, ep, etp):
    """(non-expert, expert) parameters of one MoE layer on one GPU.

    Attention as a dense layer's; the router's gate whole on every rank; the
    shared experts split over tp like a dense MLP; the routed experts split
    over ep (E/ep experts a rank) and each expert over etp (megatron-core
    ``SequentialMLP``/``TEGroupedMLP`` with expert tensor parallelism)."""
    replicated = _replicated_layer_params(model)
    attention = attention_block_params(model)
    non_expert = (attention - replicated) / tp + replicated + router_params(model) \
        + shared_expert_params(model) / tp
    expert = model.num_experts / np.asarray(ep, dtype=float) * expert_params(model) / etp
    return non_expert, expert


def stage_params(model: ModelSpec, tp, layers, stage: str, single, ep=1, etp=1,
                 kinds: dict | None = None):
    """Parameters one GPU of the first, a middle or the last pipeline stage holds.

    ``layers`` is that stage's transformer layer count and ``single`` marks pp = 1;
    ``kinds`` (``stage_kind_columns`` of the stage) splits them into dense and MoE
    layers (default: all dense); ``stage_expert_params`` is the routed experts'
    part, which the optimizer shards over another group.
    Megatron TP sharding: matmul weights and column-parallel biases split
    over TP; the two norms and the row-parallel biases (attention output,
    MLP output) are replicated. Word embeddings are vocab-parallel (V h / t)
    on the first stage, learned position embeddings replicated there. The
    last stage holds the final norm and the output layer (V h / t), which
    Megatron keeps as a copy of the word embeddings when they are tied and
    pp > 1, and the MTP modules. With pp = 1 the one stage holds all of it.
    """
    h = model.hidden_size
    kinds = kinds or {"dense": layers, "moe": 0.0}
    params = sum(kinds.get(kind, 0.0) * kind_layer_params_per_gpu(model, kind, tp)
                 for kind in ("dense", "encoder", "decoder"))
    if model.is_moe:
        params = params + kinds["moe"] * sum(moe_layer_params_per_gpu(model, tp, ep, etp))
    word = model.vocab_size * h / tp
    positions = embedding_params(model) - model.vocab_size * h
    # Untied: the output layer; tied: nothing, or T5's vocabulary-parallel bias.
    output = output_layer_params(model) / tp
    final = final_norm_params(model)
    if stage == "middle":
        return params
    mtp = _mtp_params_per_gpu(model, tp, ep, etp)
    if stage == "first":
        return params + word + positions + np.where(single, final + output + mtp, 0.0)
    # pp > 1: the output layer (untied) or the tied copy, both V h / t.
    return params + final + word + mtp + np.where(single, positions + output, 0.0)


def _mtp_params_per_gpu(model: ModelSpec, tp, ep, etp):
    """The MTP modules on the last stage (megatron-core places them there)."""
    if not model.mtp_layers:
        return 0.0
    h = model.hidden_size
    kind = mtp_kind(model)
    body = (sum(moe_layer_params_per_gpu(model, tp, ep, etp)) if kind == "moe"
            else dense_layer_params_per_gpu(model, tp))
    # Beside its layer: norms (whole on every rank) and the 2h x h projection (split).
    extra = mtp_params(model) - kind_params(model, kind)
    return model.mtp_layers * (body + (extra - 2 * h * h) + 2 * h * h / tp)


def stage_expert_params(model: ModelSpec, ep, etp, kinds: dict, stage: str, single):
    """Routed-expert parameters one GPU of the stage holds (MTP's on the last)."""
    if not model.is_moe:
        return 0.0
    _, expert = moe_layer_params_per_gpu(model, 1, ep, etp)
    mtp = model.mtp_layers if mtp_kind(model) == "moe" else 0
    holds_mtp = single if stage != "last" else True
    return (kinds["moe"] + np.where(holds_mtp, mtp, 0)) * expert


def linear_params(model: ModelSpec, tp, layers, kinds: dict | None = None, ep=1, etp=1):
    """Weights of the stage's linear layers per GPU: what Transformer Engine
    keeps an FP8 copy of in FP8 training (attention, MLP, shared and the local
    routed experts)."""
    kinds = kinds or {"dense": layers, "moe": 0.0}
    attention = sum(x.params / (1 if x.parallel == "replicated" else tp)
                    for x in attention_linears(model))
    dense_mlp = sum(x.params for x in mlp_linears(model, model.ffn_hidden_size)) / tp
    moe = 0.0
    if model.is_moe:
        shared = sum(x.params for x in mlp_linears(model, model.moe_shared_expert_ffn_hidden_size))
        routed = sum(x.params for x in mlp_linears(model, model.moe_ffn_hidden_size))
        moe = shared / tp + model.num_experts / np.asarray(ep, dtype=float) * routed / etp
    cross = sum(x.params for x in cross_attention_linears(model)) / tp
    return (kinds.get("dense", 0.0) * (attention + dense_mlp) + kinds.get("moe", 0.0)
            * (attention + moe) + kinds.get("encoder", 0.0) * (attention + dense_mlp)
            + kinds.get("decoder", 0.0) * (attention + dense_mlp + cross))


def _activation_terms(model: ModelSpec, workload: Workload, plans: PlanTable,
                      software: SoftwareFeatures) -> dict:
    """Per-plan arrays shared by every stage (computed once): per-layer bytes
    kept, stored inputs under full recompute, the micro-batch count and the
    embedding mask, the layers of the first, a middle and the last stage and
    how many of them are of each kind. ``full_layer`` and ``kept_layer`` map
    each stage to its average layer (dense and MoE layers keep different
    amounts); ``moe_kept_layer`` is one MoE layer's (the MTP modules')."""
    args = (model, workload.seq_len, plans.mbs, plans.tp, plans.sp)
    kw = {"flash_attention": software.flash_attention, "cp": plans.cp,
          "fp8_inputs": fp8_stores_inputs(workload, software)}
    selective = plans.recompute == RECOMPUTE_KINDS.index("selective")
    if model.is_encoder_decoder:
        return _encoder_decoder_terms(model, workload, plans, kw, selective)
    stored_input = layer_activation_bytes(*args, _FULL, **kw)

    def of_kind(kind):
        layer_kw = dict(kw, kind=kind, etp=plans.etp)
        full = layer_activation_bytes(*args, 0, **layer_kw)
        # Selective keeps its smaller set (less what its modules recompute); layers
        # that full/block leaves alone keep all.
        kept = layer_activation_bytes(*args, 1, modules=plans.recompute_modules, **layer_kw)
        return full, np.where(selective, kept, full)

    full_dense, kept_dense = of_kind("dense")
    layers = stage_layer_columns(model.num_layers, plans.pp, plans.first_stage_layers,
                                 plans.last_stage_layers)
    full_layer = {stage: full_dense for stage in STAGE_RANKS}
    kept_layer = {stage: kept_dense for stage in STAGE_RANKS}
    kinds = None
    moe_kept = kept_dense
    if model.is_moe:
        full_moe, moe_kept = of_kind("moe")
        kinds = stage_kind_columns(model, plans.pp, plans.first_stage_layers,
                                   plans.last_stage_layers)
        for stage in STAGE_RANKS:
            n = np.maximum(kinds[stage]["dense"] + kinds[stage]["moe"], 1.0)
            share = kinds[stage]["moe"] / n
            full_layer[stage] = full_dense + share * (full_moe - full_dense)
            kept_layer[stage] = kept_dense + share * (moe_kept - kept_dense)
    m = microbatches_per_step(workload.global_batch_size, plans.mbs, plans.dp)
    # Embedding dropout mask (s b h bytes) per in-flight micro-batch on the
    # first stage, as Megatron's theoretical_memory_usage.py; / t with SP.
    # None without hidden dropout (Llama): dropout with p = 0 saves no mask.
    mask = 1.0 if model.hidden_dropout > 0 else 0.0
    embedding = (mask * workload.seq_len / plans.cp * plans.mbs * model.hidden_size
                 / np.where(plans.sp, plans.tp, 1))
    return {"full_layer": full_layer, "stored_input": stored_input, "kept_layer": kept_layer,
            "moe_kept_layer": moe_kept, "m": m, "embedding": embedding, "layers": layers,
            "kinds": kinds, "offloaded": offloaded_layers(plans, software)}


def _encoder_decoder_terms(model: ModelSpec, workload: Workload, plans: PlanTable,
                           kw: dict, selective) -> dict:
    """``_activation_terms`` of an encoder-decoder (one pipeline stage holds
    both stacks): per stack, the bytes of one layer kept in full, kept under
    selective recompute and stored as input under full recompute, at that
    stack's sequence length (a decoder layer with its cross-attention); the
    encoder output the decoder reads; the embedding dropout masks of both
    stacks' inputs."""
    s_enc, s_dec = workload.seq_len, model.decoder_seq_len
    tp, sp, mbs = plans.tp, plans.sp, plans.mbs
    stacks = {}
    for kind, seq in (("encoder", s_enc), ("decoder", s_dec)):
        args = (model, seq, mbs, tp, sp)
        full = layer_activation_bytes(*args, 0, **kw)
        kept = layer_activation_bytes(*args, 1, modules=plans.recompute_modules, **kw)
        stored = layer_activation_bytes(*args, _FULL, **kw)
        if kind == "decoder":
            cross = (cross_attention_bytes(model, s_enc, s_dec, mbs, tp, sp, 0,
                                           kw["flash_attention"]),
                     cross_attention_bytes(model, s_enc, s_dec, mbs, tp, sp, 1,
                                           kw["flash_attention"]))
            full, kept = full + cross[0], kept + cross[1]
        stacks[kind] = {"full": full, "kept": np.where(selective, kept, full), "stored": stored,
                        "layers": float(model.layers_of(kind))}
    mask = 1.0 if model.hidden_dropout > 0 else 0.0
    embedding = mask * (s_enc + s_dec) * mbs * model.hidden_size / np.where(sp, tp, 1)
    layers = stage_layer_columns(model.num_layers, plans.pp, plans.first_stage_layers,
                                 plans.last_stage_layers)
    kinds = stage_kind_columns(model, plans.pp, plans.first_stage_layers,
                               plans.last_stage_layers)
    return {"stacks": stacks, "encoder_output": encoder_output_bytes(model, s_enc, mbs, tp, sp),
            "embedding": embedding, "layers": layers, "kinds": kinds}


def encoder_decoder_activations(plans: PlanTable, terms: dict) -> dict:
    """Activation bytes of each stack of an encoder-decoder on its one stage:
    ``encoder`` (its layers and input masks), ``decoder`` (its layers, their
    cross-attention keys and values, and the encoder output they read), and
    the transient of one recomputed group. Megatron's recompute settings
    apply to each stack's block alike (block: its first N layers)."""
    recompute_full = plans.recompute == _FULL
    block = plans.recompute_method == _BLOCK
    out, transient = {}, 0.0
    for kind, stack in terms["stacks"].items():
        out[kind] = recompute_chunk_bytes(stack["layers"], stack["kept"], stack["stored"],
                                          recompute_full, block, plans.recompute_num_layers)
        transient = np.maximum(transient, recompute_transient_bytes(
            stack["layers"], stack["full"], recompute_full, block, plans.recompute_num_layers))
    out["encoder"] = out["encoder"] + terms["embedding"]
    out["decoder"] = out["decoder"] + terms["encoder_output"]
    out["transient"] = transient
    return out


def fp8_stores_inputs(workload: Workload, software: SoftwareFeatures) -> bool:
    """Transformer Engine FP8 training (megatron-core) saves its linear layers'
    inputs for the weight gradient in FP8, the cast it already made for the
    forward GEMM (``transformer_engine/pytorch/module/linear.py``: ctx saves the
    FP8 ``inputmat``), so those tensors take 1 byte instead of 2. NVFP4 keeps
    its 0.5625-byte casts the same way; they are counted at FP8's 1 byte, which
    errs on the side of fitting less (the NVFP4 weights are counted as such:
    ``_stage_states``)."""
    return workload.precision in ("fp8", "nvfp4") and software.framework == "megatron-core"


STAGE_RANKS = {"first": 0, "middle": 1, "last": -1}


def _stage_activations(model: ModelSpec, plans: PlanTable, terms: dict, stage: str):
    """Activation bytes a rank of the first, second (a middle) or last stage
    holds at its peak: in-flight model chunks x the chunk's kept bytes, plus
    one recomputed group live in backward."""
    if model.is_encoder_decoder:
        return sum(encoder_decoder_activations(plans, terms).values())
    pp, vp = plans.pp, plans.vp
    rank = pp - 1 if stage == "last" else np.minimum(STAGE_RANKS[stage], pp - 1)
    layers_per_chunk = held_layers(terms["layers"][stage] / np.where(pp > 1, vp, 1),
                                   terms["offloaded"])
    recompute_full = plans.recompute == _FULL
    block = plans.recompute_method == _BLOCK
    per_chunk = recompute_chunk_bytes(layers_per_chunk, terms["kept_layer"][stage],
                                      terms["stored_input"], recompute_full, block,
                                      plans.recompute_num_layers)
    transient = recompute_transient_bytes(layers_per_chunk, terms["full_layer"][stage],
                                          recompute_full, block, plans.recompute_num_layers)
    held = chunks_in_flight(pp, vp, terms["m"], rank) * per_chunk + transient
    if stage == "first":
        held = held + chunks_in_flight(pp, 1, terms["m"], 0) * terms["embedding"]
    if model.mtp_layers:
        # MTP modules run after the last layer, not recomputed, one micro-batch
        # in flight on the last stage's last chunk.
        mtp = model.mtp_layers * terms["moe_kept_layer"] * chunks_in_flight(pp, 1, terms["m"],
                                                                             pp - 1)
        held = held + np.where((pp == 1) | (stage == "last"), mtp, 0.0)
    return held


def _logits_bytes(model: ModelSpec, workload: Workload, plans: PlanTable,
                  constants: MemoryConstants):
    """Loss buffers on the stage with the output layer, one micro-batch.

    Korthikanti et al. 2022 Sec. 4.3: the cross entropy keeps fp32 logits,
    4 s b V / t bytes; megatron-core ``tensor_parallel/cross_entropy.py``
    (``calculate_logits_max``: ``vocab_parallel_logits.float()``, then
    ``ctx.save_for_backward(exp_logits, ...)``) makes that fp32 copy while
    the bf16 logits (2 bytes) are still alive: 6 bytes per logit at the
    peak. Plus the final-norm and output-layer inputs, 4 s b h (Megatron's
    theoretical_memory_usage.py ``4 s b h (1 + V/h)`` for p = 1).
    """
    tokens = logits_tokens_per_sample(model, workload.seq_len) / plans.cp * plans.mbs
    # Each MTP module computes and keeps its own logits and loss the same way.
    return (1 + model.mtp_layers) * tokens * (
        constants.logits_bytes_per_element * model.vocab_size / plans.tp
        + 4.0 * model.hidden_size)


def _recipe(constants: MemoryConstants, recipe: str | None) -> StateRecipe:
    # FP8 training keeps bf16 weights (plus TE's FP8 copies, counted apart).
    name = recipe or "bf16"
    if name not in constants.recipes:
        raise InputError(f"unknown precision recipe {name!r}: allowed are "
                         f"{', '.join(sorted(constants.recipes))}")
    return constants.recipes[name]


def grad_bytes_per_param(states: StateRecipe, software: SoftwareFeatures) -> float:
    """Bytes of the main-gradient buffer per parameter. megatron-core's DDP
    allocates it in fp32 when gradients are reduced in fp32 and in the
    parameter dtype otherwise (``distributed/param_and_grad_buffer.py``:
    ``grad_dtype = torch.float if ddp_config.grad_reduce_in_fp32 else param dtype``),
    so --grad-reduce-dtype bf16 halves it; other frameworks keep their recipe's."""
    if software.framework == "megatron-core":
        return min(states.grad_bytes, float(software.grad_reduce_bytes))
    return states.grad_bytes


def stage_breakdown(model: ModelSpec, workload: Workload, plans: PlanTable, stage: str, *,
                    software: SoftwareFeatures | None = None, recipe: str | None = None,
                    constants: MemoryConstants | None = None,
                    _terms: dict | None = None) -> MemoryBreakdown:
    """Memory of a rank of the ``first``, ``middle`` (the second) or ``last``
    pipeline stage.

    Later middle stages never exceed the second (same layers, fewer
    micro-batches in flight), so these three bound every stage, uneven splits
    included.
    """
    if stage not in STAGE_RANKS:
        raise InputError(f"invalid stage {stage!r}: allowed are {', '.join(STAGE_RANKS)}")
    constants = constants or load_constants()
    software = software or SoftwareFeatures()
    states = _recipe(constants, recipe)
    pp = plans.pp
    single = pp == 1
    terms = _terms or _activation_terms(model, workload, plans, software)
    weights, grads, optimizer = _stage_states(model, workload, plans, stage, software, constants,
                                              states, terms["layers"][stage],
                                              terms["kinds"][stage] if terms["kinds"] else None)
    holds_output = single if stage != "last" else np.ones(len(plans), dtype=bool)
    activations = _stage_activations(model, plans, terms, stage)
    logits = np.where(holds_output, _logits_bytes(model, workload, plans, constants), 0.0)
    allocated = weights + grads + optimizer + activations + logits
    fragmentation, context = constants.overhead_of(software.framework)
    overhead = allocated * (fragmentation - 1.0) + context
    return MemoryBreakdown(weights_bytes=weights, gradients_bytes=grads,
                           optimizer_bytes=optimizer, activations_bytes=activations,
                           logits_bytes=logits, overhead_bytes=overhead,
                           total_bytes=allocated + overhead)


def _stage_states(model: ModelSpec, workload: Workload, plans: PlanTable, stage: str,
                  software: SoftwareFeatures, constants: MemoryConstants, states: StateRecipe,
                  layers, kinds):
    """(weights, gradients, optimizer) bytes of one GPU of a stage."""
    single = plans.pp == 1
    experts = {"ep": plans.ep, "etp": plans.etp, "kinds": kinds}
    params = stage_params(model, plans.tp, layers, stage, single, **experts)
    if stage == "middle":
        params = np.where(single, stage_params(model, plans.tp, layers, "first", single,
                                               **experts), params)
    shards = plans.dp * plans.cp
    sharded = np.where(plans.distributed_optimizer, states.sharded_bytes / shards,
                       states.sharded_bytes)
    weights = params * states.weight_bytes
    if workload.precision == "nvfp4" and software.framework == "megatron-core":
        # FP4 weights (--fp4-param-gather, as the Bridge NVFP4 recipes set it): the
        # linear layers keep no 16-bit copy, only their NVFP4 row-wise and
        # column-wise data (the fp32 master copy is in the optimizer states).
        weights = weights + linear_params(model, plans.tp, layers, kinds, plans.ep, plans.etp) \
            * (2.0 * nvfp4_value("input_bytes_per_element") - states.weight_bytes)
    elif fp8_stores_inputs(workload, software):
        weights = weights + linear_params(model, plans.tp, layers, kinds, plans.ep,
                                          plans.etp) * constants.fp8_weight_cache_bytes
    grads = params * grad_bytes_per_param(states, software)
    optimizer = params * sharded
    if model.is_moe:
        # The distributed optimizer shards routed experts over the expert
        # data-parallel group (tp*cp*dp/(ep*etp) ranks), the rest over dp*cp.
        expert = stage_expert_params(model, plans.ep, plans.etp, kinds, stage, single)
        optimizer = (params - expert) * sharded + expert * np.where(
            plans.distributed_optimizer, states.sharded_bytes / plans.edp, states.sharded_bytes)
    if software.param_gathers_per_microbatch > 0:
        weights, grads, optimizer = _fully_sharded_states(
            model, plans, params, layers, shards, states, software, kinds)
    return weights, grads, optimizer


def states_lower_bound(model: ModelSpec, workload: Workload, plans: PlanTable, *,
                       software: SoftwareFeatures | None = None,
                       recipe: str | None = None) -> np.ndarray:
    """Device bytes of the most loaded stage's weights, gradients and optimizer
    state alone, with the allocator and context overhead: a lower bound of
    ``memory_breakdown``'s total (activations and logits only add), cheap
    enough to drop most plans that cannot fit before their activations are
    counted."""
    constants = load_constants()
    software = software or SoftwareFeatures()
    states = _recipe(constants, recipe)
    layers = stage_layer_columns(model.num_layers, plans.pp, plans.first_stage_layers,
                                 plans.last_stage_layers)
    kinds = (stage_kind_columns(model, plans.pp, plans.first_stage_layers,
                                plans.last_stage_layers)
             if model.is_moe or model.is_encoder_decoder else None)
    fragmentation, context = constants.overhead_of(software.framework)
    worst = 0.0
    for stage in STAGE_RANKS:
        total = sum(_stage_states(model, workload, plans, stage, software, constants, states,
                                  layers[stage], kinds[stage] if kinds else None))
        worst = np.maximum(worst, total)
    return worst * fragmentation + context


def states_floor(model: ModelSpec, num_gpus: int, *,
                 software: SoftwareFeatures | None = None, recipe: str | None = None) -> float:
    """Device bytes that the most loaded GPU of any plan on ``num_gpus`` GPUs
    needs at least (a lower bound of ``states_lower_bound`` for all of them):
    every parameter's weight, gradient and optimizer state is held by some GPU,
    so the most loaded one holds at least the average. One number, no plans:
    lets the infeasible explanation skip cluster sizes without enumerating."""
    constants = load_constants()
    software = software or SoftwareFeatures()
    states = _recipe(constants, recipe)
    per_param = (states.weight_bytes + grad_bytes_per_param(states, software)
                 + states.sharded_bytes)
    fragmentation, context = constants.overhead_of(software.framework)
    return total_params(model) * per_param / num_gpus * fragmentation + context


def _fully_sharded_states(model: ModelSpec, plans: PlanTable, params, layers, shards,
                          states: StateRecipe, software: SoftwareFeatures, kinds=None):
    """(weights, gradients, optimizer) bytes per GPU under PyTorch FSDP (Zhao et al.
    2023, "PyTorch FSDP", Sec. 3; ``SoftwareFeatures.param_gathers_per_microbatch``).

    Each transformer layer is one FSDP unit; the root unit (embeddings, final norm,
    output layer) stays gathered. The fp32 master weights, Adam moments and the
    reduced gradients are sharded over the data-parallel ranks. The bf16 weights
    are gathered per unit: FULL_SHARD (2 gathers per micro-batch) frees each unit
    after use, so the unit running and the one prefetched are held; SHARD_GRAD_OP
    (1 gather) keeps every unit from forward to backward. One unit's unsharded
    gradient waits for its reduce-scatter."""
    # One layer's share (dense and MoE layers averaged over the stage): MoE layers
    # hold their experts, which dwarf a dense layer.
    unit = stage_params(model, plans.tp, layers, "middle", plans.pp == 1, plans.ep, plans.etp,
                        kinds) / np.maximum(layers, 1.0)
    root = params - layers * unit
    full_shard = software.param_gathers_per_microbatch >= 2
    gathered = np.where(full_shard, root + np.minimum(layers, 2) * unit, params)
    grad = grad_bytes_per_param(states, software)
    return (gathered * states.weight_bytes, params * grad / shards + unit * grad,
            params * states.sharded_bytes / shards)


def allocated_bytes(breakdown: MemoryBreakdown) -> np.ndarray:
    """Peak bytes held by tensors (torch ``max_memory_allocated``): the total
    without the calibrated allocator and context overhead."""
    return breakdown.total_bytes - breakdown.overhead_bytes


def memory_breakdown(model: ModelSpec, workload: Workload, plans: PlanTable, *,
                     software: SoftwareFeatures | None = None,
                     recipe: str | None = None) -> MemoryBreakdown:
    """Per-GPU memory of each plan on its most loaded stage (first, middle or last).

    ``software`` (default: ``SoftwareFeatures()``) says whether attention is
    fused (no 5as^2b/t score term), how gradients are reduced (their buffer
    dtype) and which framework's allocator overhead applies. ``recipe`` picks a
    row of the bytes-per-parameter table (default bf16, also used for fp8).
    """
    software = software or SoftwareFeatures()
    terms = _activation_terms(model, workload, plans, software)
    stages = [stage_breakdown(model, workload, plans, stage, software=software, recipe=recipe,
                              _terms=terms) for stage in STAGE_RANKS]
    totals = np.stack([s.total_bytes for s in stages])
    worst = np.argmax(totals, axis=0)
    return MemoryBreakdown(**{name: np.choose(worst, [getattr(s, name) for s in stages])
                              for name in MemoryBreakdown.__dataclass_fields__})


def usable_bytes(gpu: GPU, constants: MemoryConstants | None = None) -> float:
    """HBM a training process can fill: the datasheet's "80GB" is 80 GiB
    (nvidia-smi: 81920 MiB on A100-SXM4-80GB), times the fraction left after
    the driver's reservation (memory.yaml); where the catalog gives what CUDA
    reports (``GPU.cuda_memory_mib``: ECC on GDDR6 keeps a sixteenth), that."""
    if gpu.cuda_memory_mib is not None:
        return gpu.cuda_memory_mib * 2.0**20
    constants = constants or load_constants()
    return gpu.hbm_capacity_gb * constants.datasheet_gb_bytes * constants.usable_fraction


def fits(breakdown: MemoryBreakdown, gpu: GPU) -> np.ndarray:
    """Boolean array: total <= usable capacity of the GPU."""
    return breakdown.total_bytes <= usable_bytes(gpu)


def encoder_decoder_memory(model: ModelSpec, workload: Workload, plans: PlanTable, *,
                           software: SoftwareFeatures | None = None,
                           recipe: str | None = None) -> dict:
    """Allocated bytes per GPU of an encoder-decoder's parts on its one stage:
    ``encoder`` and ``decoder`` (their layers' weights, gradients and optimizer
    state, and their activations: the decoder's include the cross-attention
    keys and values and the encoder output they read), and ``embedding and
    output`` (the shared embedding, T5's output bias, final norms, logits).
    The recompute transient goes to the stack it is largest in. The parts add
    up to the stage's allocated total."""
    software = software or SoftwareFeatures()
    constants = load_constants()
    states = _recipe(constants, recipe)
    terms = _activation_terms(model, workload, plans, software)
    layers, kinds = terms["layers"]["first"], terms["kinds"]["first"]
    weights, grads, optimizer = _stage_states(model, workload, plans, "first", software,
                                              constants, states, layers, kinds)
    params = stage_params(model, plans.tp, layers, "first", plans.pp == 1, kinds=kinds)
    per_param = (weights + grads + optimizer) / params
    acts = encoder_decoder_activations(plans, terms)
    logits = _logits_bytes(model, workload, plans, constants)
    stack_params = {kind: kinds[kind] * kind_layer_params_per_gpu(model, kind, plans.tp)
                    for kind in ("encoder", "decoder")}
    out = {kind: {"states": p * per_param, "activations": acts[kind]}
           for kind, p in stack_params.items()}
    bigger = np.where(out["encoder"]["activations"] >= out["decoder"]["activations"], 1.0, 0.0)
    out["encoder"]["activations"] = out["encoder"]["activations"] + bigger * acts["transient"]
    out["decoder"]["activations"] = (out["decoder"]["activations"]
                                     + (1.0 - bigger) * acts["transient"])
    rest = params - sum(stack_params.values())
    out["embedding and output"] = {"states": rest * per_param, "activations": logits}
    return out
