"""The engine file of what the inference profiling worker runs
(``heuristics/engines/megatron-core-static.yaml``): its operator count is the one
``autoconfig.profiling.host_ops`` counts on the worker's own decode step, and
unfused attention's score traffic is priced as its docstring derives it."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.inference import engine as engines
from autoconfig.inference.latency import StepLoad, stage_seconds
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.profiling.inference_sweep import WORKER_ENGINE_NAME
from autoconfig.training.step_time import load_constants

WORKER = engines.get_engine(WORKER_ENGINE_NAME)


def test_the_worker_engine_describes_a_static_eager_unfused_path() -> None:
    assert WORKER.batching == "static" and not WORKER.cuda_graphs
    assert WORKER.kv_cache == "contiguous" and WORKER.attention_score_bytes > 0
    # every other engine runs fused attention: no score traffic
    others = [engines.get_engine(n) for n in engines.names() if n != WORKER_ENGINE_NAME]
    assert others and all(e.attention_score_bytes == 0 for e in others)


def test_unfused_scores_cost_their_bytes_at_hbm_speed() -> None:
    model, gpu = get_model("gpt3", "1.3b"), get_gpu("h200")
    cluster, c = Cluster(gpu, 1, 1), load_constants()
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 32, 1)])
    workload = InferenceWorkload(512, 64, "bf16")
    load = StepLoad(decode_seqs=np.array([[0.0]]), decode_context=0.0,
                    prefill_tokens=np.array([[32 * 512.0]]), prefill_context=256.0,
                    logits_rows=np.array([[32.0]]))
    fused = dataclasses.replace(WORKER, attention_score_bytes=0.0)
    with_scores = stage_seconds(model, workload, plans, cluster, c, WORKER, load)[0][0, 0]
    without = stage_seconds(model, workload, plans, cluster, c, fused, load)[0][0, 0]
    # 32 prompts x 512 x 512 scores a head, 16 heads, 24 layers
    scores = 32 * 512 * 512 * model.num_heads * model.num_layers
    expected = scores * WORKER.attention_score_bytes / (
        gpu.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency)
    assert with_scores - without == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("model, size", [("gpt3", "1.3b"), ("llama3", "8b")])
def test_the_operator_count_is_the_worker_decode_steps(model, size) -> None:
    """A GPT-3 layer is the file's base count; a Llama layer (rotary, SwiGLU,
    GQA, no biases) the base plus each of its features' counts."""
    pytest.importorskip("megatron.core")
    out = subprocess.run([sys.executable, "-m", "autoconfig.profiling.host_ops", "--model",
                          model, "--size", size],
                         capture_output=True, text=True, timeout=300, check=True)
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["per_layer"] == WORKER.kernels_for(get_model(model, size))
    assert counts["syncs_per_layer"] == 1 and counts["per_layer_views"] > 0


def test_feature_counts_need_known_features(tmp_path) -> None:
    from autoconfig.errors import CatalogError
    from autoconfig.inference.engine import _feature_kernels
    assert _feature_kernels({"rope": 3}, tmp_path) == (("rope", 3),)
    for bad in ({"alibi": 3}, {"rope": 2.5}, {"rope": True}, [1]):
        with pytest.raises(CatalogError, match="feature_kernels_per_layer"):
            _feature_kernels(bad, tmp_path)
    assert engines.get_engine("vllm").feature_kernels == ()


@pytest.mark.parametrize("tool", ["host_ops", "saved_activations"])
def test_the_measuring_tools_refuse_a_bad_model_in_one_line(tool) -> None:
    out = subprocess.run([sys.executable, "-m", f"autoconfig.profiling.{tool}", "--model",
                          "no-such-model"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert "no-such-model" in out.stderr


def test_an_moe_layer_count_is_the_worker_decode_steps() -> None:
    """An MoE layer of the worker dispatches the dense layer's operators, the
    file's extra ones (router, dispatcher) and its count per local expert: the
    experts run one after another, every one called."""
    pytest.importorskip("megatron.core")
    out = subprocess.run([sys.executable, "-m", "autoconfig.profiling.host_ops", "--model",
                          "tiny-moe"], capture_output=True, text=True, timeout=300, check=True)
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    extra, per_expert, _ = WORKER.moe_kernels
    assert counts["per_local_expert"] == per_expert
    assert counts["moe_fixed"] == WORKER.kernels_for(get_model("tiny-moe")) + extra
    assert counts["per_layer"] == counts["moe_fixed"] + 4 * per_expert   # 4 experts counted


def _decode_step_s(model, ep: int = 1) -> float:
    plans = InferencePlanTable.from_plans([InferencePlan(ep, 1, 1, 1, ep)])
    load = StepLoad(decode_seqs=np.array([[1.0]]), decode_context=128.0,
                    prefill_tokens=np.array([[0.0]]), prefill_context=0.0,
                    logits_rows=np.array([[1.0]]))
    return stage_seconds(model, InferenceWorkload(128, 8, "bf16"), plans,
                         Cluster(get_gpu("h200"), 1, max(ep, 1)), load_constants(), WORKER,
                         load)[0][0, 0]


def test_the_worker_pays_each_local_experts_operators_on_the_host() -> None:
    """At batch 1 the worker's step is its host's: every MoE layer launches
    the dense count, the extra and each local expert's operators at their host
    share; twice the experts cost one more expert loop, EP 2 halves it."""
    model = get_model("qwen3-30b-a3b")
    extra, per_expert, share = WORKER.moe_kernels
    layer = WORKER.kernels_for(model) + extra + per_expert * share * model.num_experts
    step = _decode_step_s(model)
    assert step == pytest.approx((model.num_layers * layer + 1) * WORKER.kernel_launch_s)
    doubled = _decode_step_s(dataclasses.replace(model, num_experts=2 * model.num_experts))
    loop = model.num_layers * per_expert * share * model.num_experts * WORKER.kernel_launch_s
    assert doubled - step == pytest.approx(loop)
    assert step - _decode_step_s(model, ep=2) == pytest.approx(loop / 2)
    # an engine whose MoE kernels are fused counts the layer as a dense one
    vllm = engines.get_engine("vllm")
    assert vllm.moe_kernels == (0, 0, 1.0)
    assert vllm.moe_layer_kernels(model, 128) == vllm.kernels_for(model)


def test_moe_counts_need_integers_and_a_share(tmp_path) -> None:
    from autoconfig.errors import CatalogError
    from autoconfig.inference.engine import _moe_kernels
    assert _moe_kernels({"extra": 3, "per_local_expert": 2, "expert_op_host_fraction": 0.5},
                        tmp_path) == (3, 2, 0.5)
    for bad in ({"extra": 3, "per_local_expert": 2},
                {"extra": -1, "per_local_expert": 2, "expert_op_host_fraction": 0.5},
                {"extra": 3, "per_local_expert": 2.5, "expert_op_host_fraction": 0.5},
                {"extra": 3, "per_local_expert": 2, "expert_op_host_fraction": 0},
                {"extra": 3, "per_local_expert": 2, "expert_op_host_fraction": True}):
        with pytest.raises(CatalogError, match="moe_kernels_per_layer"):
            _moe_kernels(bad, tmp_path)
