"""How a cluster's request stream reaches its replicas.

A deployment of ``k`` replicas sits behind a router. Requests arrive at rate
``lambda`` as a Poisson stream (vLLM's and SGLang's serving benchmarks, MLPerf
LoadGen's Server scenario); what one replica sees depends on how the router
picks a replica:

- ``random``: each request goes to a replica drawn at random (a Kubernetes
  Service: kube-proxy picks a backend at random in its iptables mode). Each
  replica sees the Poisson stream thinned to ``lambda / k``: exponential gaps,
  squared coefficient of variation ``c^2 = 1``.
- ``round-robin``: request ``i`` goes to replica ``i mod k`` (NVIDIA's MLPerf
  harness: ``trafficDistributionPolicy::roundRobin`` in v4.1's
  ``harness_llm/llm_server.cc``, the default of v5.1's ``llmlib`` outside the
  Server scenario, ``llmlib/config.py``). Each replica sees every ``k``-th
  arrival: gaps the sum of ``k`` exponentials (Erlang-``k``), ``c^2 = 1/k``.
  A least-loaded router (the same harnesses' default for Server runs:
  ``loadBalancing``, ``load_balancing``: the replica with the fewest requests
  in flight) evens the load at least as well, and is modelled as round-robin,
  the smoother stream's conservative bound.

Where arrivals bunch, steps that admit several prompts grow and the requests
decoding through them wait: the burst and queue terms of the steady state
(``autoconfig.inference.latency``) scale with ``c^2`` (their Poisson forms are
the ``c^2 = 1`` case), and a finite job sends each replica its share of one
cluster-wide stream (``replica_arrivals_s``). One replica is the same under
either.
"""

import numpy as np

from autoconfig.errors import InputError, shown
from autoconfig.inference.lengths import arrival_times_s

DISPATCHES = ("round-robin", "random")
"""Ways a router spreads requests over replicas (module doc)."""

DEFAULT_DISPATCH = "round-robin"
"""Serving routers balance rather than draw at random (the MLPerf harnesses
above); ``random`` is the Kubernetes Service case."""


def check_dispatch(dispatch: object) -> None:
    """InputError unless ``dispatch`` names a router policy (``DISPATCHES``)."""
    if dispatch not in DISPATCHES:
        raise InputError(f"invalid --dispatch {shown(dispatch)}: allowed are "
                         f"{', '.join(DISPATCHES)}")


def check_dispatch_used(dispatch: str | None, arriving: bool) -> None:
    """InputError when a dispatch is given (None: not given) for requests that do
    not arrive at a rate (``arriving``): there is no stream to spread."""
    if dispatch is not None and not arriving:
        raise InputError(f"--dispatch {dispatch} spreads arrivals at a rate over replicas: "
                         "give --request-rate (or drop --dispatch)")


def arrival_cv2(dispatch: str, replicas):
    """Squared coefficient of variation of one replica's gaps between arrivals."""
    check_dispatch(dispatch)
    k = np.maximum(np.asarray(replicas, dtype=float), 1.0)
    return 1.0 / k if dispatch == "round-robin" else np.ones_like(k)


def replica_arrivals_s(rate_per_s: float, requests: int, replicas: int, dispatch: str,
                       seed: int) -> np.ndarray:
    """Send times of one replica's ``requests`` where the cluster receives a
    Poisson stream at ``rate_per_s`` spread over ``replicas`` by ``dispatch``."""
    check_dispatch(dispatch)
    if dispatch == "random" or replicas <= 1:
        return arrival_times_s(rate_per_s / max(replicas, 1), requests, seed)
    return arrival_times_s(rate_per_s, requests * replicas, seed)[::replicas][:requests]
