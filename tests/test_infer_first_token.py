"""Which step samples a request's first token (``Engine.prefill_samples_first_token``):
the step that finishes its prompt, or, for TurboMind before its unified pass
(``lmdeploy-0.1``), the decode step after every prompt admitted with it."""

import dataclasses
import shutil

import numpy as np
import pytest

from autoconfig import heuristics
from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import CatalogError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import inter_token_gaps, schedule, timing
from autoconfig.inference.latency import latency
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.paths import data_root

PREFILL_S, DECODE_S = 1.0, 0.01


def _static_batch(first_in_prefill: bool):
    """Four 1,000-token prompts sent together to an engine that prefills whole prompts
    alone, at most 2,000 tokens a pass: two prefill passes, then decodes of 5 tokens."""
    inputs, outputs = np.full(4, 1000), np.full(4, 5)
    plan = schedule(inputs, outputs, 4, 64, 1e9, 2000, False, mixed=False,
                    first_in_prefill=first_in_prefill)
    step_s = np.where(plan.prefill_tokens > 0, PREFILL_S, DECODE_S)
    return plan, step_s, outputs, timing(plan, step_s, outputs)


def test_a_prefill_that_stops_short_gives_every_first_token_after_the_last_pass() -> None:
    plan, _, _, t = _static_batch(first_in_prefill=False)
    assert list(plan.prefill_tokens[:2]) == [2000, 2000]
    # all four first tokens come from the one decode step after both passes
    assert set(plan.first_token) == {2} and plan.steps[2] == 1 and plan.decode_seqs[2] == 4
    assert t.ttft_s == pytest.approx(2 * PREFILL_S + DECODE_S)
    # then four more decode steps each: the whole request is one decode step longer
    assert t.latency_s == pytest.approx(2 * PREFILL_S + 5 * DECODE_S)


def test_a_prefill_that_samples_gives_each_prompt_its_token_at_its_own_pass() -> None:
    plan, _, _, t = _static_batch(first_in_prefill=True)
    assert list(plan.first_token) == [0, 0, 1, 1]
    assert t.ttft_s == pytest.approx(1.5 * PREFILL_S)
    assert t.latency_s == pytest.approx(2 * PREFILL_S + 4 * DECODE_S)


def test_a_first_token_sampled_by_a_decode_step_is_no_gap() -> None:
    """Closed-loop clients with spread outputs (prompts arrive while others decode,
    and wait through prefills): every token after the first is one gap, either way."""
    inputs = np.full(8, 100)
    outputs = np.array([10, 20, 30, 40, 10, 20, 30, 40])
    for first_in_prefill in (True, False):
        plan = schedule(inputs, outputs, 4, 64, 1e9, None, False, mixed=False,
                        first_in_prefill=first_in_prefill)
        step_s = np.where(plan.prefill_tokens > 0, PREFILL_S, DECODE_S)
        _, counts = inter_token_gaps(plan, step_s)
        assert counts.sum() == (outputs - 1).sum()
        assert (plan.opened is None) == first_in_prefill
        assert (plan.first_token >= 0).all() and (plan.finished >= plan.first_token).all()


def test_the_analytic_latency_adds_the_decode_step_that_samples() -> None:
    """Static batches and the steady state both: the TTFT of an engine whose prefill
    stops short is one decode step longer; TPOT does not change."""
    model, gpu = get_model("llama2-7b"), get_gpu("a100-80gb")
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, b) for b in (1, 16, 64)])
    w = InferenceWorkload(2048, 128, "bf16")
    samples = engines.get_engine("lmdeploy-0.1")
    sampling = dataclasses.replace(samples, prefill_samples_first_token=True)
    assert not samples.prefill_samples_first_token
    for mode in ("static", "continuous"):
        late = latency(model, w, plans, Cluster(gpu, 1, 1), engine=samples, mode=mode)
        early = latency(model, w, plans, Cluster(gpu, 1, 1), engine=sampling, mode=mode)
        assert np.allclose(late.tpot_s, early.tpot_s)
        extra = late.ttft_s - early.ttft_s
        assert (extra > 0).all() and (extra <= late.tpot_s + 1e-12).all()
    static = latency(model, w, plans, Cluster(gpu, 1, 1), engine=samples, mode="static")
    assert np.allclose(static.ttft_s - latency(model, w, plans, Cluster(gpu, 1, 1),
                                               engine=sampling, mode="static").ttft_s,
                       static.tpot_s)


def test_the_older_release_is_its_base_engine_with_what_changed() -> None:
    old, new = engines.get_engine("lmdeploy-0.1"), engines.get_engine("lmdeploy")
    assert (old.mixed_prefill, old.chunked_prefill, old.prefill_samples_first_token) == \
        (False, False, False)
    assert (new.mixed_prefill, new.prefill_samples_first_token) == (True, True)
    # what v0.1.0a1 shares comes from the v0.2.0 file, with its source
    for field in ("kernels_per_layer", "decode_attention_hbm_efficiency", "kv_block_tokens",
                  "kernel_launch_s", "kv_reserves_output"):
        assert getattr(old, field) == getattr(new, field)
        assert old.sources[field] == new.sources[field]
    assert "v0.1.0a1" in old.sources["prefill_samples_first_token"]
    assert old.version == "0.1.0a1" and old.max_num_seqs == 64
    for name in engines.names():
        e = engines.get_engine(name)
        assert len(e.sources["prefill_samples_first_token"]) > 80


@pytest.mark.parametrize("base", ["nonesuch", "lmdeploy-0.1"])
def test_an_engine_file_with_a_bad_base_is_a_one_line_catalog_error(tmp_path, monkeypatch,
                                                                    base) -> None:
    for folder in ("configs", "heuristics"):
        shutil.copytree(data_root() / folder, tmp_path / folder)
    path = tmp_path / "heuristics" / "engines" / "lmdeploy-0.1.yaml"
    path.write_text(path.read_text().replace("base: lmdeploy\n", f"base: {base}\n"))
    monkeypatch.setenv("AUTOCONFIG_HOME", str(tmp_path))
    heuristics.load_heuristics.cache_clear()
    engines._load.cache_clear()
    try:
        with pytest.raises(CatalogError, match="base") as caught:
            engines.get_engine("lmdeploy-0.1")
        assert "lmdeploy-0.1.yaml" in str(caught.value) and "\n" not in str(caught.value)
    finally:
        monkeypatch.delenv("AUTOCONFIG_HOME")
        engines._load.cache_clear()


def test_a_request_preempted_before_its_first_token_gets_it_after_its_recompute() -> None:
    """A KV pool of 3,000 tokens for 16 clients: the cache overflows and the newest
    requests are preempted, some between their prefill and the decode step that
    would sample their first token. Every request still gets exactly one first
    token, before its last, whichever step samples it."""
    rng = np.random.default_rng(0)
    inputs, outputs = rng.integers(50, 400, 60), rng.integers(5, 300, 60)
    ttft = {}
    for first_in_prefill in (True, False):
        plan = schedule(inputs, outputs, 16, 32, 3000.0, 512, False, reserve_output=False,
                        mixed=False, first_in_prefill=first_in_prefill)
        assert (plan.first_token >= 0).all() and (plan.finished >= plan.first_token).all()
        step_s = np.where(plan.prefill_tokens > 0, 0.05, 0.01)
        ttft[first_in_prefill] = timing(plan, step_s, outputs).ttft_s
    assert ttft[False] > ttft[True]


@pytest.mark.parametrize("mixed", [True, False])
def test_every_combination_counts_each_later_token_as_one_gap(mixed) -> None:
    """Spread prompts and outputs, closed-loop clients, whole or chunked prompts in a
    token budget, a pool that never overflows: whichever step samples the first
    token, and whether prefill mixes with the decodes (``--mixed-prefill`` on the
    older engine), every request gets one first token and its later tokens one gap each."""
    for seed in range(12):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(10, 60))
        inputs, outputs = rng.integers(20, 400, n), rng.integers(2, 200, n)
        for first_in_prefill in (True, False):
            plan = schedule(inputs, outputs, int(rng.integers(2, 24)), 64, 1e9,
                            int(rng.integers(256, 2048)), bool(seed % 2), mixed=mixed,
                            first_in_prefill=first_in_prefill)
            assert (plan.first_token >= 0).all() and (plan.finished >= plan.first_token).all()
            assert plan.stalled is None or (not mixed and (plan.stalled >= 0).all())
            _, counts = inter_token_gaps(plan, np.ones(len(plan.steps)))
            assert counts.sum() == (outputs - 1).sum()
