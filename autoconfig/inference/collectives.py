"""Tensor-parallel all-reduce of a serving step, by algorithm and message size.

Serving engines run their own all-reduce kernels inside one NVLink domain for
the small messages of decode (vLLM ``custom_all_reduce``, TensorRT-LLM
``AllReduceStrategy``); NCCL's ring serves the rest. With ``B`` bytes over
``n`` ranks, link bandwidth ``W`` and ``a`` one synchronisation over NVSwitch
(heuristics/inference.yaml ``allreduce_sync_s``):

- one-shot: every rank reads the ``n - 1`` peers' whole buffers and sums them
  locally: ``2 a + (n - 1) B / W`` (a barrier, then the reads). Cheapest when
  ``B`` is small: one round trip however many ranks.
- two-shot: reduce-scatter then all-gather, each rank moving ``(n-1)/n B`` each
  way: ``3 a + 2 (n - 1)/n B / W``.
- ring (NCCL): ``2 (n - 1)`` steps plus ``2 (n - 1)/n B / W``
  (``autoconfig.core.comm``). Replayed inside a CUDA graph a step costs one
  synchronisation ``a``; launched eagerly each collective also pays NCCL's
  host path, which the training model's ``comm_latency_s`` (heuristics/perf.yaml,
  measured per collective as a framework sees it) spreads over the steps.
  Across NVLink domains the hierarchical form, whose inter-node ring steps pay
  ``comm_latency_s`` in either case. At
  decode sizes the ring's ``2 (n - 1)`` latencies are what makes TP 8 slower
  than TP 4 on a ring; the one-shot kernel pays two.
"""

from functools import lru_cache

import numpy as np

from autoconfig.core.comm import ring_allreduce_s
from autoconfig.inference.constants import inference_constant


def _seconds(key: str) -> float:
    return inference_constant(key, "seconds")


@lru_cache(maxsize=None)
def sync_latency_s() -> float:
    return _seconds("allreduce_sync_s")


@lru_cache(maxsize=None)
def kernel_gpu_floor_s() -> float:
    """Least GPU time of any kernel (``autoconfig.inference.latency``'s kernel floor)."""
    return _seconds("kernel_gpu_floor_s")


@lru_cache(maxsize=None)
def moe_block_extra_kernels() -> int:
    """Small kernels an MoE block launches beyond a dense MLP's (the kernel floor's count)."""
    return int(inference_constant("moe_block_extra_kernels", "a count", whole=True))


def one_shot_s(nbytes, n, link_bytes_per_s, sync_s):
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, 2.0 * sync_s + (n - 1.0) * nbytes / link_bytes_per_s, 0.0)


def two_shot_s(nbytes, n, link_bytes_per_s, sync_s):
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, 3.0 * sync_s + 2.0 * (n - 1.0) / n * nbytes / link_bytes_per_s, 0.0)


def tp_allreduce_s(nbytes, tp, members_per_domain, nvlink_bytes_per_s, ib_bytes_per_s,
                   ring_latency_s, engine):
    """Seconds of one all-reduce of ``nbytes`` over ``tp`` ranks as ``engine`` runs it:
    its custom one-/two-shot kernel where the group sits in one NVLink domain,
    is no larger than ``engine.max_custom_tp`` and the message is under the
    kernel's size limit; else NCCL's (hierarchical) ring."""
    tp = np.asarray(tp, dtype=float)
    sync = sync_latency_s()
    k = np.clip(np.asarray(members_per_domain, dtype=float), 1.0, tp)
    step = sync if engine.cuda_graphs else ring_latency_s
    ring = (ring_allreduce_s(nbytes, k, nvlink_bytes_per_s, step)
            + ring_allreduce_s(nbytes / k, tp / k, ib_bytes_per_s, ring_latency_s))
    custom = (k >= tp) & (tp <= engine.max_custom_tp)
    best = ring
    if engine.two_shot_max_bytes:
        two = two_shot_s(nbytes, tp, nvlink_bytes_per_s, sync)
        best = np.where(custom & (nbytes <= engine.two_shot_max_bytes), two, best)
    if engine.one_shot_max_bytes:
        one = one_shot_s(nbytes, tp, nvlink_bytes_per_s, sync)
        best = np.where(custom & (nbytes <= engine.one_shot_max_bytes), one, best)
    return best
