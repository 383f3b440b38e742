"""Request lengths of a job: ``n`` prompts and outputs with a given mean and spread.

A serving benchmark draws its requests from a dataset (ShareGPT, a synthetic
set, a task's test split); what decides its timing is the mean of each length
and, for a finite job, how long the longest requests are: the run lasts until
the last one finishes. Two laws give the lengths their shape:

- ``gamma`` (the default): gamma variates with the given mean and standard
  deviation (shape ``(mean/std)^2``; std = mean is the exponential), the long
  right tail of a conversation dataset such as ShareGPT;
- ``uniform``: lengths spread evenly over ``mean -/+ sqrt(3) std`` (a uniform's
  standard deviation is its width over sqrt(12)), as the synthetic "random"
  datasets of vLLM's and SGLang's serving benchmarks draw them
  (``np.random.randint(L * range_ratio, L + 1)``): no tail beyond the top. A
  spread wider than the mean allows (bottom below 1 token) is cut at 1, which
  raises the mean a little: a measured mean a few tokens under ``L/2``, as a
  run of a few hundred prompts gives, keeps within a token of it.

Std = 0 is fixed lengths under either. The lengths are taken deterministically
at the ``n`` mid-quantiles ``(i + 1/2)/n`` (of a fixed-seed sample for the
gamma, exactly for the uniform), then put in a fixed pseudo-random order
(prompt and output lengths independently), as a benchmark shuffles its
dataset. The same request never gets a different length between calls.
"""

from functools import lru_cache

import numpy as np

from autoconfig.errors import InputError, shown

LENGTH_DISTS = ("gamma", "uniform")
"""Laws a job's lengths can follow (module doc)."""

_SAMPLE = 200_000
"""Draws the quantiles are read from: the largest of 500 requests (quantile 0.999)
is then read from 200 draws beyond it, within a few percent of the exact value."""


@lru_cache(maxsize=64)
def _standard_quantiles(shape: float, n: int) -> np.ndarray:
    """Mid-quantiles of a unit-mean gamma of this shape, ascending."""
    draws = np.random.default_rng(0).gamma(shape, 1.0 / shape, _SAMPLE)
    return np.quantile(draws, (np.arange(n) + 0.5) / n)


def request_lengths(mean_tokens: float, std_tokens: float, n: int, seed: int,
                    max_tokens: int | None = None, dist: str = "gamma") -> np.ndarray:
    """``n`` integer lengths (at least 1, at most ``max_tokens``) with this mean and
    spread under the law ``dist``, in a fixed order chosen by ``seed`` (module doc)."""
    check_length_dist(dist)
    if not mean_tokens >= 1:
        raise InputError(f"invalid mean length {mean_tokens!r}: must be at least 1 token")
    if not std_tokens >= 0:
        raise InputError(f"invalid length spread {std_tokens!r}: must be 0 or more tokens")
    if std_tokens == 0 or n == 1:
        lengths = np.full(n, float(mean_tokens))
    elif dist == "uniform":
        half_width = np.sqrt(3.0) * std_tokens
        lengths = mean_tokens + half_width * (2.0 * (np.arange(n) + 0.5) / n - 1.0)
    else:
        shape = min((mean_tokens / std_tokens) ** 2, 1e6)
        lengths = mean_tokens * _standard_quantiles(round(shape, 6), n)
        lengths *= mean_tokens / lengths.mean()
    lengths = np.random.default_rng(seed).permutation(lengths)
    top = max_tokens if max_tokens is not None else np.inf
    return np.clip(np.rint(lengths), 1, top).astype(np.int64)


def arrival_times_s(rate_per_s: float, n: int, seed: int) -> np.ndarray:
    """Send times of ``n`` requests of a Poisson process at ``rate_per_s``, the first
    at 0: exponential gaps (the mid-quantiles ``-ln(1 - q) / rate``, as lengths
    above) in a fixed order chosen by ``seed``, as vLLM's and SGLang's serving
    benchmarks draw them for ``--request-rate``."""
    check_rate(rate_per_s)
    gaps = -np.log1p(-(np.arange(n) + 0.5) / n) / rate_per_s
    gaps = np.random.default_rng(seed).permutation(gaps)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else np.zeros(0)


def check_length_dist(dist: object) -> None:
    """InputError unless ``dist`` names a length law (``LENGTH_DISTS``)."""
    if dist not in LENGTH_DISTS:
        raise InputError(f"invalid --length-dist {shown(dist)}: allowed are "
                         f"{', '.join(LENGTH_DISTS)}")


def check_length_law(dist: str | None, input_std_tokens: float, output_std_tokens: float,
                     in_job: bool) -> None:
    """InputError when a length law is given (``dist``; None: not given) where it
    shapes nothing: for lengths without spread (every request is the mean), or
    outside a finite job (the steady state reads only the means and spreads)."""
    if dist is None:
        return
    if not (input_std_tokens > 0 or output_std_tokens > 0):
        raise InputError(f"--length-dist {dist} shapes spread lengths, and none is given: "
                         "add --input-len-std or --output-len-std above 0, or a --dataset "
                         "with spreads (or drop --length-dist)")
    if not in_job:
        raise InputError(f"--length-dist {dist} shapes the lengths of a --num-requests job; "
                         "the steady state reads only their means and spreads: give "
                         "--num-requests (or drop --length-dist)")


def check_rate(rate_per_s: object) -> None:
    """InputError unless ``rate_per_s`` is a positive, finite number of requests/s."""
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float, np.number)) \
            or not 0 < rate_per_s < float("inf"):
        raise InputError(f"invalid --request-rate {shown(rate_per_s)}: must be a positive "
                         "number of requests/s")
