"""How context-parallel attention exchanges its sequence chunks (Megatron
``--cp-comm-type``, Transformer Engine's context-parallel attention), and the
group sizes and head counts each scheme needs.

- ``p2p``: ring attention (``AttnFuncWithCPAndKVP2P``). Each rank keeps its
  queries and passes its K and V chunk around the cp ranks, one attention
  kernel per step, each send overlapped with the step before.
- ``a2a``: DeepSpeed-Ulysses style (``AttnFuncWithCPAndQKVOA2A``). An
  all-to-all turns sequence-split Q, K and V into head-split ones over the
  whole sequence, attention runs once, and another all-to-all returns the
  output (the backward likewise); nothing overlaps the exchanges. Needs the
  heads a TP rank holds, query and key-value, divisible by cp.
- ``a2a+p2p``: hierarchical (``--hierarchical-context-parallel-sizes a p``,
  a x p = cp): the all-to-all inside groups of ``a`` ranks, the ring over the
  ``p`` groups. Here ``a`` is the largest divisor of cp whose group fits the
  NVLink domain beside TP and divides the heads, so the all-to-all stays on
  NVLink and only the ring's sends cross nodes.
"""

import numpy as np

CP_COMM_TYPES = ("p2p", "a2a", "a2a+p2p")
"""Megatron ``--cp-comm-type`` values modelled (``allgather`` is not)."""


def _heads_per_rank(model, tp):
    """(query heads, key-value heads) one TP rank holds; key-value heads
    replicate when there are fewer than TP ranks."""
    tp = np.asarray(tp, dtype=np.int64)
    return model.num_heads // tp, np.maximum(model.num_kv_heads // tp, 1)


def heads_divide(model, tp, size):
    """Whether an all-to-all over ``size`` ranks can split the heads a TP rank
    holds (Transformer Engine ``AttnFuncWithCPAndQKVOA2A`` asserts both the
    query and key-value heads divide by its group)."""
    q, kv = _heads_per_rank(model, tp)
    size = np.maximum(np.asarray(size, dtype=np.int64), 1)
    return (q % size == 0) & (kv % size == 0)


def a2a_group_size(comm_type: str, model, tp, cp, domain_gpus: int):
    """Ranks of each all-to-all group: cp for ``a2a``, 1 for ``p2p``, and for
    ``a2a+p2p`` the largest divisor ``a`` of cp with tp x a within the NVLink
    domain and the heads divisible by ``a`` (1 where none is larger)."""
    tp = np.asarray(tp, dtype=np.int64)
    cp = np.asarray(cp, dtype=np.int64)
    if comm_type == "p2p":
        return np.ones_like(cp * tp)
    if comm_type == "a2a":
        return cp * np.ones_like(tp)
    best = np.ones(np.broadcast(tp, cp).shape, dtype=np.int64)
    for a in range(2, int(np.max(cp, initial=1)) + 1):
        ok = (cp % a == 0) & (tp * a <= domain_gpus) & heads_divide(model, tp, a)
        best = np.where(ok, a, best)
    return best
