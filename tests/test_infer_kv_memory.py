"""How a paged engine sizes its KV pool from memory (``Engine.kv_pool``): a share of
what is free once the model is loaded (TensorRT-LLM), of the whole GPU less the
engine's footprint (vLLM), or of the whole GPU for weights and pool with SGLang's
derived reserve; ``infer --kv-memory-fraction`` sets the share."""

import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import CatalogError, InfeasibleError, InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.memory import (kv_bytes_per_token_per_gpu, memory_per_gpu,
                                         pool_tokens, runtime_context_bytes)
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import ask, default_points_path, load_points
from autoconfig.inference.search import Pins, search
from autoconfig.training.memory import load_constants, usable_bytes
from cli_runner import run_cli
from engine_files import load_with_field

MODEL = get_model("llama3-8b")
GPU = get_gpu("h100-80gb")
WORKLOAD = InferenceWorkload(1024, 256, "bf16")
PLANS = InferencePlanTable.from_plans([InferencePlan(1, 1, 64), InferencePlan(2, 1, 64)])
FORWARD = np.array([8192.0, 8192.0])
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--input-len", "1024", "--output-len", "256", "--no-plots", "--format", "json",
        "--tp", "1", "--pp", "1"]


def _parts():
    """(T, weights as loaded, fragmented activations, context, bytes per token): an
    engine measures its weights once they are loaded, one allocation each."""
    frag, _ = load_constants().overhead_of("megatron-core")
    fixed = memory_per_gpu(MODEL, WORKLOAD, PLANS, FORWARD, 0.0)
    return (usable_bytes(GPU), fixed.weights_bytes, frag * fixed.activation_bytes,
            runtime_context_bytes(PLANS),
            kv_bytes_per_token_per_gpu(MODEL, PLANS.tp, PLANS.pp, WORKLOAD.kv_bytes_per_value))


def _tokens(engine) -> np.ndarray:
    return pool_tokens(MODEL, WORKLOAD, PLANS, FORWARD, GPU, engine)


@pytest.mark.parametrize("name,expected", [
    ("tensorrt-llm", lambda t, w, a, c: 0.9 * (t - w - a - c)),   # of what is free
    ("vllm", lambda t, w, a, c: 0.9 * t - (w + a + c)),           # of the whole GPU
])
def test_share_rules_follow_each_engines_formula(name, expected):
    engine = engines.get_engine(name)
    t, w, a, c, per_token = _parts()
    block = engine.kv_block_tokens
    want = np.floor(expected(t, w, a, c) / per_token / block) * block
    assert np.array_equal(_tokens(engine), want)


def test_sglang_derives_its_share_from_a_reserve():
    # H100 80GB at TP 1: 512 + 1.5 x 8,192 + 2 x 256 + 128 = 13,440 MiB kept out of the
    # share (over the 10 GiB floor); at TP 2, 128 MiB more.
    # The graph term is the engine's own decode graph batch (256 below TP 4, 512 from it).
    sglang = engines.get_engine("sglang")
    rule = sglang.kv_pool
    t = usable_bytes(GPU)
    tp = np.array([1, 2])
    share = rule.share_of(t, 8192, tp, np.array([1, 1]), sglang.graph_max_seqs(tp))
    assert share == pytest.approx(1 - np.array([13440, 13568]) * 2**20 / t)
    assert rule.share_of(t, 8192, 4, 1, sglang.graph_max_seqs(4)) == pytest.approx(
        1 - (512 + 1.5 * 8192 + 2 * 512 + 512) * 2**20 / t)
    # a small budget on a small GPU: no floor, the chunk term at its 2,048 minimum
    l40s = usable_bytes(get_gpu("l40s"))
    assert rule.share_of(l40s, 512, 1, 1, 256) == pytest.approx(1 - (512 + 3072 + 512 + 128)
                                                                * 2**20 / l40s)
    t, w, a, c, per_token = _parts()
    tokens = _tokens(engines.get_engine("sglang"))
    assert np.array_equal(tokens, np.floor((share * t - w - c) / per_token))   # page size 1


def test_the_fraction_moves_the_pool_and_a_users_pool_overrides_it():
    trt = engines.get_engine("tensorrt-llm")
    half = engines.with_kv_memory_fraction(trt, 0.5)
    assert np.all(_tokens(half) < 0.6 * _tokens(trt))
    assert np.all(_tokens(engines.with_kv_cache_tokens(half, 12_345)) == 12_345)
    assert _tokens(engines.get_engine("lmdeploy")) is None          # what memory leaves
    for bad, why in ((1.5, "must be a number in \\(0, 1\\]"), (0, "must be a number"),
                     (True, "must be a number")):
        with pytest.raises(InputError, match=why):
            engines.with_kv_memory_fraction(trt, bad)
    with pytest.raises(InputError, match="engine lmdeploy has no memory share"):
        engines.with_kv_memory_fraction(engines.get_engine("lmdeploy"), 0.8)


def test_a_share_that_leaves_no_room_does_not_fit():
    # 0.15 x 79 GiB: below Llama 3 8B's 15 GiB of weights on one GPU, above its half at TP 2
    vllm = engines.with_kv_memory_fraction(engines.get_engine("vllm"), 0.15)
    tp1, tp2 = _tokens(vllm)
    assert tp1 == 0 and tp2 > 0
    with pytest.raises(InfeasibleError):
        search(MODEL, WORKLOAD, Cluster(GPU, 1, 1), engine=vllm, mode="continuous",
               pins=Pins((1,), (1,)))


def test_the_cli_takes_the_fraction(tmp_path, capsys):
    runs = {}
    for share in ("0.9", "0.6"):
        code, text, err = run_cli(BASE + ["--engine", "vllm", "--kv-memory-fraction", share,
                                          "--output-dir", str(tmp_path / share)], capsys)
        assert code == 0, err
        runs[share] = json.loads(text)
    assert runs["0.6"]["kv_memory_fraction"] == 0.6
    best = {k: v["plans"][0] for k, v in runs.items()}
    assert best["0.6"]["kv_cache_gib"] < best["0.9"]["kv_cache_gib"] - 20
    code, _, err = run_cli(BASE + ["--engine", "lmdeploy", "--kv-memory-fraction", "0.8",
                                   "--output-dir", str(tmp_path / "x")], capsys)
    assert code != 0 and "has no memory share" in err and len(err.strip().splitlines()) == 1


def test_a_bad_rule_in_an_engine_file_is_a_catalog_error():
    with pytest.raises(CatalogError, match="kv_pool_memory must give"):
        engines._kv_pool({"of": "free", "share": 1.4}, default_points_path())
    with pytest.raises(CatalogError, match="kv_pool_memory must give"):
        engines._kv_pool({"of": "static", "reserve": {"base_mib": 512}}, default_points_path())


def test_published_rows_carry_the_share_their_configs_set():
    points = load_points(default_points_path())
    shares = dict(zip(points["point_id"], points["kv_memory_fraction"]))
    assert (shares["J028"], shares["J029"], shares["J030"]) == (0.91, 0.95, 0.96)
    assert shares["J020"] == 0.99 and shares["J001"] == 0.9 and np.isnan(shares["J027"])
    # the L40S Offline row's job, cut to 2,000 requests: less KV room, fewer in flight
    row = next(points[points["point_id"] == "J029"].itertuples())._replace(num_requests=2000)
    assert ask(row._replace(kv_memory_fraction=0.6)).tokens_per_s_per_gpu < \
        0.95 * ask(row).tokens_per_s_per_gpu


def test_an_engine_allocating_exact_sizes_pays_no_allocator_slack(tmp_path, monkeypatch):
    """FasterTransformer takes its buffers at their sizes from the CUDA memory pool:
    its memory is what it allocates plus the runtime context, where a caching
    allocator's engine pays megatron-core's slack on top. GPT-3 20B at TP 1,
    batch 64, 512 in / 32 out on an A100 80GB fits only without the slack."""
    import dataclasses
    from autoconfig.inference.search import predict
    ft = engines.get_engine("fastertransformer")
    assert ft.allocator_fragmentation == 1.0
    caching = dataclasses.replace(ft, allocator_fragmentation=None)
    model, gpu = get_model("gpt3", "20b"), get_gpu("a100-80gb")
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 64)])
    workload = InferenceWorkload(512, 32)
    tokens = np.array([64.0 * 512])
    exact = memory_per_gpu(model, workload, plans, tokens, engine=ft)
    cached = memory_per_gpu(model, workload, plans, tokens, engine=caching)
    allocated = exact.weights_bytes + exact.kv_cache_bytes + exact.activation_bytes
    assert exact.total_bytes == pytest.approx(allocated + runtime_context_bytes(plans))
    frag, _ = load_constants().overhead_of("megatron-core")
    assert cached.total_bytes - exact.total_bytes == pytest.approx(allocated * (frag - 1.0))
    cluster = Cluster(gpu, 1, 8)
    assert predict(model, workload, plans, cluster, engine=ft).iloc[0].fits
    assert not predict(model, workload, plans, cluster, engine=caching).iloc[0].fits
    # an engine file cannot claim an allocator that returns memory
    with pytest.raises(CatalogError, match="allocator_fragmentation"):
        load_with_field(tmp_path, monkeypatch, "fastertransformer", "allocator_fragmentation",
                        "0.9")
