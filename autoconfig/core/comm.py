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
