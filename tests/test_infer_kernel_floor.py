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
    few small kernels per layer add it, a few percent of the step. The norms and
    the activation take the larger of their traffic and the floor
    (``latency._elementwise_excess_s``), so they add at most the floor each."""
    model = get_model("llama3-70b")
    plan = InferencePlan(8, 1, 128)
    with_floor = tpot_ms(model, plan, VLLM, "continuous", monkeypatch)
    without = tpot_ms(model, plan, VLLM, "continuous", monkeypatch, floor_s=0.0)
    others = VLLM.kernels_per_layer - 4 - latency_module.ALLREDUCES_PER_LAYER
    added_s = (with_floor - without) / 1e3
    floor = kernel_gpu_floor_s()
    assert model.num_layers * (others - 3) * floor * (1 - 1e-6) <= added_s \
        <= model.num_layers * others * floor * (1 + 1e-6)
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


@pytest.mark.parametrize("field, good, value, message", [
    ("kernel_gpu_floor_s", "3.0e-6", "-3.0e-6", "must be seconds >= 0"),
    ("kernel_gpu_floor_s", "3.0e-6", ".inf", "value inf is not a finite number"),
    ("kernel_gpu_floor_s", "3.0e-6", "fast", "is not a number"),
    ("moe_block_extra_kernels", "4", "4.5", "must be a whole number >= 0")])
def test_a_bad_value_is_a_one_line_catalog_error(tmp_path, monkeypatch, field, good, value,
                                                 message) -> None:
    import shutil

    from autoconfig import heuristics
    from autoconfig.errors import CatalogError
    from autoconfig.paths import data_root
    from autoconfig.inference import collectives

    for folder in ("configs", "heuristics"):
        shutil.copytree(data_root() / folder, tmp_path / folder)
    path = tmp_path / "heuristics" / "inference.yaml"
    text = path.read_text()
    path.write_text(text.replace(f"{field}:\n  value: {good}\n", f"{field}:\n  value: {value}\n"))
    assert path.read_text() != text
    monkeypatch.setenv("AUTOCONFIG_HOME", str(tmp_path))
    reader = getattr(collectives, field)
    heuristics.load_heuristics.cache_clear()
    reader.cache_clear()
    try:
        with pytest.raises(CatalogError, match=message) as caught:
            reader()
        assert "inference.yaml" in str(caught.value) and "\n" not in str(caught.value)
    finally:
        monkeypatch.delenv("AUTOCONFIG_HOME")
        heuristics.load_heuristics.cache_clear()
        reader.cache_clear()


def test_an_moe_layer_pays_the_floor_for_its_router_top_k_alignment_and_sum(monkeypatch) -> None:
    """Mixtral 8x7B at batch 1 on TP 8: every MoE layer adds the dense layer's small
    kernels plus moe_block_extra_kernels more at the floor (its grouped expert
    GEMMs stream far more than the floor's worth of weights)."""
    from autoconfig.inference.collectives import moe_block_extra_kernels

    model = get_model("mixtral-8x7b")
    assert model.is_moe and not model.moe_shared_expert_ffn_hidden_size
    plan = InferencePlan(8, 1, 1)
    added_s = (tpot_ms(model, plan, VLLM, "static", monkeypatch)
               - tpot_ms(model, plan, VLLM, "static", monkeypatch, floor_s=0.0)) / 1e3
    small = VLLM.kernels_per_layer - latency_module.COUNTED_GEMMS \
        - latency_module.ALLREDUCES_PER_LAYER
    per_layer = (small + moe_block_extra_kernels()) * kernel_gpu_floor_s()
    assert moe_block_extra_kernels() == 4
    # at most the two attention GEMMs are shorter than the floor on top
    assert model.num_layers * per_layer * (1 - 1e-9) <= added_s
    assert added_s <= model.num_layers * (per_layer + 2 * kernel_gpu_floor_s()) * (1 + 1e-9)
