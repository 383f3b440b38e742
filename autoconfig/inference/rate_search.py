"""The largest request rate a layout serves within latency limits.

An MLPerf Inference Server (or Interactive) result answers this question: the
submitter raises the Poisson arrival rate until the run's p99 TTFT or p99
TPOT would break the scenario's bound, and publishes that rate with the
latencies measured at it. The rate is the result, not a setting, and near it
the latencies are ill-conditioned in the rate: an in-flight engine's
throughput flattens as its batch grows, so a few percent more load moves the
running batch, and with it the TPOT, by a factor (measured: H100 Llama 2 70B
TP2 at 88% of its offline throughput ran ~845 sequences at 155 ms a token).
Asking for the rate the limits allow is well-conditioned where asking for the
latencies at a given rate is not, and it is how a serving team sizes a fleet:
requests/s per replica at its p99 SLA.

The search runs the user's finite job (``autoconfig.inference.job``) at
candidate rates; the limits are checked on its means or percentiles. Over a
finite job the tail latencies grow with the rate (more arrivals per step,
longer queues), so the feasible rates form an interval from zero, and a
geometric bisection finds its top to ``RATE_TOLERANCE``.

Each rate found is also given as a share of the rate the same layout completes
offline (the job sent at once): its load. Near full load a step's tokens grow
with its own length (Little's law: the running batch is the rate times the
latency), so the step time behaves as t0 / (1 - load) and a relative error in
the rate or in the step cost reaches the TPOT multiplied by 1 / (1 - load):
10x at 90%. Measured on the model itself: MLPerf v4.1's H100 Llama 2 70B Server
run (TP 2, 4,096-token budget) asked at its published 75.1 requests/s gives a
TPOT of 40 ms over the job; at the rate the search finds (89.5/s arriving, a
throughput 6% above the published one), 118 ms over its steady part. A
layout at ``STEEP_LOAD`` or more is flagged in the report so that its TTFT and
TPOT are read as a cliff's edge, not as figures to plan on. A load above 1 says
the job may be too short for its queue to break the limits although it grows
(the job sent at once also drains at its end, so its rate is a little below
what a long run sustains): the same run, 24,576 requests, is searched to 89.5/s
where the job sent at once completes 80.4/s (111%), and a run of the published
40 minutes already breaks the 2 s p99 TTFT at 85/s (7.4 s); the report says to
check with the longer job.
"""

import math
from collections.abc import Callable

RATE_TOLERANCE = 1.03
"""Stop when the bracket's ends are within 3% of each other: finer than the
step model's own error on throughput (~10% per engine, ``infer-validate``), and
each halving costs one simulated job."""
STEEP_LOAD = 0.9
"""Load from which the report flags a searched rate's latencies: there 1 /
(1 - load) >= 10, so the model's ~10% throughput error (``infer-validate``)
spans the whole range from comfortable to saturated."""
MAX_EXPANSIONS = 6
"""Brackets widened at most this many times, by a factor 2 each."""


def largest_rate(meets: Callable[[float], bool], start_per_s: float) -> float | None:
    """The largest rate (requests/s) at which ``meets(rate)`` holds, to within
    ``RATE_TOLERANCE``, searched from ``start_per_s`` (a layout's offline
    throughput in requests/s: rates above it queue without bound); ``math.inf``
    when every rate tried up to 2**MAX_EXPANSIONS times the start meets it (the
    limits hold even when the whole job is sent at once); None when none down to
    2**-MAX_EXPANSIONS of the start does (a limit below what one request gets)."""
    if not start_per_s > 0 or not math.isfinite(start_per_s):
        raise ValueError(f"start rate must be positive and finite, got {start_per_s!r}")
    low, high = _bracket(meets, start_per_s)
    if high is None:
        return low
    while high / low > RATE_TOLERANCE:
        middle = math.sqrt(low * high)
        if meets(middle):
            low = middle
        else:
            high = middle
    return low


def _bracket(meets, start: float) -> tuple[float | None, float | None]:
    """(a rate that meets, a higher one that does not); (inf, None) when no
    rate tried fails; (None, None) when none tried meets."""
    if meets(start):
        low = start
        for _ in range(MAX_EXPANSIONS):
            if not meets(low * 2):
                return low, low * 2
            low *= 2
        return math.inf, None
    high = start
    for _ in range(MAX_EXPANSIONS):
        low = high / 2
        if meets(low):
            return low, high
        high = low
    return None, None
