"""Banded (sliding-window) attention: its layers, their keys, and their price."""

import dataclasses

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import banded_keys_per_query, model_flops_per_token
from autoconfig.core.plan import Plan, Workload
from autoconfig.training.estimate import estimate_plan
from autoconfig.training.stack import load_stack
from cli_runner import cli

GPT_OSS = get_model("gpt-oss-120b")
PLAN = Plan(tp=1, pp=1, dp=64, mbs=4, ep=8, distributed_optimizer=True)


def test_a_band_caps_the_keys_a_query_sees():
    # position i sees min(i + 1, w): by hand for w = 3 over 5 tokens (1, 2, 3, 3, 3)
    assert banded_keys_per_query(3, 5) == pytest.approx(12 / 5)
    # shorter than the window: plain causal, (s + 1) / 2
    assert banded_keys_per_query(128, 64) == pytest.approx(32.5)
    # a long sequence: about the window
    assert banded_keys_per_query(128, 131072) == pytest.approx(128, rel=1e-3)


def test_every_other_layer_is_banded_as_megatron_skips_them():
    assert GPT_OSS.banded_layers == 18 and GPT_OSS.num_layers == 36
    assert dataclasses.replace(GPT_OSS, sliding_window=0).banded_layers == 0
    assert dataclasses.replace(GPT_OSS, num_layers=5).banded_layers == 3   # layers 1, 3, 5


def _estimate(model, seq_len=4096):
    cluster = Cluster(get_gpu("b200"), 8, 8)
    return estimate_plan(model, Workload(1280, seq_len, "bf16"), cluster, PLAN,
                         load_stack("nemo").features, stack="nemo")


@pytest.mark.parametrize("seq_len", [4096, 32768])
def test_the_band_shortens_the_step_by_its_attention_and_more_at_long_sequences(seq_len):
    full = _estimate(dataclasses.replace(GPT_OSS, sliding_window=0), seq_len)
    banded = _estimate(GPT_OSS, seq_len)
    assert banded["step_time_s"] < full["step_time_s"]
    # the same model FLOPs (counted over the whole score matrix, as Megatron does)
    assert banded["tflops_per_gpu"] * banded["step_time_s"] == pytest.approx(
        full["tflops_per_gpu"] * full["step_time_s"], rel=1e-9)
    saved = 1 - banded["step_time_s"] / full["step_time_s"]
    assert saved > {4096: 0.01, 32768: 0.1}[seq_len]


def test_the_longer_the_sequence_the_more_the_band_saves():
    saved = []
    for s in (4096, 32768):
        full = _estimate(dataclasses.replace(GPT_OSS, sliding_window=0), s)["step_time_s"]
        saved.append(1 - _estimate(GPT_OSS, s)["step_time_s"] / full)
    assert saved[1] > saved[0]


def test_model_flops_still_count_the_whole_score_matrix():
    assert model_flops_per_token(GPT_OSS, 4096) == model_flops_per_token(
        dataclasses.replace(GPT_OSS, sliding_window=0), 4096)


def test_estimate_names_what_is_still_not_priced():
    assert _estimate(GPT_OSS)["not_modelled"] == ["attention sinks"]
    assert _estimate(dataclasses.replace(GPT_OSS, attention_sinks=False))["not_modelled"] == []
    proc = cli("estimate", "--model", "gpt-oss-120b", "--gpu", "b200", "--nodes", "8",
               "--ep", "8", "--mbs", "4", "--gbs", "1280")
    assert proc.returncode == 0, proc.stderr
    assert "not modelled: attention sinks (priced as a plain softmax)" in proc.stdout
    assert "banded" not in proc.stdout


def _serve(model, input_len, output_len=256, batch=16, engine="vllm"):
    from autoconfig.inference.engine import get_engine
    from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
    from autoconfig.inference.search import predict
    plans = InferencePlanTable.from_plans([InferencePlan(8, 1, batch)])
    return predict(model, InferenceWorkload(input_len, output_len), plans,
                   Cluster(get_gpu("h200"), 1, 8), engine=get_engine(engine)).iloc[0]


def test_serving_reads_and_scores_only_the_band_in_banded_layers():
    full = dataclasses.replace(GPT_OSS, sliding_window=0)
    # requests shorter than the window (mean decode context 32 + 32): nothing to save
    assert _serve(GPT_OSS, 32, 64).tpot_ms == pytest.approx(_serve(full, 32, 64).tpot_ms,
                                                           rel=1e-9)
    long_banded, long_full = _serve(GPT_OSS, 32768), _serve(full, 32768)
    # at 32K tokens half the layers read 128 cached tokens instead of ~32K: the decode
    # step's KV read (1.8 ms of 10.5 at batch 16 on 8 H200) nearly halves
    assert 0.05 < 1 - long_banded.tpot_ms / long_full.tpot_ms < 0.2
    assert long_banded.ttft_ms < long_full.ttft_ms
    # the cache is still held whole (no sliding-window pool is modelled)
    assert long_banded.kv_cache_gib == pytest.approx(long_full.kv_cache_gib, rel=1e-9)


def test_a_model_without_a_band_serves_as_before():
    from autoconfig.inference.latency import attended_keys
    llama = get_model("llama3-8b")
    assert attended_keys(llama, 1000.0, 500.0) == (1000.0, 500.0)
    decode, prompt = attended_keys(GPT_OSS, 1000.0, 500.0)
    assert decode == pytest.approx(0.5 * 1000 + 0.5 * 128)
    assert prompt == pytest.approx(0.5 * 500 + 0.5 * banded_keys_per_query(128, 1000))
