"""Serving engines, continuous batching, pinned layouts and disaggregated serving
(``autoconfig infer``), through the library and the real CLI."""

import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import CatalogError, InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.latency import latency
from autoconfig.inference.memory import kv_tokens_per_request
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import ask, default_points_path, load_points
from autoconfig.inference.search import Limits, Pins, concurrency_grid, predict, search
from cli_runner import run_cli

LLAMA = ["infer", "--model", "llama3", "--size", "70b", "--gpu", "h100", "--gpus", "8",
         "--input-len", "2048", "--output-len", "256", "--no-plots"]
VLLM = engines.get_engine("vllm")


def table(model, workload, plans, cluster, engine=VLLM, mode="continuous"):
    return predict(model, workload, InferencePlanTable.from_plans(plans), cluster,
                   engine=engine, mode=mode)


def test_every_engine_loads_with_sources() -> None:
    assert {"fastertransformer", "megatron-core", "tensorrt-llm", "vllm"} <= set(engines.names())
    for name in engines.names():
        e = engines.get_engine(name)
        assert e.batching in engines.BATCHING and e.kv_cache in engines.KV_CACHES
        assert all(source.strip() for source in e.sources.values())
        assert 0 < e.decode_attention_hbm_efficiency <= 1
    assert engines.get_engine(None).name == engines.DEFAULT_ENGINE


def test_an_engine_value_without_source_is_a_catalog_error(tmp_path, monkeypatch) -> None:
    text = (engines.engines_dir() / "vllm.yaml").read_text()
    broken = text.replace('kernels_per_layer: {value: 12, source:', 'kernels_per_layer: {value: 12, note:')
    assert broken != text
    (tmp_path / "vllm.yaml").write_text(broken)
    monkeypatch.setattr(engines, "engines_dir", lambda: tmp_path)
    engines._load.cache_clear()
    with pytest.raises(CatalogError, match="kernels_per_layer"):
        engines.get_engine("vllm")
    engines._load.cache_clear()


def test_continuous_steady_state_obeys_littles_law_and_slows_with_concurrency() -> None:
    """Requests/s x request latency = requests in flight; TPOT and TTFT grow with them."""
    model = get_model("llama3-70b")
    cluster = Cluster(get_gpu("h100-80gb"), 1, 8)
    workload = InferenceWorkload(2048, 256)
    rows = table(model, workload, [InferencePlan(8, 1, c) for c in (1, 8, 32, 128)], cluster)
    in_flight = rows["requests_per_s_per_replica"] * rows["latency_ms"] / 1e3
    assert np.allclose(in_flight, rows["batch"])
    assert np.all(np.diff(rows["tpot_ms"]) > 0) and np.all(np.diff(rows["ttft_ms"]) > 0)
    assert np.all(np.diff(rows["tokens_per_s_per_gpu"]) > 0)


def test_prefill_interference_slows_continuous_decode_against_a_static_batch() -> None:
    """At the same batch, steady-state TPOT carries the prompts of arriving requests."""
    model = get_model("llama3-70b")
    cluster = Cluster(get_gpu("h100-80gb"), 1, 8)
    workload = InferenceWorkload(2048, 128)
    plan = [InferencePlan(8, 1, 32)]
    steady = table(model, workload, plan, cluster).iloc[0]
    burst = table(model, workload, plan, cluster, mode="static").iloc[0]
    assert steady.tpot_ms > 1.2 * burst.tpot_ms
    assert steady.ttft_ms < burst.ttft_ms        # one prompt, not 32


def test_paged_kv_holds_only_written_tokens() -> None:
    workload = InferenceWorkload(1000, 500)
    assert kv_tokens_per_request(workload, None, True) == 1500
    assert kv_tokens_per_request(workload, 16, True) == 1264      # ceil(1250 / 16) * 16
    assert kv_tokens_per_request(workload, 16, False) == 1504


def test_the_issue_example_ranks_layouts_at_the_limit(capsys, tmp_path) -> None:
    code, out, err = run_cli(LLAMA + ["--engine", "vllm", "--max-ttft-ms", "1000",
                                      "--max-tpot-ms", "50", "--format", "json",
                                      "--top", "100", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["engine"] == "vllm" and data["batching"] == "continuous"
    plans = data["plans"]
    layouts = [(p["tp"], p["pp"], p["ep"], p["replicas"]) for p in plans]
    assert len(layouts) == len(set(layouts))                    # one row per layout
    per_gpu = [p["tokens_per_s_per_gpu"] for p in plans]
    assert per_gpu == sorted(per_gpu, reverse=True) or data["objective"] == "throughput"
    assert all(p["ttft_ms"] <= 1000 and p["tpot_ms"] <= 50 for p in plans)
    # the next concurrency of the grid breaks a limit or does not fit
    model, cluster = get_model("llama3-70b"), Cluster(get_gpu("h100-80gb"), 1, 8)
    grid = concurrency_grid(VLLM.max_num_seqs)
    best = plans[0]
    following = [c for c in grid if c > best["batch"]]
    if following:
        nxt = table(model, InferenceWorkload(2048, 256),
                    [InferencePlan(best["tp"], best["pp"], following[0], best["replicas"])],
                    cluster).iloc[0]
        assert nxt.ttft_ms > 1000 or nxt.tpot_ms > 50 or not nxt.fits


def test_request_rate_picks_the_smallest_concurrency_serving_it() -> None:
    model = get_model("llama3-8b")
    cluster = Cluster(get_gpu("h100-80gb"), 1, 8)
    workload = InferenceWorkload(512, 128)
    result = search(model, workload, cluster, engine=VLLM, mode="continuous",
                    pins=Pins(tp=(1,)), request_rate_per_s=20.0)
    row = result.table.iloc[0]
    assert row.requests_per_s_total >= 20.0
    below = [c for c in concurrency_grid(VLLM.max_num_seqs) if c < row.batch]
    if below:
        lower = table(model, workload, [InferencePlan(1, 1, below[-1], 8)], cluster).iloc[0]
        assert lower.requests_per_s_total < 20.0


def test_any_batch_pinned_layout_and_tp_across_nodes(capsys, tmp_path) -> None:
    code, out, err = run_cli(["infer", "--model", "gpt3", "--size", "175b", "--gpu", "a100-80gb",
                              "--nodes", "2", "--input-len", "128", "--output-len", "64",
                              "--engine", "fastertransformer", "--tp", "16", "--batch", "12,20",
                              "--format", "json", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    plans = json.loads(out)["plans"]
    assert {(p["tp"], p["batch"]) for p in plans} <= {(16, 12), (16, 20)} and plans
    # TP across nodes pays the scale-out ring: its all-reduces cost more than TP 8's in a node
    model, cluster = get_model("gpt3-175b"), Cluster(get_gpu("a100-80gb"), 2, 8)
    lat = latency(model, InferenceWorkload(128, 64),
                  InferencePlanTable.from_plans([InferencePlan(16, 1, 1), InferencePlan(8, 1, 1)]),
                  cluster, engine=engines.get_engine("fastertransformer"))
    assert lat.decode_tp_comm_s[0] > lat.decode_tp_comm_s[1]


def test_new_inference_gpu_is_answered(capsys, tmp_path) -> None:
    code, out, err = run_cli(["infer", "--model", "llama3", "--size", "8b", "--gpu", "l40s",
                              "--gpus", "8", "--input-len", "512", "--output-len", "128",
                              "--batch", "12", "--format", "json", "--no-plots",
                              "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert all(p["batch"] == 12 for p in json.loads(out)["plans"])


def test_disaggregated_rows_appear_beside_aggregated(capsys, tmp_path) -> None:
    code, out, err = run_cli(LLAMA[:8] + ["16"] + LLAMA[9:] + [
        "--engine", "vllm", "--max-ttft-ms", "1000", "--max-tpot-ms", "50",
        "--disaggregated", "--format", "json", "--top", "200", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    plans = json.loads(out)["plans"]
    kinds = {p["serving"] for p in plans}
    assert kinds == {"aggregated", "disaggregated"}
    for p in plans:
        assert p["ttft_ms"] <= 1000 and p["tpot_ms"] <= 50
        if p["serving"] == "disaggregated":
            used = p["prefill_instances"] * p["prefill_tp"] * p["prefill_pp"] + \
                p["replicas"] * p["gpus_per_replica"]
            assert used <= 16 and p["kv_transfer_ms"] > 0


def test_disaggregated_serving_that_cannot_be_laid_out_is_said(capsys, tmp_path) -> None:
    """One GPU holds no prefill pool beside a decode pool: the answer says so
    instead of looking as if --disaggregated was not asked."""
    code, out, err = run_cli(["infer", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "1",
                              "--engine", "vllm", "--input-len", "512", "--output-len", "128",
                              "--disaggregated", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "disaggregated serving: no prefill pool and decode pool pair fits" in out


@pytest.mark.parametrize("args,message", [
    (["--engine", "nope"], "--engine"),
    (["--engine", "fastertransformer", "--batching", "continuous"], "batches statically"),
    (["--batch", "4", "--concurrency", "8"], "either --batch"),
    # a bound of the search with nothing searched was ignored
    (["--concurrency", "64", "--max-batch", "8"], "--max-batch bounds the batches"),
    (["--batch", "4", "--max-batch", "8"], "--max-batch bounds the batches"),
    (["--tp", "3"], "invalid --tp 3"),
    (["--pp", "81"], "invalid --pp 81: it must be at most the 80 layers"),
    (["--engine", "megatron-core", "--pp", "3"],
     "invalid --pp 3: megatron-core needs it to divide the 80 layers"),
    (["--ep", "2"], "invalid --ep 2: llama3-70b has no experts"),
    (["--batch", "0"], "--batch"),
    (["--request-rate", "-1", "--batching", "continuous"], "--request-rate"),
    (["--engine", "fastertransformer", "--disaggregated"], "separate"),
])
def test_bad_serving_input_is_one_line(capsys, tmp_path, args, message) -> None:
    code, _, err = run_cli(LLAMA + args + ["-o", str(tmp_path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_static_engine_rejects_continuous_mode_in_the_library() -> None:
    with pytest.raises(InputError, match="batches statically"):
        search(get_model("llama3-8b"), InferenceWorkload(128, 32),
               Cluster(get_gpu("h100-80gb"), 1, 8),
               engine=engines.get_engine("fastertransformer"), mode="continuous",
               limits=Limits())


def test_an_expert_parallel_pin_keeps_the_layout_as_run(capsys, tmp_path) -> None:
    """``--ep`` pins expert parallelism as ``--tp/--pp`` pin theirs: Mixtral on 8
    GPUs at TP 1 searches EP 1, 2, 4, 8 (a replica holding every expert, or the
    experts spread over replicas); pinned to 1, each GPU holds all 8 experts, as
    MLPerf's TensorRT-LLM runs did (the published points blank EP as 1)."""
    mixtral = ["infer", "--model", "mixtral", "--size", "8x7b", "--gpu", "h100", "--gpus", "8",
               "--input-len", "512", "--output-len", "128", "--precision", "fp8",
               "--engine", "tensorrt-llm", "--tp", "1", "--pp", "1", "--no-plots",
               "--format", "json", "--top", "20"]
    code, text, err = run_cli(mixtral + ["-o", str(tmp_path / "auto")], capsys)
    assert code == 0, err
    assert {p["ep"] for p in json.loads(text)["plans"]} > {1}
    code, text, err = run_cli(mixtral + ["--ep", "1", "-o", str(tmp_path / "one")], capsys)
    assert code == 0, err
    plans = json.loads(text)["plans"]
    assert {p["ep"] for p in plans} == {1} and plans[0]["weights_gib"] > 40   # 47B at 1 byte
    code, _, err = run_cli(mixtral + ["--ep", "3", "-o", str(tmp_path / "bad")], capsys)
    assert code == 2 and "invalid --ep 3: must divide the 8 experts" in err
    # An EP group is whole TP groups: EP 2 under TP 4 is named as such, not as heads.
    code, _, err = run_cli(mixtral + ["--ep", "2", "--tp", "4", "-o", str(tmp_path / "tp")],
                           capsys)
    assert code == 2 and err.strip().count("\n") == 0
    assert "invalid --ep 2 with --tp 4: EP must be 1 or a multiple of TP" in err
    points = load_points(default_points_path())
    row = next(points[points["point_id"] == "J005"].itertuples())
    assert ask(row._replace(num_requests=800)).ep == 1


def test_engines_deal_layers_to_stages_their_own_way() -> None:
    """vLLM, SGLang and TensorRT-LLM give each stage the floor or ceil of L/pp,
    FasterTransformer ceil(L/pp) and the rest to the last stage, megatron-core
    needs pp to divide L (each engine file's ``pipeline_layers``)."""
    get = engines.get_engine
    assert get("vllm").splits_layers(61, 2) and get("sglang").splits_layers(126, 4)
    assert get("tensorrt-llm").splits_layers(105, 8) and not get("vllm").splits_layers(61, 62)
    assert not get("megatron-core").splits_layers(61, 2)
    assert get("megatron-core").splits_layers(60, 2)
    ft = get("fastertransformer")
    assert ft.splits_layers(10, 4)              # 3, 3, 3, 1
    assert not ft.splits_layers(9, 4)           # 3, 3, 3 and nothing for the last stage
    assert not get("lmdeploy").splits_layers(80, 2)     # no pipeline parallelism


def test_the_heaviest_stage_sets_step_time_and_memory() -> None:
    """81 layers over 2 stages run as 41 and 40: the 41-layer stage paces every
    step and fills its GPUs, as an 82-layer model's even stages would, and
    costs more than 80 layers' 40."""
    import dataclasses
    base, cluster = get_model("llama3-8b"), Cluster(get_gpu("h100"), 1, 8)
    plans = InferencePlanTable.from_plans([InferencePlan(1, 2, 8)])
    engine = engines.get_engine("vllm")

    def served(layers):
        model = dataclasses.replace(base, num_layers=layers)
        row = predict(model, InferenceWorkload(512, 64), plans, cluster, engine=engine,
                      mode="continuous").iloc[0]
        return row.tpot_ms, row.weights_gib
    assert served(81) == pytest.approx(served(82), rel=1e-12)
    assert served(81)[0] > served(80)[0] and served(81)[1] > served(80)[1]


def test_a_pipeline_that_does_not_divide_the_layers_is_served(capsys, tmp_path) -> None:
    """Llama 3.1 405B's 126 layers on 4 stages (32, 32, 31, 31 on vLLM) are served
    where the engine deals them unevenly, refused where it cannot."""
    args = ["infer", "--model", "llama3", "--size", "405b", "--gpu", "h100", "--gpus", "16",
            "--input-len", "1024", "--output-len", "128", "--precision", "fp8",
            "--no-plots", "--format", "json"]
    code, out, err = run_cli(args + ["--engine", "vllm", "--tp", "4", "--pp", "4",
                                     "-o", str(tmp_path / "a")], capsys)
    assert code == 0, err
    assert {p["pp"] for p in json.loads(out)["plans"]} == {4}
    code, _, err = run_cli(args + ["--engine", "megatron-core", "--tp", "4", "--pp", "4",
                                   "-o", str(tmp_path / "c")], capsys)
    assert code == 2 and "megatron-core needs it to divide the 126 layers" in err


def search_pp(model, max_pp: int, engine: str) -> list[int]:
    from autoconfig.inference.search import pp_choices
    return pp_choices(model, max_pp, engines.get_engine(engine))


def test_uneven_pipelines_join_the_search_on_engines_that_run_them() -> None:
    deepseek = get_model("deepseek-v3")                     # 61 layers, a prime
    assert search_pp(deepseek, 8, "vllm") == [1, 2, 4, 8]
    assert search_pp(deepseek, 8, "megatron-core") == [1]
    assert search_pp(get_model("llama3-70b"), 8, "vllm") == [1, 2, 4, 5, 8]
    assert search_pp(get_model("llama3-405b"), 16, "vllm") == [1, 2, 3, 4, 6, 7, 8, 9, 14, 16]
