"""Engine settings a serving team sets and ``infer`` takes: prompts chunked to the
step's token budget or run whole (``--chunked-prefill``), and how requests are
admitted against the KV cache (``--kv-policy reserve|preempt``)."""

import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import Job
from autoconfig.inference.memory import kv_tokens_per_request
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.published import ask, default_points_path, load_points
from autoconfig.inference.search import Pins, search
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)
TRT = engines.get_engine("tensorrt-llm")
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--input-len", "1024", "--output-len", "512", "--no-plots", "--format", "json",
        "--tp", "1", "--pp", "1", "--engine", "tensorrt-llm"]


def _job_row(engine, workload, requests, cap=256):
    result = search(MODEL, workload, CLUSTER, engine=engine, mode="continuous", max_batch=cap,
                    pins=Pins((1,), (1,)), job=Job(requests, None, None))
    return result.table.iloc[0]


def test_overrides_set_the_engine_and_refuse_static_engines():
    assert engines.with_chunked_prefill(TRT, None) is TRT
    assert engines.with_kv_policy(TRT, None) is TRT
    assert engines.with_chunked_prefill(TRT, True).chunked_prefill is True
    assert engines.with_kv_policy(TRT, "preempt").kv_reserves_output is False
    assert engines.with_kv_policy(engines.get_engine("vllm"), "reserve").kv_reserves_output
    with pytest.raises(InputError, match="invalid --kv-policy 'evict': allowed are reserve"):
        engines.with_kv_policy(TRT, "evict")
    ft = engines.get_engine("fastertransformer")
    for call in (lambda: engines.with_chunked_prefill(ft, True),
                 lambda: engines.with_kv_policy(ft, "preempt")):
        with pytest.raises(InputError, match="static batches"):
            call()


def test_preempting_admits_more_than_reserving_when_the_pool_binds():
    # 20,000 tokens hold 13 requests reserved whole (1,536 tokens each) but all 16
    # by their prompts (1,024): reserving, three wait for the first wave to end;
    # preempting, all start at once and the newest are evicted only near the end.
    workload = InferenceWorkload(1024, 512, "bf16")
    pooled = engines.with_kv_cache_tokens(TRT, 20_000)
    reserve = _job_row(pooled, workload, 16)
    preempt = _job_row(engines.with_kv_policy(pooled, "preempt"), workload, 16)
    assert preempt.ttft_ms < 0.5 * reserve.ttft_ms
    assert preempt.tokens_per_s_per_replica > 1.1 * reserve.tokens_per_s_per_replica


def test_a_reserving_engine_holds_the_whole_sequence_at_steady_state():
    workload = InferenceWorkload(1000, 500, "bf16")
    assert kv_tokens_per_request(workload, 32, True, reserves_output=True) == 1504.0
    assert kv_tokens_per_request(workload, 32, True) == 1280.0    # input + output / 2, in blocks


def test_chunking_splits_a_long_prompt_over_steps():
    # One 8,192-token prompt: whole, it runs in one step of an 8,192-token budget;
    # chunked under a 1,024-token one, in eight, each reading the weights again,
    # so it comes later. Whole under the narrow budget no step could hold it, and
    # the engine refuses it (TensorRT-LLM: prompt length above max_num_tokens).
    workload = InferenceWorkload(8192, 16, "bf16")
    narrow = engines.with_max_batched_tokens(TRT, 1024)
    whole = _job_row(engines.with_chunked_prefill(
        engines.with_max_batched_tokens(TRT, 8192), False), workload, 1)
    chunked = _job_row(engines.with_chunked_prefill(narrow, True), workload, 1)
    assert chunked.ttft_ms > 1.05 * whole.ttft_ms
    with pytest.raises(InputError, match="--input-len 8192 is longer than the 1024-token "
                                         "step budget of tensorrt-llm"):
        _job_row(engines.with_chunked_prefill(narrow, False), workload, 1)


def test_the_cli_takes_both_settings_and_reports_them(tmp_path, capsys):
    extra = ["--num-requests", "32", "--chunked-prefill", "--kv-policy", "preempt",
             "--max-batched-tokens", "2048"]
    code, text, err = run_cli(BASE + extra + ["--output-dir", str(tmp_path / "a")], capsys)
    assert code == 0, err
    data = json.loads(text)
    assert (data["chunked_prefill"], data["kv_policy"], data["max_batched_tokens"]) == \
        (True, "preempt", 2048)
    table = ["table" if a == "json" else a for a in BASE]
    code, text, err = run_cli(table + extra + ["--output-dir", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert "the newest evicted and recomputed" in text + err
    code, _, err = run_cli(BASE + ["--kv-policy", "sometimes", "--output-dir",
                                   str(tmp_path / "c")], capsys)
    assert code != 0 and "sometimes" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["infer", "--model", "gpt3", "--size", "1.3b", "--engine",
                            "fastertransformer", "--chunked-prefill", "--no-plots", "--gpus", "1",
                            "--input-len",
                            "128", "--output-len", "16",
                            "--output-dir", str(tmp_path / "d")], capsys)
    assert code != 0 and "static batches" in err and len(err.strip().splitlines()) == 1


def test_mlperf_tensorrt_rows_carry_their_configs_scheduler_settings():
    points = load_points(default_points_path())
    mlperf = points[points["source_location"].str.startswith("MLPerf")
                    & (points["engine"] == "tensorrt-llm")]
    # J031 (v5.0): its harness's defaults were not read, so it keeps the engine's
    unread = mlperf[mlperf["kv_policy"].isna()]
    assert list(unread["point_id"]) == ["J031"]
    read = mlperf[mlperf["kv_policy"].notna()]
    assert len(read) == 27 and set(read["kv_policy"]) == {"preempt"}   # MAX_UTILIZATION
    for row in read.itertuples():
        # chunked context: a runtime flag of the v5.1 harness, not wired in v4.1's
        assert str(row.chunked_prefill).lower() == \
            ("true" if "v5.1" in row.source_location[:25] else "false"), row.point_id
    row = next(points[points["point_id"] == "J002"].itertuples())
    with pytest.raises(InputError, match="invalid chunked_prefill 'often'"):
        ask(row._replace(chunked_prefill="often"))
    with pytest.raises(InputError, match="invalid --kv-policy 'evict'"):
        ask(row._replace(kv_policy="evict"))
    assert np.isfinite(ask(row).tokens_per_s_per_gpu)


def test_sglang_chunks_prompts_and_only_whole_prompt_engines_refuse_a_long_one():
    # SGLang cuts prompts at chunked_prefill_size (its PrefillAdder) and runs each
    # chunk as a forward of its own (not mixed with the decodes): a 16K prompt on
    # its 8,192-token budget runs; vLLM told not to chunk cannot hold it in a step.
    sglang = engines.get_engine("sglang")
    assert sglang.chunked_prefill and not sglang.mixed_prefill
    model, cluster = get_model("llama3-8b"), Cluster(get_gpu("h100-80gb"), 1, 1)
    long = InferenceWorkload(16000, 64, "bf16")
    row = search(model, long, cluster, engine=sglang, mode="continuous",
                 pins=Pins((1,), (1,), (4,))).table.iloc[0]
    assert row.ttft_ms > 0
    with pytest.raises(InputError, match="--input-len 16000 is longer than the 8192-token"):
        search(model, long, cluster, engine=engines.with_chunked_prefill(
            engines.get_engine("vllm"), False), mode="continuous", pins=Pins((1,), (1,), (4,)))


def test_sglang_estimates_outputs_and_the_policies_switch_it():
    sglang = engines.get_engine("sglang")
    assert sglang.kv_policy == "estimate" and sglang.new_token_ratio.initial == 0.7
    assert sglang.new_token_ratio.minimum == pytest.approx(0.098)
    assert engines.with_kv_policy(sglang, "preempt").new_token_ratio is None
    assert engines.with_kv_policy(sglang, "exact").kv_policy == "exact"
    assert engines.with_kv_policy(sglang, "estimate").kv_policy == "estimate"
    assert engines.with_kv_policy(TRT, "exact").kv_policy == "exact"
    with pytest.raises(InputError, match="invalid --kv-policy estimate: engine tensorrt-llm "
                                         "has no estimate"):
        engines.with_kv_policy(TRT, "estimate")


def test_cli_takes_the_exact_policy_and_reports_it(capsys, tmp_path):
    args = [a if a != "tensorrt-llm" else "sglang" for a in BASE]
    code, out, _ = run_cli(args + ["--num-requests", "64", "--kv-policy", "exact",
                                   "--output-dir", str(tmp_path / "x")], capsys)
    assert code == 0 and json.loads(out)["kv_policy"] == "exact"
    code, _, err = run_cli(BASE + ["--num-requests", "8", "--kv-policy", "estimate",
                                   "--output-dir", str(tmp_path / "y")], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "estimate" in err


def test_sglang_benchmark_rows_without_radix_cache_admit_exactly():
    points = load_points(default_points_path())
    exact = points[points["kv_policy"] == "exact"]
    assert len(exact) == 19
    assert all("--disable-radix-cache" in s for s in exact["source_location"])


def _ttft_ms(engine, gpu, precision, input_len=8192):
    workload = InferenceWorkload(input_len, 16, precision)
    result = search(MODEL, workload, Cluster(get_gpu(gpu), 1, 1), engine=engine,
                    mode="static", pins=Pins((1,), (1,), (1,)))
    return result.table.iloc[0].ttft_ms


def test_fp8_context_fmha_speeds_long_prompts_only_where_it_runs():
    # An 8K-token prompt of Llama 3 8B spends a good part of its prefill in
    # attention; run in FP8 (TensorRT-LLM's default for FP8 engines) it is faster
    # on Hopper, and the switch changes nothing with a BF16 cache or on an Ada L40S
    # (FP8 GEMMs, but the kernel is built for Hopper and Blackwell).
    off = engines.with_fp8_context_fmha(TRT, False)
    assert TRT.fp8_context_fmha is True and "hopper" in TRT.fp8_fmha_generations
    assert _ttft_ms(TRT, "h100-80gb", "fp8") < 0.97 * _ttft_ms(off, "h100-80gb", "fp8")
    assert _ttft_ms(TRT, "h100-80gb", "bf16") == _ttft_ms(off, "h100-80gb", "bf16")
    assert _ttft_ms(TRT, "l40s", "fp8") == _ttft_ms(off, "l40s", "fp8")
    with pytest.raises(InputError, match="invalid --fp8-context-fmha: engine vllm has no "
                                         "FP8 context attention kernel"):
        engines.with_fp8_context_fmha(engines.get_engine("vllm"), True)


def test_cli_reports_fp8_context_fmha_and_refuses_it_where_it_is_absent(capsys, tmp_path):
    args = BASE + ["--precision", "fp8", "--batch", "4"]
    code, out, _ = run_cli(args + ["--output-dir", str(tmp_path / "a")], capsys)
    assert code == 0 and json.loads(out)["fp8_context_fmha"] is True
    code, out, _ = run_cli(args + ["--no-fp8-context-fmha", "--output-dir",
                                   str(tmp_path / "b")], capsys)
    assert code == 0 and json.loads(out)["fp8_context_fmha"] is False
    vllm = [a if a != "tensorrt-llm" else "vllm" for a in BASE]
    code, _, err = run_cli(vllm + ["--fp8-context-fmha", "--batch", "4", "--output-dir",
                                   str(tmp_path / "c")], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1 and "fp8-context-fmha" in err


def test_mlperf_rows_say_whether_their_engines_ran_fp8_context_fmha():
    points = load_points(default_points_path())
    off = set(points.loc[points["fp8_context_fmha"].astype(str).str.lower() == "false",
                         "point_id"])
    # v4.1's builders never set it; v5.1's Mixtral configs disable it
    assert off == {f"J{n:03d}" for n in range(1, 15)} | {"J023", "J024"}
