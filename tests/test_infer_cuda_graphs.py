"""Which steps an engine replays as CUDA graphs: SGLang captures decode batches up
to ``cuda_graph_max_bs`` and runs larger ones, and every prefill, eagerly, each
kernel paying its Python dispatch (``--cuda-graph-max-batch``)."""

import dataclasses
import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import Job
from autoconfig.inference.latency import StepLoad, stage_seconds
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.search import Pins, search
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

SGLANG = engines.get_engine("sglang")
MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)
WORKLOAD = InferenceWorkload(128, 128, "bf16")


def _step_s(engine, decode_seqs, prefill_tokens=0.0):
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 1, 1)])
    load = StepLoad(decode_seqs=np.array([[float(decode_seqs)]]), decode_context=256.0,
                    prefill_tokens=np.array([[float(prefill_tokens)]]), prefill_context=64.0,
                    logits_rows=np.array([[float(decode_seqs) + (prefill_tokens > 0)]]))
    seconds, _ = stage_seconds(MODEL, WORKLOAD, plans, CLUSTER, load_constants(), engine, load)
    return float(seconds[0, 0])


def _launches_s(engine, per_kernel_s):
    return (MODEL.num_layers * engine.kernels_for(MODEL) + 1) * per_kernel_s


def test_sglang_replays_decode_batches_up_to_its_cap_and_launches_the_rest_eagerly():
    assert SGLANG.graph_steps == (256, 512, False)
    assert SGLANG.graph_max_seqs(np.array([1, 2, 4, 8])).tolist() == [256, 256, 512, 512]
    tp1 = np.ones(4)
    per_kernel = SGLANG.launch_s(tp1, np.array([1, 256, 257, 8]), np.array([0, 0, 0, 512]))
    assert per_kernel.tolist() == [SGLANG.kernel_launch_s] * 2 + [SGLANG.eager_launch_s] * 2
    assert SGLANG.eager_launch_s > 30 * SGLANG.kernel_launch_s
    # A batch of 8 decodes in a few ms under a graph; eagerly its 32 x 10 + 1 launches
    # take 10.6 ms of host time, which the step cannot beat.
    capped = engines.with_cuda_graph_max_batch(SGLANG, 4)
    graphed, eager = _step_s(SGLANG, 8), _step_s(capped, 8)
    assert graphed < _launches_s(SGLANG, SGLANG.eager_launch_s) < eager * 1.0001
    assert eager == pytest.approx(_launches_s(SGLANG, SGLANG.eager_launch_s))
    # a prefill runs eagerly whatever the cap
    assert _step_s(SGLANG, 0, 64) >= _launches_s(SGLANG, SGLANG.eager_launch_s) * 0.9999


def test_an_averaged_step_launches_eagerly_only_in_its_share_of_prefilling_steps():
    # Steady state averages the prompts over the decode steps: 8 in flight with
    # 128-token outputs start a prompt every 16 steps, so 1 step in 16 runs eagerly.
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 8, 1)])

    def step_s(share):
        load = StepLoad(decode_seqs=np.array([[8.0]]), decode_context=256.0,
                        prefill_tokens=np.array([[8.0]]), prefill_context=64.0,
                        logits_rows=np.array([[8.0]]), prefill_step_share=share)
        return float(stage_seconds(MODEL, WORKLOAD, plans, CLUSTER, load_constants(), SGLANG,
                                   load)[0][0, 0])
    eager, graph = SGLANG.eager_launch_s, SGLANG.kernel_launch_s
    assert step_s(None) == step_s(1.0) == pytest.approx(
        _launches_s(SGLANG, eager))
    # averaged, the launches (0.7 ms) hide under the 8 decodes' GPU time, as with none
    averaged = _launches_s(SGLANG, eager / 16 + graph * 15 / 16)
    assert averaged < step_s(0.0) == step_s(1 / 16) < 0.6 * step_s(1.0)


def test_engines_without_a_graph_batch_keep_one_launch_path():
    trt, ft = engines.get_engine("tensorrt-llm"), engines.get_engine("fastertransformer")
    assert trt.graph_steps is None and ft.graph_steps is None
    assert trt.launch_s(np.ones(2), np.array([1, 4096]), np.array([0, 8192])).tolist() == \
        [trt.kernel_launch_s] * 2
    assert ft.launch_s(np.ones(1), np.array([1]), np.array([0])).tolist() == [ft.eager_launch_s]
    assert ft.kernel_launch_s == ft.eager_launch_s      # no graphs: the eager figure
    # an engine without graphs launches at kernel_launch_s, what a fit of it varies
    # (benchmarks/fit_worker_engine.py)
    refit = dataclasses.replace(ft, kernel_launch_s=4e-5)
    assert refit.launch_s(np.ones(1), np.array([1]), np.array([512])).tolist() == [4e-5]
    for engine in (trt, ft):
        with pytest.raises(InputError, match="invalid --cuda-graph-max-batch 16: engine "):
            engines.with_cuda_graph_max_batch(engine, 16)
    for bad in (0, -3, 1.5, True):
        with pytest.raises(InputError, match="must be an integer from 1 to"):
            engines.with_cuda_graph_max_batch(SGLANG, bad)
    assert engines.with_cuda_graph_max_batch(SGLANG, None) is SGLANG
    assert engines.with_cuda_graph_max_batch(SGLANG, 160).graph_steps == (160, 160, False)


def test_the_memory_reserve_follows_the_graph_batch():
    # SGLang keeps 2 MiB per captured sequence out of its static share: capturing
    # 160 instead of 512 at TP 4 frees (512 - 160) x 2 MiB for the KV pool.
    rule = SGLANG.kv_pool
    total = 80 * 2**30
    default = rule.share_of(total, 8192, 4, 1, SGLANG.graph_max_seqs(4))
    smaller = engines.with_cuda_graph_max_batch(SGLANG, 160)
    assert rule.share_of(total, 8192, 4, 1, smaller.graph_max_seqs(4)) - default == \
        pytest.approx(352 * 2 * 2**20 / total)


def test_a_rate_that_pushes_the_batch_past_the_cap_slows_every_request():
    # 70B at TP 4 on H200 at 8 requests/s of 1K/1K: with graphs to 512 the running
    # batch stays under the cap; captured to 160 (SGLang 0.3-0.4) the batch crosses
    # it, eager steps lengthen every request's stay and the batch grows further
    # (sglang issue #33483).
    model, cluster = get_model("llama3-70b"), Cluster(get_gpu("h200"), 1, 4)
    workload = InferenceWorkload(510, 508, "bf16", 295.6, 295.9, "uniform")
    engine = engines.with_kv_memory_fraction(SGLANG, 0.85)
    rows = [search(model, workload, cluster, engine=e, mode="continuous",
                   pins=Pins((4,), (1,)), job=Job(2400, None, 8.0)).table.iloc[0]
            for e in (engine, engines.with_cuda_graph_max_batch(engine, 160))]
    assert rows[1].tpot_ms > 1.2 * rows[0].tpot_ms
    assert rows[1].ttft_ms > rows[0].ttft_ms


def test_the_cli_takes_the_cap_and_says_which_steps_replay(tmp_path, capsys):
    base = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
            "--tp", "1", "--pp", "1", "--input-len", "256", "--output-len", "64",
            "--engine", "sglang", "--concurrency", "32", "--no-plots"]
    code, text, err = run_cli(base + ["--format", "json", "--cuda-graph-max-batch", "16",
                                      "-o", str(tmp_path / "a")], capsys)
    assert code == 0, err
    data = json.loads(text)
    assert data["cuda_graph_max_decode_seqs"] == [16, 16]
    eager_tpot = data["plans"][0]["tpot_ms"]
    code, text, err = run_cli(base + ["--format", "json", "-o", str(tmp_path / "b")], capsys)
    assert code == 0, err
    assert json.loads(text)["cuda_graph_max_decode_seqs"] == [256, 512]
    assert json.loads(text)["plans"][0]["tpot_ms"] < eager_tpot
    code, text, err = run_cli(base + ["-o", str(tmp_path / "c")], capsys)
    assert "decode batches up to 256 (512 from TP 4) replay CUDA graphs" in text + err
    code, _, err = run_cli(["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                            "--gpus", "1", "--input-len", "256", "--output-len", "64",
                            "--engine", "vllm", "--cuda-graph-max-batch", "64", "--no-plots",
                            "-o", str(tmp_path / "d")], capsys)
    assert code != 0 and "--cuda-graph-max-batch 64" in err \
        and len(err.strip().splitlines()) == 1


def test_a_concurrency_past_the_cap_is_pointed_out(tmp_path, capsys):
    base = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
            "--tp", "1", "--pp", "1", "--input-len", "256", "--output-len", "256",
            "--engine", "sglang", "--no-plots"]
    code, text, err = run_cli(base + ["--concurrency", "300", "-o", str(tmp_path / "a")], capsys)
    assert code == 0, err
    assert "note: the best layout decodes 300 requests a step, past the 256 that sglang " \
           "replays as a CUDA graph" in text
    assert "past the 256" in (tmp_path / "a" / "infer.md").read_text()
    for extra in (["--concurrency", "200"], ["--concurrency", "300", "--cuda-graph-max-batch",
                                             "512"]):
        code, text, err = run_cli(base + extra + ["-o", str(tmp_path / "b")], capsys)
        assert code == 0 and "CUDA graph:" not in text and "past the" not in text
