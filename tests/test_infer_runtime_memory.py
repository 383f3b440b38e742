"""Serving memory outside the caching allocator (``memory.runtime_context_bytes``): a
replica on one GPU has no communicators to buffer, one that spans GPUs has."""

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.inference import engine as engines
from autoconfig.inference.memory import (kv_bytes_per_token_per_gpu, kv_capacity_tokens,
                                         memory_per_gpu, runtime_context_bytes)
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload

GIB = 2**30


def test_communicator_buffers_come_with_peers() -> None:
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 8), InferencePlan(2, 1, 8),
                                           InferencePlan(8, 1, 8), InferencePlan(1, 2, 8)])
    context = runtime_context_bytes(plans) / GIB
    assert context[0] == pytest.approx(1.79)                 # vLLM's TP 1 profile
    assert context[1] == pytest.approx(3.58)                 # and its TP 2 profile
    assert context[2] == context[1] == context[3]
    # the memory a plan needs carries it, and the KV room left shrinks by as much
    w = InferenceWorkload(1024, 256, "bf16")
    model = get_model("llama3-8b")
    pair = plans.take([0, 1])
    tokens = np.full(2, 1024.0)
    total = memory_per_gpu(model, w, pair, tokens).total_bytes
    weights = memory_per_gpu(model, w, pair, tokens).weights_bytes
    assert total[0] - weights[0] > 1.79 * GIB
    room = kv_capacity_tokens(model, w, pair, tokens, get_gpu("h100-80gb"))
    per_token = kv_bytes_per_token_per_gpu(model, pair.tp, pair.pp, w.kv_bytes_per_value)
    # at TP 2 half the weights and half the KV per GPU, less the buffers
    assert room[1] * per_token[1] < 2 * room[0] * per_token[0]


def test_the_pool_lmdeploys_script_set_fits_the_a100_it_ran_on() -> None:
    """benchmark_7b.sh (v0.1.0a1) set cache_max_entry_count 1000 blocks of 128 tokens
    for Llama 2 7B on one A100 80GB, and it ran: the 128,000-token pool must fit."""
    model, gpu = get_model("llama2-7b"), get_gpu("a100-80gb")
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 128)])
    w = InferenceWorkload(2048, 2048, "bf16")
    budget = float(engines.get_engine("lmdeploy-0.1").max_batched_tokens * 4)
    held = kv_capacity_tokens(model, w, plans, np.array([budget]), gpu, 128_000)
    assert held[0] == 128_000
