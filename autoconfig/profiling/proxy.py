"""A scaled-down model that keeps a plan's shape constraints, for real runs on a CPU.

The rule (every number small enough for a 2-core CPU, and chosen so that plans
which differ only in TP, PP, SP, recompute or the optimizer get the same proxy
whenever the constraints allow it, so their losses stay comparable):

- layers: ``min(model layers, 4)`` rounded up to a multiple of ``pp * vp``;
- kv heads: ``min(model kv heads, 2)`` rounded up to a multiple of ``tp`` when the
  model uses grouped-query attention; heads: ``min(model heads, 4)`` rounded up
  to a multiple of ``tp`` and of the kv heads (plain multi-head keeps kv = heads);
- head dim 16, so hidden = 16 * heads (64 for up to 4 heads);
- FFN: the model's FFN/hidden ratio times the proxy hidden, rounded up to ``tp``;
- vocabulary: ``min(model vocab, 1024)`` rounded up to a multiple of ``tp``;
- sequence: ``min(workload seq, 128)`` rounded up to a multiple of ``2 * cp``
  (context parallel splits the sequence into 2 * cp chunks);
- global batch: ``mbs * dp * m`` where the micro-batch count ``m`` is the
  real one capped at 4, rounded up to a multiple of ``pp`` with virtual stages
  (the interleaved schedule needs it), and at least ``pp`` so the pipeline fills.

Mixture-of-experts models stay MoE, scaled the same way:

- routed experts: ``min(model experts, 8)`` rounded up to a multiple of ``ep``;
  top-k: the model's, at most the proxy's experts;
- expert FFN: the model's expert-FFN/hidden ratio times the proxy hidden,
  rounded up to ``etp``; shared experts likewise, rounded up to ``tp``;
- leading dense layers: 1 if the model has any (and the proxy has more than
  one layer), then every n-th layer MoE with the model's n (at most the
  layers left), so the proxy has dense and MoE layers where the model does.

Multi-latent attention keeps its kind with small ranks (latent 32, query
rank 32 if the model has one, head dims 16 + 8 rope, values 16); the worker
runs it where it can (not on CPU, see worker.py). The head width is the
proxy's (``kv_channels`` dropped); Q/K norms and MTP modules are kept.

Encoder-decoder models (T5) stay encoder-decoder:

- encoder and decoder layers: each ``min(model's, 2)``, so the proxy has both
  stacks within the 4 layers (megatron-core runs T5 with pp 1 only: no rounding
  to pipeline stages; the worker refuses pp > 1 for T5);
- sequence: the encoder's as above; the decoder's keeps its ratio to the
  encoder's (``decoder_seq_len * proxy seq / workload seq``, at least 1), rounded
  up to ``tp`` with sequence parallelism (the decoder's sequence is split over
  TP too) and at most the encoder's.

MLP kind, norm, position embedding, biases and tying are kept. The plan itself
(tp, pp, vp, cp, dp, sp, mbs, recompute, distributed optimizer, ep, etp) is
unchanged. CPU figures measure the plan's structure, not GPU speed.
"""

from dataclasses import replace

from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan, Workload

PROXY_MAX_LAYERS = 4
PROXY_MAX_HEADS = 4
PROXY_MAX_KV_HEADS = 2
PROXY_HEAD_DIM = 16
PROXY_MAX_VOCAB = 1024
PROXY_MAX_SEQ = 128
PROXY_MAX_MICROBATCHES = 4
PROXY_MAX_EXPERTS = 8
PROXY_MLA_RANK = 32
PROXY_MLA_ROPE_DIM = 8
PROXY_MAX_STACK_LAYERS = PROXY_MAX_LAYERS // 2
"""Encoder-decoder proxies: layers of each stack."""


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def cpu_proxy(model: ModelSpec, plan: Plan, workload: Workload) -> tuple[ModelSpec, Workload]:
    """The scaled-down (model, workload) that runs ``plan`` on a CPU (rule in the module doc)."""
    layers = round_up(min(model.num_layers, PROXY_MAX_LAYERS), plan.pp * plan.vp)
    if model.num_kv_heads < model.num_heads:
        kv_heads = round_up(min(model.num_kv_heads, PROXY_MAX_KV_HEADS), plan.tp)
        heads = round_up(min(model.num_heads, PROXY_MAX_HEADS), kv_heads)
        if heads == kv_heads:   # keep it grouped-query: at least 2 queries per group
            heads = 2 * kv_heads
    else:
        heads = kv_heads = round_up(min(model.num_heads, PROXY_MAX_HEADS), plan.tp)
    hidden = heads * PROXY_HEAD_DIM
    ffn = round_up(max(1, round(model.ffn_hidden_size / model.hidden_size * hidden)), plan.tp)
    seq = round_up(min(workload.seq_len, PROXY_MAX_SEQ), 2 * plan.cp if plan.cp > 1 else 1)
    stacks = _encoder_decoder_fields(model, plan, workload, seq)
    layers = stacks.pop("num_layers", layers)
    proxy = replace(model, name=f"{model.name}-cpu-proxy", num_layers=layers, hidden_size=hidden,
                    num_heads=heads, num_kv_heads=kv_heads, ffn_hidden_size=ffn,
                    vocab_size=round_up(min(model.vocab_size, PROXY_MAX_VOCAB), plan.tp),
                    seq_len=seq, kv_channels=0, **_moe_fields(model, plan, hidden, layers),
                    **_mla_fields(model), **stacks)
    return proxy, Workload(global_batch_size=plan.mbs * plan.dp * _microbatches(plan, workload),
                           seq_len=seq, precision=workload.precision)


def _microbatches(plan: Plan, workload: Workload) -> int:
    real = max(1, workload.global_batch_size // (plan.mbs * plan.dp))
    count = max(min(real, PROXY_MAX_MICROBATCHES), plan.pp)
    return round_up(count, plan.pp) if plan.vp > 1 else count


def _scaled_width(width: int, model: ModelSpec, hidden: int, multiple: int) -> int:
    """``width`` at the proxy's hidden size, keeping its ratio to the model's hidden."""
    return round_up(max(1, round(width / model.hidden_size * hidden)), multiple)


def _moe_fields(model: ModelSpec, plan: Plan, hidden: int, layers: int) -> dict:
    if not model.is_moe:
        return {}
    experts = round_up(min(model.num_experts, PROXY_MAX_EXPERTS), plan.ep)
    first_dense = min(model.moe_first_dense_layers, 1) if layers > 1 else 0
    shared = model.moe_shared_expert_ffn_hidden_size
    return {"num_experts": experts, "moe_topk": min(model.moe_topk, experts),
            "moe_ffn_hidden_size": _scaled_width(model.moe_ffn_hidden_size, model, hidden,
                                                 plan.etp),
            "moe_shared_expert_ffn_hidden_size":
                _scaled_width(shared, model, hidden, plan.tp) if shared else 0,
            "moe_first_dense_layers": first_dense,
            "moe_layer_freq": min(model.moe_layer_freq, layers - first_dense)}


def _mla_fields(model: ModelSpec) -> dict:
    if model.attention_kind != "mla":
        return {}
    return {"q_lora_rank": PROXY_MLA_RANK if model.q_lora_rank else 0,
            "kv_lora_rank": PROXY_MLA_RANK, "qk_nope_head_dim": PROXY_HEAD_DIM,
            "qk_rope_head_dim": PROXY_MLA_ROPE_DIM, "v_head_dim": PROXY_HEAD_DIM}


def _encoder_decoder_fields(model: ModelSpec, plan: Plan, workload: Workload, seq: int) -> dict:
    """Layers (both stacks) and decoder length of an encoder-decoder proxy; {} otherwise."""
    if not model.is_encoder_decoder:
        return {}
    encoder = min(model.encoder_layers, PROXY_MAX_STACK_LAYERS)
    decoder = min(model.decoder_layers, PROXY_MAX_STACK_LAYERS)
    scaled = max(1, round(model.decoder_seq_len * seq / workload.seq_len))
    decoder_seq = min(round_up(scaled, plan.tp if plan.sp else 1), seq)
    return {"num_layers": encoder + decoder, "decoder_layers": decoder,
            "decoder_seq_len": decoder_seq}
