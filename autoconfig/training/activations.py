"""Activation memory of one transformer layer and of the pipeline schedule.

Pure numpy helpers for ``autoconfig.training.memory``; every argument may be a scalar
or an array (one entry per plan). Bytes assume 16-bit activations and 1-byte
dropout masks, as Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", arXiv 2205.05198) Sec. 4.

Dropout masks exist only where the model trains with dropout: Korthikanti
counts them (GPT-3 and Megatron-LM default to 0.1), Llama-family models train
without (``ModelSpec.hidden_dropout == attention_dropout == 0``). With p = 0
PyTorch's dropout returns its input and saves no mask (ATen ``dropout``: "if
p == 0 || !train ... return input"), so the mask bytes and, for attention
dropout, its separate 2-byte output are dropped.
"""

import numpy as np

from autoconfig.core.model import GATED_MLP_KINDS, ModelSpec


def layer_stored_widths(model: ModelSpec, fp8_inputs: bool = False, kind: str = "dense",
                        etp=1):
    """Bytes per token of one layer's saved tensors: (replicated, tp_split).

    Korthikanti et al. 2022 Sec. 4.1 counts per layer, in units of s*b*h:

    * kept whole on every TP rank unless sequence parallel (the ``10``):
      input of LN1 (2) and of the QKV matmul (2), attention-output dropout
      mask (1), input of LN2 (2) and of the first MLP matmul (2), MLP dropout
      mask (1);
    * split across TP ranks (the ``24``): Q and K for QK^T (2 + 2), V (2),
      input of the output projection (2), and the MLP hidden: GeLU input and
      output (8 + 8 for ffn = 4h).

    Derived here from the real tensor widths: with grouped-query attention K
    and V are ``kv_hidden`` wide (2 bytes each, so ``4 kv`` instead of 4h);
    the MLP keeps 2 bytes x ffn for the activation input and for its output
    (GeLU: 4*ffn), and SwiGLU's first matmul is 2*ffn wide (gate and up), so
    it keeps 4*ffn + 2*ffn = 6*ffn. For GPT shapes (kv = h, ffn = 4h, GeLU)
    this is 10 h + (4h + 4h + 16h) = 34 h: Korthikanti's 34 s b h. Without
    hidden dropout the two 1-byte masks go: 8 h replicated.

    ``fp8_inputs`` (Transformer Engine FP8): the inputs of the four linear
    layers are kept as their 1-byte FP8 casts, so the QKV and first-MLP
    inputs take h each (replicated part), the projection input h and the
    second-MLP input f (split part).

    ``kind`` ``moe``: the MLP part is the MoE layer's (``moe_split_width``,
    per-plan with ``etp``); MLA attention keeps its own widths
    (``_attention_split_width``, ``_latent_widths``).
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    masks = 2.0 if model.hidden_dropout > 0 else 0.0
    replicated = (8.0 + masks) * h + _latent_widths(model)
    split = _attention_split_width(model)
    if kind == "moe":
        split = split + moe_split_width(model, fp8_inputs, etp)
    else:
        split = split + _mlp_width(model, f)
    if fp8_inputs:
        replicated -= 2.0 * h
        split = split - model.num_heads * model.value_head_dim
        if kind != "moe":
            split = split - f
    return replicated, split


def _mlp_width(model: ModelSpec, ffn: int) -> float:
    """Bytes per token an MLP of width ffn keeps beyond its input: the
    activation's input and output (GeLU 4 ffn; a gated MLP's fused gate and up
    are 2 ffn wide: 6 ffn)."""
    return (6.0 if model.mlp_kind in GATED_MLP_KINDS else 4.0) * ffn


def _attention_split_width(model: ModelSpec) -> float:
    """Bytes per token of the attention tensors split over TP: Q, K and V for
    the core and the core's output (input of the projection), 2 bytes each:
    4h + 4kv for GQA with q = h (Korthikanti's 4 + 4 of the 24). MLA keeps
    Q and K at heads x (nope + rope) and V and the output at heads x v."""
    if model.attention_kind == "mla":
        a = model.num_heads
        return 2.0 * (2 * a * model.head_dim + 2 * a * model.value_head_dim)
    return 2.0 * (2 * model.q_width + 2 * model.kv_hidden_size)


def _latent_widths(model: ModelSpec) -> float:
    """MLA's low-rank latents, whole on every TP rank: the query and KV latents
    (and rope key) are kept as their norm's input and as the up-projections'
    input, 2 bytes each. None for GQA."""
    if model.attention_kind != "mla":
        return 0.0
    return 4.0 * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)


def moe_split_width(model: ModelSpec, fp8_inputs: bool, etp=1):
    """Bytes per token (of the whole sequence, before the 1/tp of sequence
    parallelism) that one MoE layer keeps beyond its attention and norms,
    megatron-core ``MoELayer`` with grouped GEMMs:

    * the router's fp32 logits and probabilities: 8 E;
    * per routed copy (top-k of them), on each of the etp ranks that share an
      expert's tokens: the permuted input of the first expert GEMM (2h) and the
      expert output kept for the weighted unpermute (2h), plus the expert MLP's
      activation tensors, split over etp (``_mlp_width`` of the expert FFN);
    * the shared experts' MLP tensors, split over tp like a dense MLP.

    Expert parallelism moves tokens without changing how many a rank holds
    (balanced routing: each rank receives as many copies as it sends), so ep
    does not appear. FP8: the expert GEMM inputs are kept as 1-byte casts."""
    k = model.moe_topk
    etp = np.asarray(etp, dtype=float)
    per_copy = 4.0 * model.hidden_size * etp + _mlp_width(model, model.moe_ffn_hidden_size)
    shared = _mlp_width(model, model.moe_shared_expert_ffn_hidden_size)
    if fp8_inputs:
        per_copy = per_copy - model.hidden_size * etp - model.moe_ffn_hidden_size
        if model.moe_shared_expert_ffn_hidden_size:
            shared -= model.moe_shared_expert_ffn_hidden_size
    return 8.0 * model.num_experts + k * per_copy + shared


def attention_scores_bytes(model: ModelSpec, seq_local, mbs, tp):
    """Korthikanti's ``5 a s^2 b / t``: softmax output (2), its dropout mask
    (1) and dropout output (2) per score; without attention dropout only the
    softmax output (2 a s^2 b / t). Not called with flash attention, which
    never materialises the s x s scores (Megatron with Transformer Engine)."""
    per_score = 5.0 if model.attention_dropout > 0 else 2.0
    return per_score * model.num_heads * np.square(seq_local * 1.0) * mbs / tp


def module_saved_widths(model: ModelSpec, fp8_inputs: bool, kind: str, etp, modules):
    """Bytes per token (replicated, tp-split) that selective recompute of the
    modules in ``modules`` (bitmask of ``autoconfig.core.plan.RECOMPUTE_MODULES``,
    per plan) does not keep, of the widths of ``layer_stored_widths``:

    * layernorm: the two norms' outputs, the QKV and MLP inputs (2h each, or
      their 1-byte FP8 casts);
    * mla_up_proj: MLA's per-head Q, K and V (kept only as the latents);
    * moe_act: the experts' activation output, the second expert GEMM's input
      (F per routed copy, 2 bytes or 1 in FP8);
    * mlp: a dense layer's whole MLP beyond its input; nothing on an MoE layer
      (megatron-core's TransformerLayer sets ``recompute_mlp`` only when the
      layer is not an MoE layer; its docs: "recompute the dense MLP submodule");
    * moe: an MoE layer's whole MoE block (MoELayer checkpoints its forward);
    * core_attn: nothing with fused attention (the scores are never stored).
    """
    from autoconfig.core.plan import RECOMPUTE_MODULES
    modules = np.asarray(modules)

    def has(name):
        return (modules & (1 << RECOMPUTE_MODULES.index(name))) != 0

    h = model.hidden_size
    input_bytes = 1.0 if fp8_inputs else 2.0
    replicated = np.where(has("layernorm"), 2.0 * input_bytes * h, 0.0)
    split = np.zeros(np.shape(modules))
    if model.attention_kind == "mla":
        a = model.num_heads
        split = split + np.where(has("mla_up_proj"),
                                 2.0 * (2 * a * model.head_dim + a * model.value_head_dim), 0.0)
    if kind == "moe":
        block = moe_split_width(model, fp8_inputs, etp)
        act = model.moe_topk * model.moe_ffn_hidden_size * input_bytes
        split = split + np.where(has("moe"), block,
                                 np.where(has("moe_act"), act, 0.0))
    else:
        split = split + np.where(has("mlp"), _mlp_width(model, model.ffn_hidden_size)
                                 - (model.ffn_hidden_size if fp8_inputs else 0.0), 0.0)
    return replicated, split


def layer_activation_bytes(model: ModelSpec, seq_len, mbs, tp, sp, recompute,
                           flash_attention: bool = True, cp=1, fp8_inputs: bool = False,
                           kind: str = "dense", etp=1, modules=None):
    """Bytes one layer keeps for backward, per micro-batch, per GPU.

    Korthikanti et al. 2022 Table 2 (``recompute``: 0 none, 1 selective,
    2 full, the codes of ``autoconfig.core.plan.RECOMPUTE_KINDS``):

    * TP:              sbh (10 + 24/t + 5as/(ht))
    * TP + SP:         sbh/t (34 + 5as/h)
    * TP + selective:  sbh (10 + 24/t)       (scores recomputed)
    * TP+SP+selective: 34 sbh / t
    * full:            2 sbh (layer input only; / t with SP)

    With ``flash_attention`` the 5as/h term is absent (no s x s scores are
    stored), so selective saves nothing more than flash already does.
    Context parallel splits the sequence: s becomes s / cp.
    """
    s = seq_len / np.asarray(cp, dtype=np.float64)
    tokens = s * mbs
    tp = np.asarray(tp, dtype=np.float64)
    sp = np.asarray(sp, dtype=bool)
    layer = {"kind": kind, "etp": etp, "modules": modules}
    if np.ndim(recompute) == 0:  # one kind for every plan: compute only that branch
        return _layer_bytes_of_kind(model, tokens, s, mbs, tp, sp, int(recompute),
                                    flash_attention, fp8_inputs, **layer)
    recompute = np.asarray(recompute)
    kinds = [_layer_bytes_of_kind(model, tokens, s, mbs, tp, sp, k, flash_attention, fp8_inputs,
                                  **layer)
             for k in (0, 1, 2)]
    return np.where(recompute == 0, kinds[0], np.where(recompute == 1, kinds[1], kinds[2]))


def _layer_bytes_of_kind(model: ModelSpec, tokens, s, mbs, tp, sp, recompute: int,
                         flash_attention: bool, fp8_inputs: bool = False, kind: str = "dense",
                         etp=1, modules=None):
    if recompute == 2:
        return 2.0 * tokens * model.hidden_size / np.where(sp, tp, 1.0)
    replicated, split = layer_stored_widths(model, fp8_inputs, kind, etp)
    if recompute == 1 and modules is not None:
        saved = module_saved_widths(model, fp8_inputs, kind, etp, modules)
        replicated, split = replicated - saved[0], split - saved[1]
    whole = tokens * (np.where(sp, replicated / tp, replicated) + split / tp)
    if recompute == 1 or flash_attention:
        return whole
    return whole + attention_scores_bytes(model, s, mbs, tp)


def cross_attention_bytes(model: ModelSpec, seq_len, decoder_seq_len, mbs, tp, sp,
                          recompute: int, flash_attention: bool = True):
    """Bytes one decoder layer's cross-attention keeps for backward, per
    micro-batch, per GPU (``recompute`` codes as ``layer_activation_bytes``).

    Korthikanti's accounting applied to megatron-core's ``CrossAttention``:
    per decoder token the norm's input and the query projection's input (2h
    each, whole on every TP rank unless SP) and the output dropout's mask
    (1h, with dropout); split over TP the query (2q) and the core's output
    (2q, the projection's input); per encoder token the keys and values
    (4 kv, split over TP). Unfused attention also stores the decoder x
    encoder scores (5 or 2 bytes each). The encoder output itself, the key
    and value projections' input, is one tensor all decoder layers share:
    counted once, by ``encoder_output_bytes``. Full recompute keeps nothing
    here (the layer's input, counted by ``layer_activation_bytes``, is all)."""
    if recompute == 2:
        return 0.0 * np.asarray(tp, dtype=float)
    tp = np.asarray(tp, dtype=np.float64)
    h = model.hidden_size
    masks = 1.0 if model.hidden_dropout > 0 else 0.0
    replicated = (4.0 + masks) * h
    decoder_tokens = decoder_seq_len * mbs
    split = decoder_tokens * 4.0 * model.q_width + seq_len * mbs * 4.0 * model.kv_hidden_size
    whole = decoder_tokens * np.where(sp, replicated / tp, replicated) + split / tp
    if recompute == 1 or flash_attention:
        return whole
    per_score = 5.0 if model.attention_dropout > 0 else 2.0
    return whole + per_score * model.num_heads * decoder_seq_len * seq_len * mbs / tp


def encoder_output_bytes(model: ModelSpec, seq_len, mbs, tp, sp):
    """The encoder's final output that every decoder layer's cross-attention
    reads (2 bytes x h per encoder token; split over TP with SP, whose
    decoder gathers it per layer)."""
    return 2.0 * seq_len * mbs * model.hidden_size / np.where(sp, np.asarray(tp, float), 1.0)


def microbatches_per_step(global_batch_size: int, mbs, dp):
    """m = GBS / (MBS * DP): micro-batches each pipeline runs per step."""
    return np.maximum(global_batch_size // (np.asarray(mbs) * np.asarray(dp)), 1)


def chunks_in_flight(pp, vp, m, stage):
    """Model chunks whose activations a pipeline rank holds at its peak.

    Megatron-LM ``pipeline_parallel/schedules.py``: non-interleaved 1F1B
    runs ``pp - rank - 1`` warm-up forwards, so rank r holds
    ``min(pp - r, m)`` micro-batches (first stage: min(pp, m)); the
    interleaved schedule runs ``(pp - rank - 1) * 2 + (vp - 1) * pp``
    warm-up chunk forwards out of ``m * vp``, holding one more at the start
    of steady state. For m >> pp the first stage then holds
    vp*pp + pp - 1 chunks of L/(pp vp) layers, i.e. L (1 + (pp-1)/(pp vp))
    layers: Korthikanti et al. 2022 Sec. 4.2.3. ``stage`` is 0 (first) or
    ``pp - 1`` (last); with pp = 1 one micro-batch is in flight.
    """
    pp = np.asarray(pp)
    vp = np.asarray(vp)
    m = np.asarray(m)
    one_f_one_b = np.minimum(pp - stage, m)
    interleaved = np.minimum((pp - stage - 1) * 2 + (vp - 1) * pp + 1, m * vp)
    in_flight = np.where(vp > 1, interleaved, one_f_one_b)
    return np.where(pp > 1, in_flight, 1)


def recompute_chunk_bytes(layers_per_chunk, full_layer, stored_input, recompute_full,
                          method_block, num_layers):
    """Bytes one model chunk keeps per in-flight micro-batch under recompute.

    Megatron-LM ``--recompute-method``: ``block`` recomputes the first N
    layers of each chunk (they keep only their input, the rest keep full
    activations); ``uniform`` checkpoints groups of N layers, keeping one
    input per group. ``num_layers`` 0 means Megatron's full-recompute
    default: every layer (block: N = all layers; uniform: N = 1, one
    checkpoint per layer as in Korthikanti's 2 sbh per layer).
    """
    n_block = np.where(num_layers > 0, np.minimum(num_layers, layers_per_chunk),
                       layers_per_chunk)
    n_group = np.where(num_layers > 0, np.minimum(num_layers, layers_per_chunk), 1)
    block = n_block * stored_input + (layers_per_chunk - n_block) * full_layer
    uniform = np.ceil(layers_per_chunk / n_group) * stored_input
    recomputed = np.where(method_block, block, uniform)
    return np.where(recompute_full, recomputed, layers_per_chunk * full_layer)


def recompute_transient_bytes(layers_per_chunk, full_layer, recompute_full, method_block,
                              num_layers):
    """Activations live while one checkpointed group is re-run in backward.

    Korthikanti et al. 2022 Sec. 5: with full recompute the layer being
    back-propagated regenerates its activations, so one group's worth (one
    layer for block or N = 1, N layers for uniform groups) is live on top of
    the stored inputs.
    """
    group = np.where(method_block | (num_layers == 0), 1,
                     np.minimum(num_layers, layers_per_chunk))
    return np.where(recompute_full, group * full_layer, 0.0)
