"""Inference model, search and `autoconfig infer` / `infer-validate` through the real CLI."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InfeasibleError, InputError
from autoconfig.inference import report
from autoconfig.inference.collectives import (kernel_gpu_floor_s, sync_latency_s,
                                              tp_allreduce_s)
from autoconfig.inference.engine import PipelineSplit, get_engine, with_kv_cache_tokens
from autoconfig.inference.latency import ALLREDUCES_PER_LAYER, latency
from autoconfig.inference.memory import kv_bytes_per_token_per_gpu, weights_bytes_per_gpu
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import default_points_path, validate
from autoconfig.inference.search import Limits, pareto_mask, predict, search
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

GPT3_ARGS = ["infer", "--model", "gpt3", "--size", "175b", "--gpu", "a100-80gb", "--nodes", "4",
             "--input-len", "60", "--output-len", "20", "--engine", "fastertransformer"]
FT = get_engine("fastertransformer")
TRT = get_engine("tensorrt-llm")


def one(model, workload, plan, cluster, engine=FT, mode="static"):
    return predict(model, workload, InferencePlanTable.from_plans([plan]), cluster,
                   engine=engine, mode=mode).iloc[0]


# ---------------------------------------------------------------- the model


def test_kv_cache_is_gqa_aware() -> None:
    """2 * layers * kv_heads * head_dim * bytes per token: Llama 3 70B (8 KV heads) 320 KiB."""
    llama = get_model("llama3-70b")
    assert kv_bytes_per_token_per_gpu(llama, 1, 1, 2) == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token_per_gpu(llama, 8, 2, 2) == 2 * 40 * 1 * 128 * 2
    assert kv_bytes_per_token_per_gpu(llama, 1, 1, 1) == 2 * 80 * 8 * 128    # fp8 KV
    gpt3 = get_model("gpt3", "175b")
    assert kv_bytes_per_token_per_gpu(gpt3, 1, 1, 2) == 2 * 96 * 96 * 128 * 2


def test_fp8_halves_weights_and_kv() -> None:
    model = get_model("llama3-70b")
    assert weights_bytes_per_gpu(model, 8, 1, 1) * 2 == pytest.approx(
        weights_bytes_per_gpu(model, 8, 1, 2))
    cluster = Cluster(get_gpu("h100-80gb"), 1, 8)
    plan = InferencePlan(8, 1, 8)
    bf16 = one(model, InferenceWorkload(512, 64, "bf16"), plan, cluster)
    fp8 = one(model, InferenceWorkload(512, 64, "fp8"), plan, cluster)
    assert fp8.weights_gib == pytest.approx(bf16.weights_gib / 2)
    assert fp8.kv_cache_gib == pytest.approx(bf16.kv_cache_gib / 2)
    assert fp8.tpot_ms < bf16.tpot_ms


def test_nvfp4_weights_take_0_5625_bytes_with_an_fp8_kv_cache() -> None:
    """NVFP4 serving (Blackwell): 4-bit weights with a 1-byte scale per 16 and the
    FP8 KV cache the engines' FP4 checkpoints keep; decode at small batch reads
    0.56x the FP8 weights, so its TPOT falls; prefill GEMMs run faster too."""
    model = get_model("llama3-70b")
    cluster = Cluster(get_gpu("b200"), 1, 8)
    plan = InferencePlan(8, 1, 8)
    # one pool of a set size for both, so the cache's GiB compare its bytes per token
    pooled = with_kv_cache_tokens(TRT, 100_000)
    fp8 = one(model, InferenceWorkload(2048, 64, "fp8"), plan, cluster, pooled, "continuous")
    fp4 = one(model, InferenceWorkload(2048, 64, "nvfp4"), plan, cluster, pooled, "continuous")
    assert fp4.weights_gib == pytest.approx(fp8.weights_gib * 0.5625)
    assert fp4.kv_cache_gib == pytest.approx(fp8.kv_cache_gib)
    assert fp4.tpot_ms < fp8.tpot_ms and fp4.ttft_ms < fp8.ttft_ms


@pytest.mark.parametrize("gpu,engine,message", [
    ("h100", "vllm", "blackwell"),            # no FP4 tensor cores
    ("b300", "vllm", "no NVFP4 peak"),        # no confirmed FP4 figure
    ("b200", "lmdeploy", "does not serve nvfp4"),
])
def test_nvfp4_serving_is_refused_in_one_line_where_it_cannot_run(capsys, gpu, engine,
                                                                  message) -> None:
    code, _, err = run_cli(["infer", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "1",
                            "--engine", engine, "--precision", "nvfp4", "--input-len", "64",
                            "--output-len", "8", "--no-plots"], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_small_batch_decode_is_memory_bound() -> None:
    """Batch 1 on one GPU: one decode step reads every weight once at HBM speed, its
    small kernels (norms, rotary, activation, attention) each take the kernel
    floor, plus the engine's host cost per step."""
    model = get_model("llama3-8b")
    gpu = get_gpu("h100-80gb")
    c = load_constants()
    weights_s = weights_bytes_per_gpu(model, 1, 1, 2) / (gpu.hbm_bandwidth_gb_per_s * 1e9
                                                         * c.hbm_efficiency)
    for engine in (FT, TRT):
        small_kernels = engine.kernels_per_layer - 4 - ALLREDUCES_PER_LAYER
        floor_s = model.num_layers * small_kernels * kernel_gpu_floor_s()
        row = one(model, InferenceWorkload(128, 16), InferencePlan(1, 1, 1), Cluster(gpu, 1, 1),
                  engine)
        assert row.tpot_ms / 1e3 == pytest.approx(weights_s + floor_s + engine.step_overhead_s,
                                                  rel=0.03)


def test_a_small_model_at_batch_1_is_launch_bound() -> None:
    """GPT-3 350M: 24 layers of eager launches take longer than streaming 0.7 GB,
    so TPOT is the launch floor; under CUDA graphs the stream sets it again."""
    model = get_model("gpt3", "350m")
    gpu = get_gpu("a100-80gb")
    cluster = Cluster(gpu, 1, 1)
    row = one(model, InferenceWorkload(128, 16), InferencePlan(1, 1, 1), cluster, FT)
    floor = (model.num_layers * FT.kernels_per_layer + 1) * FT.kernel_launch_s
    assert row.tpot_ms / 1e3 == pytest.approx(floor + FT.step_overhead_s, rel=1e-6)
    weights_s = weights_bytes_per_gpu(model, 1, 1, 2) / (gpu.hbm_bandwidth_gb_per_s * 1e9
                                                         * load_constants().hbm_efficiency)
    assert floor > 2 * weights_s
    graphed = one(model, InferenceWorkload(128, 16), InferencePlan(1, 1, 1), cluster, TRT)
    assert graphed.tpot_ms < row.tpot_ms


def test_short_prompts_pay_the_small_gemm_law() -> None:
    """A 128-token prefill of GPT-3 175B is slower than streaming its weights once
    (small-GEMM penalty); a 4,096-token one is compute-bound: time per prompt token
    falls as the prompt grows."""
    model = get_model("gpt3", "175b")
    gpu = get_gpu("h100-80gb")
    cluster = Cluster(gpu, 1, 8)
    c = load_constants()
    stream_s = weights_bytes_per_gpu(model, 8, 1, 2) / (gpu.hbm_bandwidth_gb_per_s * 1e9
                                                        * c.hbm_efficiency)
    short = one(model, InferenceWorkload(128, 2), InferencePlan(8, 1, 1), cluster)
    long = one(model, InferenceWorkload(4096, 2), InferencePlan(8, 1, 1), cluster)
    assert short.ttft_ms / 1e3 > 1.3 * stream_s
    assert long.ttft_ms / 4096 < short.ttft_ms / 128 / 3


def test_tpot_and_ttft_never_fall_as_batch_grows() -> None:
    """Where the pipeline split is the planner's to choose. (A fixed rule can
    pipeline a larger batch better: FasterTransformer splits a batch of 4 over 4
    stages and runs a batch of 2 whole, tests/test_infer_pipeline_split.py.)"""
    model = get_model("gpt3", "175b")
    cluster = Cluster(get_gpu("a100-80gb"), 4, 8)
    engine = dataclasses.replace(FT, pipeline_split=PipelineSplit())
    for tp, pp in ((8, 1), (8, 4), (4, 2)):
        plans = InferencePlanTable.from_plans([InferencePlan(tp, pp, 2 ** i) for i in range(9)])
        lat = latency(model, InferenceWorkload(60, 20), plans, cluster, engine=engine)
        assert np.all(np.diff(lat.tpot_s) >= -1e-12)
        assert np.all(np.diff(lat.ttft_s) >= -1e-12)
        assert np.all(lat.latency_s == pytest.approx(lat.ttft_s + 19 * lat.tpot_s))


def test_tp_allreduce_latency_dominates_small_decode() -> None:
    """At batch 1 the 2 all-reduces per layer are latency-bound: on NCCL's eager ring
    TP8 pays 2 (t-1) hops each; the one-shot kernel two synchronisations."""
    model = get_model("gpt3", "175b")
    cluster = Cluster(get_gpu("a100-80gb"), 1, 8)
    plans = InferencePlanTable.from_plans([InferencePlan(8, 1, 1)])
    ring = latency(model, InferenceWorkload(60, 20), plans, cluster, engine=FT)
    hops = 96 * 2 * 2 * 7 * load_constants().comm_latency_s
    assert ring.decode_tp_comm_s[0] == pytest.approx(hops, rel=0.05)
    one_shot = latency(model, InferenceWorkload(60, 20), plans, cluster, engine=TRT)
    assert one_shot.decode_tp_comm_s[0] == pytest.approx(96 * 2 * 2 * sync_latency_s(),
                                                         rel=0.25)


def test_custom_all_reduce_costs_follow_vllms_measured_kernels() -> None:
    """vLLM's custom all-reduce on 4 H100 (pull request 24111, TP=4, CUDA graphs):
    one stage up to 512 KiB, two stages above, which cost more than the one-stage
    law: 17 / 18 / 27 / 27 / 35 / 43 us at 0.5 / 1 / 1.5 / 2 / 3 / 4 MiB. The
    model prices what vLLM picks (not the cheaper kernel), within 15%."""
    vllm, c = get_engine("vllm"), load_constants()
    nv = get_gpu("h100-80gb").nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    sizes = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0]) * 2**20
    measured = np.array([17.0, 18.0, 27.0, 27.0, 35.0, 43.0]) * 1e-6
    model = tp_allreduce_s(sizes + 1, 4, 4, nv, nv, c.comm_latency_s, vllm)
    assert np.all(np.abs(model / measured - 1.0) < 0.15)
    # Up to the one-stage limit the cost is the one-shot law's; one byte more steps up.
    limit = float(vllm.one_shot_max_bytes)
    below, above = tp_allreduce_s(np.array([limit, limit + 1]), 4, 4, nv, nv,
                                  c.comm_latency_s, vllm)
    assert below == pytest.approx(2 * sync_latency_s() + 3 * limit / nv)
    assert above > 1.3 * below


def test_tp8_beats_tp4_at_batch_1_with_one_shot_all_reduce() -> None:
    """GPT-3 20B decode at batch 1: TP 8 halves the weight stream per GPU; with the
    one-shot kernel its all-reduces cost about what TP 4's do, so TP 8 is faster."""
    model = get_model("gpt3", "20b")
    cluster = Cluster(get_gpu("a100-80gb"), 1, 8)
    tp4 = one(model, InferenceWorkload(128, 64), InferencePlan(4, 1, 1), cluster, TRT)
    tp8 = one(model, InferenceWorkload(128, 64), InferencePlan(8, 1, 1), cluster, TRT)
    assert tp8.tpot_ms < tp4.tpot_ms


def test_pipeline_splits_a_compute_bound_prefill() -> None:
    """GPipe: (m + p - 1) t(b/m) beats p t(b) once prefill is compute-bound."""
    model = get_model("gpt3", "175b")
    cluster = Cluster(get_gpu("a100-80gb"), 8, 8)
    lat = latency(model, InferenceWorkload(60, 20),
                  InferencePlanTable.from_plans([InferencePlan(8, 8, 64)]), cluster, engine=FT)
    assert lat.prefill_microbatches[0] > 1


def test_plan_and_workload_validation() -> None:
    with pytest.raises(InputError, match="invalid tp 0"):
        InferencePlan(0, 1, 1)
    with pytest.raises(InputError, match="--input-len"):
        InferenceWorkload(0, 10)
    with pytest.raises(InputError, match="precision"):
        InferenceWorkload(10, 10, "fp4")
    with pytest.raises(InputError, match="--max-ttft-ms"):
        Limits(max_ttft_ms=-1)


def test_pareto_mask() -> None:
    latency_ms = np.array([1.0, 2.0, 3.0, 2.5])
    throughput = np.array([1.0, 5.0, 4.0, 6.0])
    assert list(pareto_mask(latency_ms, throughput)) == [True, True, False, True]


def test_search_prunes_what_does_not_fit_and_counts_it() -> None:
    model = get_model("gpt3", "175b")
    result = search(model, InferenceWorkload(60, 20), Cluster(get_gpu("a100-80gb"), 4, 8),
                    engine=FT)
    assert result.rejected["does not fit in memory"] > 0
    assert (result.table["memory_gib"] * 2**30 <= 80 * 2**30).all()
    assert not ((result.table.tp == 1) & (result.table.pp == 1)).any()   # 350 GB on one GPU
    assert (result.table.replicas * result.table.gpus_per_replica <= 32).all()
    assert not result.table.duplicated(["tp", "pp", "batch"]).any()
    totals = result.table["tokens_per_s_total"].to_numpy()
    assert np.all(np.diff(totals) <= 1e-9)     # objective throughput: best first
    with pytest.raises(InfeasibleError, match="fits"):
        search(model, InferenceWorkload(60, 20), Cluster(get_gpu("a100-80gb"), 1, 2), engine=FT)


# ---------------------------------------------------------------- published points


SEED_IDS = ("I001", "I002", "I003")


def _points_subset(tmp_path, ids) -> str:
    """The shipped points file cut to ``ids`` (the whole set takes minutes: its
    MLPerf Server rows each search their rate; ``benchmarks/infer_speed.py``)."""
    points = pd.read_csv(default_points_path())
    path = tmp_path / "points.csv"
    points[points["point_id"].isin(ids)].to_csv(path, index=False)
    return str(path)


def test_published_seed_points_keep_their_order(tmp_path) -> None:
    """The three GPT-3 175B DGX A100 points of NeMo's HP tool (benchmarks/published_inference.csv)."""
    result = validate(Path(_points_subset(tmp_path, SEED_IDS)))
    seed = result.table[result.table["source_id"] == "SI01"]
    assert len(seed) == 3 and set(seed["engine"]) == {"fastertransformer"}
    assert result.seed_order_holds
    assert seed["latency_error_pct"].abs().max() < 50


def test_infer_validate_cli_prints_per_engine_figures(capsys, tmp_path) -> None:
    code, out, _ = run_cli(["infer-validate", "--points",
                            _points_subset(tmp_path, SEED_IDS + ("J021", "J092", "J144"))],
                           capsys)
    assert code == 0
    for point in ("I001", "I002", "I003", "J021", "J092", "J144"):
        assert point in out
    assert "fastertransformer  latency" in out and "tensorrt-llm       ttft" in out
    assert "order by throughput per GPU" in out and ": holds" in out
    assert "leave-one-source-out" in out
    # the MLPerf Server row is asked at a searched rate: its load is printed, the others' not
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith(("I0", "J"))}
    assert "load%" in out
    assert lines["J021"].split()[-1].isdigit() and 50 <= int(lines["J021"].split()[-1]) <= 200
    assert lines["J144"].split()[-1][0] in "+-"     # ends at its throughput error


def test_infer_validate_prints_its_targets_and_check_fails_on_a_miss(capsys, tmp_path) -> None:
    """Targets per engine with 10 or more points of a metric (TTFT and throughput
    <= 15%, latency <= 12%) and the seed order; --check exits 1 when one is missed."""
    lmdeploy = tuple(f"J{n:03d}" for n in range(96, 106))      # 10 LMDeploy 0.1 points
    path = _points_subset(tmp_path, SEED_IDS + lmdeploy)
    code, out, _ = run_cli(["infer-validate", "--points", path], capsys)
    assert code == 0
    targets = out[out.index("Targets:"):].splitlines()
    assert any("ttft MAPE lmdeploy-0.1 (10 points)" in line and "(target <= 15%)" in line
               for line in targets)
    assert any("throughput MAPE lmdeploy-0.1 (10 points)" in line for line in targets)
    assert not any("fastertransformer" in line for line in targets)     # 3 points only
    assert any(line.strip().startswith("met") and "seed points' order" in line
               for line in targets)
    missed = [line for line in targets if line.strip().startswith("MISSED")]
    code, _, err = run_cli(["infer-validate", "--points", path, "--check"], capsys)
    assert code == (1 if missed else 0)
    assert ("targets missed" in err) == bool(missed)


def test_a_point_whose_number_cell_is_not_a_number_is_reported_not_read_as_blank(
        capsys, tmp_path) -> None:
    points = pd.read_csv(default_points_path())
    rows = points[points["point_id"].isin(("J158", "J159"))].copy()
    rows["decode_steps"] = rows["decode_steps"].astype(object)
    rows.loc[rows["point_id"] == "J158", "decode_steps"] = "ten"
    path = tmp_path / "points.csv"
    rows.to_csv(path, index=False)
    code, out, err = run_cli(["infer-validate", "--points", str(path)], capsys)
    assert code == 0, err
    assert "1 points asked, 1 could not be" in out
    assert "J158 (SI10): invalid decode_steps 'ten': not a number" in out


@pytest.mark.parametrize("column, value, reason", [
    ("input_len_tokens", -60, "invalid lengths -60 in / "),
    ("batching", "weird", "invalid batching 'weird': allowed are static, continuous"),
])
def test_a_point_with_an_impossible_cell_is_reported(capsys, tmp_path, column, value,
                                                      reason) -> None:
    """Not clamped to one token, nor read as a static batch."""
    points = pd.read_csv(default_points_path())
    rows = points[points["point_id"].isin(("I001", "I003"))].copy()
    rows[column] = rows[column].astype(object)
    rows.loc[rows["point_id"] == "I001", column] = value
    path = tmp_path / "points.csv"
    rows.to_csv(path, index=False)
    code, out, err = run_cli(["infer-validate", "--points", str(path)], capsys)
    assert code == 0, err
    assert "1 points asked, 1 could not be" in out
    assert f"I001 (SI01): {reason}" in out


# ---------------------------------------------------------------- the CLI


def test_infer_cli_ranks_and_writes_every_file(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "autoconfig", *GPT3_ARGS, "--top", "5",
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for header in ("TTFT ms", "TPOT ms", "latency ms", "tok/s/replica", "tok/s/GPU",
                   "tok/s total", "req/s total", "mem GiB/GPU", "Pareto"):
        assert header in proc.stdout
    assert "does not fit in memory" in proc.stdout
    for point in ("I001", "I002", "I003"):          # published points with their errors
        assert point in proc.stdout
    names = {p.name for p in out.iterdir()}
    assert {"infer.csv", "infer.md", "infer.json"} <= names
    table = pd.read_csv(out / "infer.csv")
    assert {"ttft_ms", "tpot_ms", "latency_ms", "tokens_per_s_per_gpu",
            "requests_per_s_per_replica", "tokens_per_s_total", "memory_gib",
            "pareto"} <= set(table.columns)
    assert table["pareto"].any()
    data = json.loads((out / "infer.json").read_text())
    assert data["model"] == "gpt3-175b" and len(data["plans"]) == len(table)
    assert "Pareto front" in (out / "infer.md").read_text()


def test_infer_json_format(tmp_path, capsys) -> None:
    code, out, _ = run_cli(GPT3_ARGS + ["--format", "json", "--top", "3", "--no-plots",
                                        "-o", str(tmp_path)], capsys)
    assert code == 0
    data = json.loads(out)
    assert len(data["plans"]) == 3 and data["objective"] == "throughput"
    assert not (tmp_path / report.PLOT_NAME).exists()


def test_objective_latency_puts_the_fastest_first(tmp_path, capsys) -> None:
    code, out, _ = run_cli(GPT3_ARGS + ["--objective", "latency", "--format", "json",
                                        "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0
    latencies = [p["latency_ms"] for p in json.loads(out)["plans"]]
    assert latencies == sorted(latencies)


@pytest.mark.parametrize("flag,column", [("--max-ttft-ms", "ttft_ms"),
                                         ("--max-tpot-ms", "tpot_ms"),
                                         ("--max-latency-ms", "latency_ms")])
def test_limit_between_two_layouts_prunes_the_slower(tmp_path, capsys, flag, column) -> None:
    code, out, _ = run_cli(GPT3_ARGS + ["--format", "json", "--no-plots", "--top", "1000",
                                        "-o", str(tmp_path / "all")], capsys)
    plans = pd.DataFrame(json.loads(out)["plans"])
    values = np.sort(plans[column].unique())
    bound = float((values[len(values) // 2] + values[len(values) // 2 + 1]) / 2)
    code, out, _ = run_cli(GPT3_ARGS + [flag, f"{bound}", "--format", "json", "--no-plots",
                                        "--top", "1000", "-o", str(tmp_path / "limited")],
                           capsys)
    assert code == 0
    data = json.loads(out)
    kept = pd.DataFrame(data["plans"])
    assert (kept[column] <= bound).all()
    assert len(kept) == int((plans[column] <= bound).sum())
    assert sum(v for k, v in data["rejected"].items() if flag in k) == \
        int((plans[column] > bound).sum())


def test_impossible_limit_is_one_line_naming_the_best(tmp_path, capsys) -> None:
    code, out, err = run_cli(GPT3_ARGS + ["--max-ttft-ms", "1", "-o", str(tmp_path)], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--max-ttft-ms 1" in err and "best TTFT achievable is" in err
    code, _, err = run_cli(GPT3_ARGS + ["--max-tpot-ms", "0.5", "-o", str(tmp_path)], capsys)
    assert code == 2 and "best TPOT achievable is" in err


@pytest.mark.parametrize("args,message", [
    (["--gpus", "8", "--nodes", "1"], "either --gpus"),
    (["--nodes", "1", "--precision", "fp8"], "fp8"),
    (["--nodes", "1", "--top", "0"], "--top"),
])
def test_bad_input_is_one_line(capsys, args, message) -> None:
    code, _, err = run_cli(["infer", "--model", "llama3-8b", "--gpu", "a100-80gb",
                            "--input-len", "10", "--output-len", "5", *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_inline_shape_and_gpus(tmp_path, capsys) -> None:
    code, out, _ = run_cli(["infer", "--layers", "8", "--hidden", "1024", "--heads", "16",
                            "--vocab", "32000", "--swiglu", "--gpu", "h100", "--gpus", "4",
                            "--input-len", "128", "--output-len", "32", "--format", "json",
                            "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0
    assert all(p["replicas"] * p["gpus_per_replica"] <= 4 for p in json.loads(out)["plans"])


def test_plot_failure_never_blocks_the_reports(tmp_path, monkeypatch) -> None:
    def broken(result, path):
        raise RuntimeError("no display")

    monkeypatch.setattr(report, "plot_front", broken)
    result = search(get_model("llama3-8b"), InferenceWorkload(128, 32),
                    Cluster(get_gpu("h100-80gb"), 1, 8))
    files = report.write_report(result, tmp_path, top=5)
    assert "no display" in files["plot_skipped"]
    assert (tmp_path / "infer.csv").exists() and (tmp_path / "infer.md").exists()


def test_plot_is_written_when_matplotlib_is_there(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    result = search(get_model("llama3-8b"), InferenceWorkload(128, 32),
                    Cluster(get_gpu("h100-80gb"), 1, 8))
    files = report.write_report(result, tmp_path, top=5)
    assert files["plot"].stat().st_size > 1000


def _part_sum(lat) -> np.ndarray:
    from autoconfig.inference.latency import TPOT_PARTS
    return sum(getattr(lat.tpot_parts, f"{name}_s") for name in TPOT_PARTS)


@pytest.mark.parametrize("engine, mode", [("fastertransformer", "static"),
                                          ("vllm", "continuous"), ("sglang", "continuous")])
def test_tpot_parts_add_up_to_the_tpot(engine, mode) -> None:
    """The parts a report shows are the model's own terms: over layouts with pipeline
    stages and batches past the CUDA-graph cap they sum to each TPOT, none below 0;
    an engine that runs prompts as forwards of their own (SGLang) has a share of them."""
    model, cluster = get_model("llama3-70b"), Cluster(get_gpu("h100-80gb"), 1, 8)
    plans = InferencePlanTable.from_plans([InferencePlan(tp, pp, b) for tp, pp in
                                           ((8, 1), (4, 2), (2, 4)) for b in (1, 12, 600)])
    lat = latency(model, InferenceWorkload(1024, 128), plans, cluster,
                  engine=get_engine(engine), mode=mode)
    assert _part_sum(lat) == pytest.approx(lat.tpot_s, rel=1e-9)
    from autoconfig.inference.latency import TPOT_PARTS
    assert all(np.all(getattr(lat.tpot_parts, f"{n}_s") >= 0) for n in TPOT_PARTS)
    assert np.any(lat.tpot_parts.pipeline_send_s > 0)
    forwards = lat.tpot_parts.prefill_forwards_s
    assert np.all(forwards > 0) if engine == "sglang" else np.all(forwards == 0)
    from autoconfig.inference.latency import TTFT_PARTS
    ttft = sum(getattr(lat.ttft_parts, f"{name}_s") for name in TTFT_PARTS)
    assert ttft == pytest.approx(lat.ttft_s, rel=1e-9)
    assert all(np.all(getattr(lat.ttft_parts, f"{n}_s") >= 0) for n in TTFT_PARTS)
    waits = lat.ttft_parts.waiting_s
    assert np.all(waits == 0) if mode == "static" else np.all(waits > 0)


def test_ttft_counts_the_decode_step_that_samples_the_first_token() -> None:
    """TurboMind 0.1 prefilled a token short and sampled the first token in the
    next decode step: that step is a part of its TTFT, as it is of no engine
    that samples in the prefill."""
    model, cluster = get_model("llama2-7b"), Cluster(get_gpu("a100-80gb"), 1, 1)
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 16)])
    for name, sampled_late in (("lmdeploy-0.1", True), ("lmdeploy", False)):
        lat = latency(model, InferenceWorkload(2048, 256), plans, cluster,
                      engine=get_engine(name), mode="continuous")
        assert (lat.ttft_parts.first_decode_s[0] > 0) == sampled_late


def test_tpot_parts_show_why_tp8_decodes_slower_on_an_eager_ring() -> None:
    """GPT-3 20B at batch 1 on FasterTransformer: TP 8 halves each GPU's weight
    stream against TP 4, and its 2 x 44 ring all-reduces pay 14 hops where TP 4's
    pay 6; the parts say which wins."""
    model, cluster = get_model("gpt3-20b"), Cluster(get_gpu("a100-80gb"), 1, 8)
    plans = InferencePlanTable.from_plans([InferencePlan(4, 1, 1), InferencePlan(8, 1, 1)])
    parts = latency(model, InferenceWorkload(512, 32), plans, cluster, engine=FT).tpot_parts
    assert parts.gemm_s[1] == pytest.approx(parts.gemm_s[0] / 2, rel=0.15)
    assert parts.tp_allreduce_s[1] / parts.tp_allreduce_s[0] == pytest.approx(14 / 6, rel=0.1)


def test_infer_reports_what_the_best_ttft_and_tpot_are_made_of(capsys, tmp_path) -> None:
    args = ["infer", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "2",
            "--input-len", "512", "--output-len", "64", "--engine", "vllm", "--no-plots"]
    code, out, err = run_cli(args + ["-o", str(tmp_path / "a")], capsys)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("TPOT of #1"))
    assert "GEMMs" in line and "attention" in line
    assert any(x.startswith("TTFT of #1") and "its prompt's steps" in x
               for x in out.splitlines())
    code, out, err = run_cli(args + ["--format", "json", "-o", str(tmp_path / "b")], capsys)
    best = json.loads(out)["plans"][0]
    parts = [v for k, v in best.items() if k.startswith("tpot_") and k != "tpot_ms"]
    assert len(parts) == 9 and sum(parts) == pytest.approx(best["tpot_ms"], rel=1e-6)
    parts = [v for k, v in best.items() if k.startswith("ttft_") and k != "ttft_ms"]
    assert len(parts) == 4 and sum(parts) == pytest.approx(best["ttft_ms"], rel=1e-6)
    # A job's TPOT is simulated step by step: no parts, no line.
    code, out, err = run_cli(args + ["--num-requests", "20", "-o", str(tmp_path / "c")], capsys)
    assert code == 0, err
    assert "TPOT of #1" not in out and "TTFT of #1" not in out


def test_the_report_names_every_part() -> None:
    from autoconfig.inference.latency import TPOT_PARTS, TTFT_PARTS
    assert tuple(report.TPOT_LABELS) == TPOT_PARTS
    assert tuple(report.TTFT_LABELS) == TTFT_PARTS
