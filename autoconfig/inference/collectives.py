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
  way: ``F_2 + 2 (n - 1)/n B / (f_2 W)``, its fixed cost ``F_2`` and link share
  ``f_2`` measured (heuristics/inference.yaml ``two_shot_*``): vLLM's two-stage
  kernel on 4 H100 takes 17-43 us from 0.5 to 4 MB, a 12.5 us intercept and
  210 GB/s of moved bytes, where its one-stage kernel fits the one-shot law above
  (6.7 us and 402 GB/s against 2 a = 6 us and W = 360 GB/s). The stage boundary
  (a barrier with a system-scope fence) and the 1/n-sized slices each stage
  reads cost more than the three synchronisations and full link rate counted
  before.
- ring (NCCL): ``2 (n - 1)`` steps plus ``2 (n - 1)/n B / W``
  (``autoconfig.core.comm``). Replayed inside a CUDA graph a step costs one
  synchronisation ``a``; launched eagerly each collective also pays NCCL's
  host path, which the training model's ``comm_latency_s`` (heuristics/perf.yaml,
  measured per collective as a framework sees it) spreads over the steps.
  Across NVLink domains the hierarchical form, whose inter-node ring steps pay
  ``comm_latency_s`` in either case. At
  decode sizes the ring's ``2 (n - 1)`` latencies are what makes TP 8 slower
  than TP 4 on a ring; the one-shot kernel pays two.

Tried instead (2026-11-29): NCCL inside a domain by its own latency model
(src/graph/tuning.cc: LL protocol, 6.6 us + 0.6 us a ring step, half the link's
rate; Simple above) plus 10 us for an eager launch, which matches published
small-message timings (4 H100: 15-17 us under CUDA graphs, 23-28 us eager;
8 H100/H200: 17-25 us) and makes FasterTransformer's TP 8 faster than its TP 4
for GPT-3 20B at batch 1. The published runs of the C++ engines disagree:
LMDeploy 0.1's Llama 2 70B at TP 4 on A100 came out 12-32% fast (TPOT MAPE 6.4%
-> 10.6%, throughput 7.6% -> 12.6%) and the three FasterTransformer GPT-3 175B
points 47-54% (latency MAPE 25% -> 41%), so an eager TP step keeps costing
~``comm_latency_s`` a ring step there until its missing cost is found.
Retried 2026-12-02 once FasterTransformer's decode steps fill and drain its
pipeline (``PipelineSplit.decode_overlaps_steps``), part of what the 175B points
missed: still 21-22% fast (latency MAPE 18.3% -> 21.5%), LMDeploy 0.1's TP 4
rows 12-27% (TPOT MAPE 6.4% -> 10.6%).
"""

from functools import lru_cache

import numpy as np

from autoconfig.core.comm import ring_allreduce_s
from autoconfig.errors import CatalogError
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


@lru_cache(maxsize=None)
def two_shot_costs() -> tuple[float, float]:
    """(fixed seconds, share of the link rate) of a two-shot all-reduce."""
    share = inference_constant("two_shot_link_share", "a fraction")
    if not 0.0 < share <= 1.0:
        raise CatalogError(f"heuristics/inference.yaml: two_shot_link_share {share} must be "
                           "in (0, 1]")
    return _seconds("two_shot_fixed_s"), share


def two_shot_s(nbytes, n, link_bytes_per_s):
    n = np.asarray(n, dtype=float)
    fixed, share = two_shot_costs()
    return np.where(n > 1, fixed + 2.0 * (n - 1.0) / n * nbytes / (share * link_bytes_per_s),
                    0.0)


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
        two = two_shot_s(nbytes, tp, nvlink_bytes_per_s)
        best = np.where(custom & (nbytes <= engine.two_shot_max_bytes), two, best)
    if engine.one_shot_max_bytes:
        one = one_shot_s(nbytes, tp, nvlink_bytes_per_s, sync)
        best = np.where(custom & (nbytes <= engine.one_shot_max_bytes), one, best)
    return best
