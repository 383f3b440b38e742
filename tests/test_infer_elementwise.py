"""The memory-bound passes beside the GEMMs of a serving step: two residual-add +
norm kernels and the MLP's activation move every token's activations through HBM
(``latency._elementwise_excess_s``)."""

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.inference import engine as engines
from autoconfig.inference import latency
from autoconfig.inference.collectives import kernel_gpu_floor_s
from autoconfig.inference.latency import StepLoad, stage_seconds
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.training.step_time import load_constants

MODEL = get_model("llama3-70b")
GPU = get_gpu("h200")
C = load_constants()
PER_VALUE = 2 / (GPU.hbm_bandwidth_gb_per_s * 1e9 * C.hbm_efficiency)


def test_a_prompt_moves_its_activations_through_the_norms_and_the_activation():
    # 500 prompt tokens of Llama 3 70B at TP 4: 2 x 4h values a token through the
    # norms and 3 x 28,672 / 4 through SwiGLU's gated product, each kernel at least
    # the GPU floor (already counted), per layer.
    h, f, floor = MODEL.hidden_size, MODEL.ffn_hidden_size, kernel_gpu_floor_s()
    norm = 4 * h * 500 * PER_VALUE
    act = 3 * f / 4 * 500 * PER_VALUE
    got = latency._elementwise_excess_s(MODEL, 4.0, 500.0, PER_VALUE)
    assert got == pytest.approx(2 * (norm - floor) + (act - floor))
    assert MODEL.num_layers * (got + 3 * floor) == pytest.approx(1.8e-3, rel=0.02)
    # a decode of a few sequences moves KBs: the floor is their time, nothing more
    assert latency._elementwise_excess_s(MODEL, 4.0, 4.0, PER_VALUE) == 0.0
    # GELU reads and writes f / tp; an MoE layer's activation covers its top-k experts
    gpt = get_model("gpt3", "175b")
    assert latency._elementwise_excess_s(gpt, 8.0, 1000.0, PER_VALUE) == pytest.approx(
        2 * (4 * 12288 * 1000 * PER_VALUE - floor)
        + (2 * 4 * 12288 / 8 * 1000 * PER_VALUE - floor))
    moe = get_model("mixtral-8x7b")
    routed = moe.moe_topk * moe.moe_ffn_hidden_size
    assert latency._elementwise_excess_s(moe, 1.0, 2000.0, PER_VALUE) == pytest.approx(
        2 * (4 * moe.hidden_size * 2000 * PER_VALUE - floor)
        + (3 * routed * 2000 * PER_VALUE - floor))


def test_the_step_adds_the_passes_in_every_layer(monkeypatch):
    plans = InferencePlanTable.from_plans([InferencePlan(4, 1, 1, 1)])
    load = StepLoad(decode_seqs=np.array([[0.0]]), decode_context=0.0,
                    prefill_tokens=np.array([[500.0]]), prefill_context=250.0,
                    logits_rows=np.array([[1.0]]))
    workload = InferenceWorkload(500, 64, "bf16")
    cluster = Cluster(GPU, 1, 4)
    engine = engines.get_engine("tensorrt-llm")
    with_passes = stage_seconds(MODEL, workload, plans, cluster, C, engine, load)[0][0, 0]
    excess = latency._elementwise_excess_s
    monkeypatch.setattr(latency, "_elementwise_excess_s", lambda *args: 0.0)
    without = stage_seconds(MODEL, workload, plans, cluster, C, engine, load)[0][0, 0]
    assert with_passes - without == pytest.approx(
        MODEL.num_layers * excess(MODEL, 4.0, 500.0, PER_VALUE))
    assert 0.015 < (with_passes - without) / without < 0.04
