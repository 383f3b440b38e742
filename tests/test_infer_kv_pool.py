"""A KV pool of a size the user set (``infer --kv-cache-tokens``): admission, the
steady state's concurrency, memory and the refusals."""

import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InfeasibleError, InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import Job
from autoconfig.inference.memory import kv_bytes_per_token_per_gpu, kv_tokens_per_request
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.search import Pins, search
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)
VLLM = engines.get_engine("vllm")
WORKLOAD = InferenceWorkload(1024, 256, "bf16")
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--input-len", "1024", "--output-len", "256", "--no-plots"]


def test_the_override_is_checked_and_only_for_a_paged_pool() -> None:
    assert engines.with_kv_cache_tokens(VLLM, None) is VLLM
    assert engines.with_kv_cache_tokens(VLLM, 5000).kv_cache_tokens == 5000
    for bad in (0, -3, 1 << 31):
        with pytest.raises(InputError, match="--kv-cache-tokens"):
            engines.with_kv_cache_tokens(VLLM, bad)
    with pytest.raises(InputError, match="contiguous KV cache"):
        engines.with_kv_cache_tokens(engines.get_engine("fastertransformer"), 5000)


def test_steady_state_concurrency_stops_where_the_pool_is_full() -> None:
    pool = 20_000
    per_request = kv_tokens_per_request(WORKLOAD, VLLM.kv_block_tokens, True)
    table = search(MODEL, WORKLOAD, CLUSTER, engine=engines.with_kv_cache_tokens(VLLM, pool),
                   mode="continuous", pins=Pins((1,), (1,))).table
    best = table.iloc[0]
    assert best.batch * per_request <= pool < 2 * best.batch * per_request
    with pytest.raises(InfeasibleError):     # twice the concurrency outgrows the pool
        search(MODEL, WORKLOAD, CLUSTER, engine=engines.with_kv_cache_tokens(VLLM, pool),
               mode="continuous", pins=Pins((1,), (1,), (2 * int(best.batch),)))
    # memory holds the whole pool, allocated at start, whatever the concurrency
    pool_gib = pool * float(kv_bytes_per_token_per_gpu(MODEL, np.array([1]), np.array([1]),
                                                        WORKLOAD.kv_bytes_per_value)[0]) / 2**30
    assert best.kv_cache_gib == pytest.approx(pool_gib)
    unpinned = search(MODEL, WORKLOAD, CLUSTER, engine=VLLM, mode="continuous",
                      pins=Pins((1,), (1,))).table.iloc[0]
    assert unpinned.batch > best.batch


def test_a_smaller_pool_queues_a_job_longer() -> None:
    def run(pool):
        engine = engines.with_kv_cache_tokens(VLLM, pool)
        return search(MODEL, WORKLOAD, CLUSTER, engine=engine, job=Job(64),
                      pins=Pins((1,), (1,))).table.iloc[0]
    small, large = run(8_000), run(200_000)
    assert small.ttft_ms > 2 * large.ttft_ms
    assert small.tokens_per_s_per_gpu < large.tokens_per_s_per_gpu


def test_a_pool_memory_cannot_hold_is_refused() -> None:
    engine = engines.with_kv_cache_tokens(VLLM, 2_000_000)      # ~244 GiB of KV for Llama 3 8B
    with pytest.raises(InfeasibleError):
        search(MODEL, WORKLOAD, CLUSTER, engine=engine, job=Job(8), pins=Pins((1,), (1,)))
    with pytest.raises(InfeasibleError):
        search(MODEL, WORKLOAD, CLUSTER, engine=engine, mode="continuous", pins=Pins((1,), (1,)))


def test_cli_reports_the_pool_and_refuses_bad_values(capsys, tmp_path) -> None:
    code, out, err = run_cli(BASE + ["--engine", "vllm", "--kv-cache-tokens", "20000",
                                     "--format", "json", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert json.loads(out)["kv_cache_tokens"] == 20000
    code, out, err = run_cli(BASE + ["--engine", "vllm", "--kv-cache-tokens", "20000",
                                     "-o", str(tmp_path)], capsys)
    assert code == 0 and "a KV pool of 20000 tokens per replica" in out + err, err
    for engine, value, why in (("vllm", "0", "must be an integer from 1"),
                               ("fastertransformer", "5000", "contiguous KV cache")):
        code, _, err = run_cli(BASE + ["--engine", engine, "--kv-cache-tokens", value,
                                       "-o", str(tmp_path / engine)], capsys)
        assert code != 0 and why in err and len(err.strip().splitlines()) == 1, err


def test_a_concurrency_past_the_pool_names_the_pool_not_memory(capsys, tmp_path) -> None:
    # At steady state a request holds its prompt and half its output on average,
    # 1,024 + 128 tokens: 20,000 hold 17. Memory has room to spare.
    code, _, err = run_cli(BASE + ["--engine", "vllm", "--kv-cache-tokens", "20000",
                                   "--concurrency", "40", "-o", str(tmp_path)], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "holds 40 requests per replica in its KV pool" in err
    assert "the largest pool holds 17" in err and "GiB" not in err
    code, _, err = run_cli(BASE + ["--engine", "vllm", "--kv-cache-tokens", "20000",
                                   "--concurrency", "17", "-o", str(tmp_path)], capsys)
    assert code == 0, err
