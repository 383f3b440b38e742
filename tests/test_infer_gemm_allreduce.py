"""TensorRT-LLM's fused row-parallel GEMM + all-reduce (``gemm_allreduce_plugin``,
``infer --gemm-allreduce-fusion``): each all-reduce hides under its GEMM where
the TP group sits in one NVLink domain of a GPU the kernel is built for."""

import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.latency import StepLoad, stage_seconds
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

MODEL = get_model("llama3-405b")
WORKLOAD = InferenceWorkload(9428, 685, "fp8")


def _step(gpu: str, tp: int, fused: bool, decode=0, prefill=2560, nodes=1):
    engine = engines.configured("tensorrt-llm", gemm_allreduce_fusion=fused)
    plans = InferencePlanTable.from_plans([InferencePlan(tp, 1, 64, 1)])
    one = np.array([[1.0]])
    step, comm = stage_seconds(MODEL, WORKLOAD, plans, Cluster(get_gpu(gpu), nodes, 8),
                               load_constants(), engine,
                               StepLoad(decode_seqs=decode * one, decode_context=4714 * one,
                                        prefill_tokens=prefill * one, prefill_context=4714.0,
                                        logits_rows=(decode + 1) * one))
    return float(step[0, 0]), float(comm[0, 0])


def test_fusion_hides_the_all_reduces_under_their_gemms_on_hopper() -> None:
    # A 2,560-token chunk of Llama 3.1 405B at TP 8 on H200 (MLPerf v5.1's Server
    # setting): 84 MB all-reduces, two a layer, each shorter than its GEMM.
    plain_step, plain_comm = _step("h200", 8, False)
    fused_step, fused_comm = _step("h200", 8, True)
    assert fused_comm < 0.5 * plain_comm
    assert plain_step - fused_step == pytest.approx(plain_comm - fused_comm, rel=1e-9)
    assert fused_step > 0.5 * plain_step                  # the GEMMs still run
    # a decode step's all-reduces are small: little to hide, never a gain beyond them
    d_plain, d_comm = _step("h200", 8, False, decode=16, prefill=0)
    d_fused, _ = _step("h200", 8, True, decode=16, prefill=0)
    assert 0 <= d_plain - d_fused <= d_comm


def test_fusion_needs_a_supported_gpu_one_domain_and_tp() -> None:
    assert _step("a100-80gb", 8, True) == _step("a100-80gb", 8, False)   # no SM90 kernel
    assert _step("h200", 1, True) == _step("h200", 1, False)             # nothing to reduce
    # TP 16 over two 8-GPU NVLink domains: NCCL's hierarchical ring, not the switch
    assert _step("h200", 16, True, nodes=2) == _step("h200", 16, False, nodes=2)


def test_only_an_engine_with_the_kernel_takes_the_setting(tmp_path, capsys) -> None:
    assert engines.get_engine("tensorrt-llm").gemm_allreduce_fusion is False
    assert engines.get_engine("vllm").gemm_allreduce_fusion is None
    with pytest.raises(InputError, match="engine vllm has no fused GEMM"):
        engines.configured("vllm", gemm_allreduce_fusion=True)
    base = ["infer", "--model", "llama3", "--size", "405b", "--gpu", "h200", "--gpus", "8",
            "--tp", "8", "--pp", "1", "--precision", "fp8", "--input-len", "2048",
            "--output-len", "128", "--concurrency", "16", "--no-plots", "--format", "json"]
    tpot = {}
    for flag in ("--gemm-allreduce-fusion", "--no-gemm-allreduce-fusion"):
        code, out, err = run_cli(base + [flag, "-o", str(tmp_path / flag)], capsys)
        assert code == 0, err
        tpot[flag] = json.loads(out)["plans"][0]["tpot_ms"]
    assert tpot["--gemm-allreduce-fusion"] < tpot["--no-gemm-allreduce-fusion"]
    code, out, err = run_cli(["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                              "--gpus", "1", "--engine", "vllm", "--input-len", "128",
                              "--output-len", "128", "--gemm-allreduce-fusion", "--no-plots",
                              "-o", str(tmp_path / "v")], capsys)
    assert code != 0 and "engine vllm has no fused GEMM" in err and "Traceback" not in err
