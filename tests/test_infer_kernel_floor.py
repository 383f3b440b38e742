"""The least GPU time of a kernel (heuristics/inference.yaml kernel_gpu_floor_s) in serving steps."""

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.inference import engine as engines
from autoconfig.inference import latency as latency_module
from autoconfig.inference.collectives import kernel_gpu_floor_s
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.search import predict

H100 = Cluster(get_gpu("h100-80gb"), 1, 8)
VLLM = engines.get_engine("vllm")
FT = engines.get_engine("fastertransformer")


def tpot_ms(model, plan, engine, mode, monkeypatch, floor_s=None) -> float:
    if floor_s is not None:
        monkeypatch.setattr(latency_module, "kernel_gpu_floor_s", lambda: floor_s)
    row = predict(model, InferenceWorkload(512, 64), InferencePlanTable.from_plans([plan]), H100,
                  engine=engine, mode=mode).iloc[0]
    return float(row.tpot_ms)


def test_the_floor_is_the_measured_few_microseconds() -> None:
    assert 1e-6 <= kernel_gpu_floor_s() <= 6e-6


def test_small_model_at_batch_one_pays_the_floor_for_every_short_kernel(monkeypatch) -> None:
    """GPT-350M at batch 1 under CUDA graphs: every non-GEMM kernel of a layer costs the
    floor, and GEMMs shorter than it are lengthened to it; no kernel costs more."""
    model = get_model("gpt3", "350m")
    plan = InferencePlan(1, 1, 1)
    floor = kernel_gpu_floor_s()
    with_floor = tpot_ms(model, plan, VLLM, "static", monkeypatch)
    without = tpot_ms(model, plan, VLLM, "static", monkeypatch, floor_s=0.0)
    added_s = (with_floor - without) / 1e3
    others = VLLM.kernels_per_layer - 4 - latency_module.ALLREDUCES_PER_LAYER
    assert added_s >= model.num_layers * others * floor * (1 - 1e-9)
    assert added_s <= model.num_layers * (others + 4) * floor * (1 + 1e-9)
    gpu_s = without / 1e3 - VLLM.step_overhead_s        # the engine's host time apart
    assert added_s / gpu_s > 0.5                     # the step's largest GPU cost


def test_a_large_model_at_large_batch_barely_notices(monkeypatch) -> None:
    """Llama 3 70B at TP 8, 128 sequences: the GEMMs exceed the floor, only the
    few small kernels per layer add it, a few percent of the step."""
    model = get_model("llama3-70b")
    plan = InferencePlan(8, 1, 128)
    with_floor = tpot_ms(model, plan, VLLM, "continuous", monkeypatch)
    without = tpot_ms(model, plan, VLLM, "continuous", monkeypatch, floor_s=0.0)
    others = VLLM.kernels_per_layer - 4 - latency_module.ALLREDUCES_PER_LAYER
    assert (with_floor - without) / 1e3 == pytest.approx(
        model.num_layers * others * kernel_gpu_floor_s(), rel=1e-6)
    assert with_floor / without - 1 < 0.1


def test_the_floor_hides_under_eager_host_launches(monkeypatch) -> None:
    """FasterTransformer launches eagerly (6.4 us a kernel on the host): for a small
    model at batch 1 the host, not the GPU, sets the step, floor or not."""
    model = get_model("gpt3", "350m")
    plan = InferencePlan(1, 1, 1)
    launches_ms = (model.num_layers * FT.kernels_per_layer + 1) * FT.kernel_launch_s * 1e3
    with_floor = tpot_ms(model, plan, FT, "static", monkeypatch)
    assert with_floor == pytest.approx(launches_ms)
    assert tpot_ms(model, plan, FT, "static", monkeypatch, floor_s=0.0) == pytest.approx(
        launches_ms)
