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

from autoconfig.core.model import ModelSpec


def layer_stored_widths(model: ModelSpec, fp8_inputs: bool = False) -> tuple[float, float]:
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
    """
    h, kv, f = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size
    mlp = (6 if model.mlp_kind == "swiglu" else 4) * f
    masks = 2.0 if model.hidden_dropout > 0 else 0.0
    replicated = (8.0 + masks) * h
    split = 4.0 * h + 4.0 * kv + mlp
    if fp8_inputs:
        replicated -= 2.0 * h
        split -= h + f
    return replicated, split


def attention_scores_bytes(model: ModelSpec, seq_local, mbs, tp):
    """Korthikanti's ``5 a s^2 b / t``: softmax output (2), its dropout mask
    (1) and dropout output (2) per score; without attention dropout only the
    softmax output (2 a s^2 b / t). Not called with flash attention, which
    never materialises the s x s scores (Megatron with Transformer Engine)."""
    per_score = 5.0 if model.attention_dropout > 0 else 2.0
    return per_score * model.num_heads * np.square(seq_local * 1.0) * mbs / tp


def layer_activation_bytes(model: ModelSpec, seq_len, mbs, tp, sp, recompute,
                           flash_attention: bool = True, cp=1, fp8_inputs: bool = False):
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
    if np.ndim(recompute) == 0:  # one kind for every plan: compute only that branch
        return _layer_bytes_of_kind(model, tokens, s, mbs, tp, sp, int(recompute),
                                    flash_attention, fp8_inputs)
    recompute = np.asarray(recompute)
    kinds = [_layer_bytes_of_kind(model, tokens, s, mbs, tp, sp, k, flash_attention, fp8_inputs)
             for k in (0, 1, 2)]
    return np.where(recompute == 0, kinds[0], np.where(recompute == 1, kinds[1], kinds[2]))


def _layer_bytes_of_kind(model: ModelSpec, tokens, s, mbs, tp, sp, kind: int,
                         flash_attention: bool, fp8_inputs: bool = False):
    if kind == 2:
        return 2.0 * tokens * model.hidden_size / np.where(sp, tp, 1.0)
    replicated, split = layer_stored_widths(model, fp8_inputs)
    whole = tokens * (np.where(sp, replicated / tp, replicated) + split / tp)
    if kind == 1 or flash_attention:
        return whole
    return whole + attention_scores_bytes(model, s, mbs, tp)


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
