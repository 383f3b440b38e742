"""Cost of the collectives a Megatron step issues, in seconds (numpy-vectorised).

Bandwidth model (alpha-beta, Hockney 1994; ring algorithms as NCCL implements
them, Thakur et al. 2005 "Optimization of collective communication operations
in MPICH"): a ring all-reduce of ``B`` bytes over ``n`` ranks moves
``2 (n-1)/n * B`` bytes through every rank's link, a reduce-scatter or an
all-gather half of that. A group that spans several NVLink domains is reduced
hierarchically (NCCL's tree/ring over nodes): the ``k`` members inside one
domain first reduce-scatter over NVLink, then each exchanges its ``B/k`` shard
over its own InfiniBand NIC with the matching ranks of the other ``n/k``
domains, then all-gather over NVLink again.
"""

import numpy as np


def ring_allreduce_s(nbytes, n, bandwidth_bytes_per_s, latency_s=0.0):
    """Flat ring all-reduce: 2 (n-1)/n * bytes / bw + 2 (n-1) hop latencies."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, 2.0 * (n - 1.0) / n * nbytes / bandwidth_bytes_per_s
                    + 2.0 * (n - 1.0) * latency_s, 0.0)


def hierarchical_allreduce_s(nbytes, n, members_per_domain, nvlink_bytes_per_s,
                             ib_bytes_per_s, latency_s=0.0, nvlink_latency_s=None,
                             base_latency_s=0.0):
    """All-reduce of a group of ``n`` ranks with ``members_per_domain`` of them
    in each NVLink domain: NVLink ring for the in-domain part, then a ring of
    the ``n / k`` domains over InfiniBand carrying a ``1/k`` shard per rank.
    For ``k == n`` this is the flat NVLink ring; for ``k == 1`` the flat IB ring.
    A step of the NVLink ring costs ``nvlink_latency_s`` (default
    ``latency_s``), one of the network ring ``latency_s``, and the collective
    ``base_latency_s`` once (NCCL's latency model: a base per collective plus
    one per ring step, by link).
    """
    n = np.asarray(n, dtype=float)
    k = np.clip(np.asarray(members_per_domain, dtype=float), 1.0, n)
    domains = n / k
    step = latency_s if nvlink_latency_s is None else nvlink_latency_s
    intra = ring_allreduce_s(nbytes, k, nvlink_bytes_per_s, step)
    inter = ring_allreduce_s(nbytes / k, domains, ib_bytes_per_s, latency_s)
    return intra + inter + np.where(n > 1, base_latency_s, 0.0)


def ring_gather_s(nbytes, n, members_per_domain, nvlink_bytes_per_s, ib_bytes_per_s,
                  latency_s=0.0, nvlink_latency_s=None, base_latency_s=0.0):
    """All-gather (or reduce-scatter) of a ``nbytes`` buffer over ``n`` ranks,
    ``members_per_domain`` of them in each NVLink domain.

    Bandwidth as half the hierarchical all-reduce (each rank receives or sends
    (n-1)/n of the buffer; the network carries a 1/k shard per rank). Latency as
    NCCL's tuning model prices the only algorithm it has for these collectives
    across nodes of several GPUs, one ring through all ``n`` ranks
    (``src/graph/tuning.cc``: n - 1 steps, of which nNodes - 1 cross the network,
    ``(nsteps - nInterSteps) * intraLat + nInterSteps * interLat`` beside the
    collective's base): ``base + (n - d) * nvlink step + (d - 1) * network step``
    for ``d = n / k`` domains, where the hierarchical scheme counts k - 1 NVLink
    steps. At 512 ranks on 64 nodes that is 448 NVLink steps, not 7."""
    n = np.asarray(n, dtype=float)
    k = np.clip(np.asarray(members_per_domain, dtype=float), 1.0, n)
    domains = n / k
    step = latency_s if nvlink_latency_s is None else nvlink_latency_s
    moved = 0.5 * hierarchical_allreduce_s(nbytes, n, k, nvlink_bytes_per_s,
                                           ib_bytes_per_s)
    latency = base_latency_s + (n - domains) * step + (domains - 1.0) * latency_s
    return np.where(n > 1, moved + latency, 0.0)


def members_in_domain(group_size, stride, domain_gpus):
    """Members of a process group that share one NVLink domain.

    Megatron orders ranks tp (innermost), cp, dp, pp (outermost), so a group
    whose consecutive members are ``stride`` ranks apart has
    ``domain / stride`` members per domain (at least 1, at most the group).
    """
    per_domain = np.maximum(1, np.asarray(domain_gpus) // np.maximum(1, stride))
    return np.minimum(group_size, per_domain)


def p2p_s(nbytes, bandwidth_bytes_per_s, latency_s=0.0):
    """One point-to-point send: bytes / bw + one latency."""
    return nbytes / bandwidth_bytes_per_s + latency_s
