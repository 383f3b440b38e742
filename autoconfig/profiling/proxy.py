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

MLP kind, norm, position embedding, biases and tying are kept. The plan itself
(tp, pp, vp, cp, dp, sp, mbs, recompute, distributed optimizer) is unchanged.
CPU figures measure the plan's structure, not GPU speed.
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
    proxy = replace(model, name=f"{model.name}-cpu-proxy", num_layers=layers, hidden_size=hidden,
                    num_heads=heads, num_kv_heads=kv_heads, ffn_hidden_size=ffn,
                    vocab_size=round_up(min(model.vocab_size, PROXY_MAX_VOCAB), plan.tp),
                    seq_len=seq)
    return proxy, Workload(global_batch_size=plan.mbs * plan.dp * _microbatches(plan, workload),
                           seq_len=seq, precision=workload.precision)


def _microbatches(plan: Plan, workload: Workload) -> int:
    real = max(1, workload.global_batch_size // (plan.mbs * plan.dp))
    count = max(min(real, PROXY_MAX_MICROBATCHES), plan.pp)
    return round_up(count, plan.pp) if plan.vp > 1 else count
