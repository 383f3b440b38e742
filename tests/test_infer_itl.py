"""Inter-token gaps pooled over a job's requests (``job.inter_token_gaps``): what a
per-token latency percentile measures, beside TPOT's per-request mean."""

import numpy as np
import pandas as pd

from autoconfig.inference.job import inter_token_gaps, schedule, timing, weighted_percentile
from autoconfig.inference.published import _median_column

PREFILL_S, DECODE_S = 1.0, 0.01


def _timed(mixed: bool):
    """8 requests of 100-token prompts and spread outputs from 4 closed-loop clients:
    a request that finishes early lets its client's next prompt in while the
    others still decode. A step with prompt tokens takes 1 s, a decode step 10 ms."""
    inputs = np.full(8, 100)
    outputs = np.array([10, 20, 30, 40, 10, 20, 30, 40])
    plan = schedule(inputs, outputs, 4, 64, 1e9, None, False, mixed=mixed)
    step_s = np.where(plan.prefill_tokens > 0, PREFILL_S, DECODE_S)
    return plan, step_s, outputs, timing(plan, step_s, outputs)


def test_weighted_percentile_repeats_each_value_by_its_weight() -> None:
    values = np.array([3.0, 1.0, 2.0])
    assert weighted_percentile(values, np.array([8.0, 1.0, 1.0]), 50) == 3.0
    assert weighted_percentile(values, np.array([1.0, 5.0, 1.0]), 50) == 1.0
    assert weighted_percentile(values, np.array([1.0, 5.0, 1.0]), 99) == 3.0
    assert np.isnan(weighted_percentile(values, np.zeros(3), 50))


def test_every_token_after_the_first_is_one_gap() -> None:
    for mixed in (True, False):
        plan, step_s, outputs, _ = _timed(mixed)
        _, counts = inter_token_gaps(plan, step_s)
        assert counts.sum() == (outputs - 1).sum()


def test_prefill_first_stalls_are_long_gaps_the_pooled_median_does_not_see() -> None:
    plan, step_s, _, t = _timed(mixed=False)
    gaps, counts = inter_token_gaps(plan, step_s)
    assert plan.stalled is not None and plan.stalled.max() > 0
    stalls = counts[gaps > PREFILL_S].sum()
    assert 0 < stalls < 0.1 * counts.sum()          # a few gaps span a prefill
    assert t.percentiles_s["itl_p50"] == DECODE_S   # the median gap is a decode step
    assert t.percentiles_s["itl_p99"] > PREFILL_S   # the tail is a stall
    assert t.tpot_s > 2 * DECODE_S                  # each request's mean carries its stalls


def test_mixed_steps_hold_no_request_back() -> None:
    plan, step_s, _, t = _timed(mixed=True)
    gaps, counts = inter_token_gaps(plan, step_s)
    assert plan.stalled is None
    assert set(gaps[counts > 0]) <= {PREFILL_S, DECODE_S}   # a mixed step is its decoders' gap
    assert t.percentiles_s["itl_p50"] == DECODE_S


def test_a_point_publishing_the_median_itl_is_scored_on_the_pooled_gaps() -> None:
    def row(statistic):
        return pd.Series({"statistic": statistic})
    assert _median_column(row("mean TTFT, median ITL"), "tpot") == "itl_p50_ms"
    assert _median_column(row("mean TTFT, median ITL"), "ttft") is None
    assert _median_column(row("mean TTFT, median TPOT"), "tpot") == "tpot_p50_ms"
    assert _median_column(row("median"), "ttft") == "ttft_p50_ms"
    assert _median_column(row("mean"), "tpot") is None
