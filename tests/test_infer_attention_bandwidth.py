"""Decode attention reads the KV cache no faster than its SMs keep bytes in flight."""

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import CatalogError
from autoconfig.inference.engine import get_engine
from autoconfig.inference.latency import latency
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from engine_files import load_with_field


def test_the_kernel_measured_on_an_h100_is_bound_by_its_sms_elsewhere() -> None:
    """FA3's paged decode (vLLM, SGLang): 0.55 of an H100's 3.35 TB/s, measured;
    an H200, the same 132 SMs, is held at the same 14 GB/s an SM, not given 55%
    of its 4.8 TB/s; an H20's 78 SMs get less; on Blackwell, where vLLM runs
    other kernels, only the datasheet share applies."""
    vllm = get_engine("vllm")
    h100, h200, h20, b200 = (get_gpu(g) for g in ("h100", "h200", "h20", "b200"))
    assert vllm.decode_attention_bytes_per_s(h100) == pytest.approx(0.55 * 3.35e12)
    assert vllm.decode_attention_bytes_per_s(h200) == pytest.approx(14.0e9 * 132)
    assert vllm.decode_attention_bytes_per_s(h200) < 0.55 * 4.8e12
    assert vllm.decode_attention_bytes_per_s(h20) == pytest.approx(14.0e9 * 78)
    assert vllm.decode_attention_bytes_per_s(b200) == pytest.approx(0.55 * 8e12)
    ft = get_engine("fastertransformer")                  # nothing measured: the share
    assert ft.decode_attention_bytes_per_s(h200) == pytest.approx(0.8 * 4.8e12)


def test_an_h200_decodes_long_contexts_no_faster_than_an_h100_in_that_kernel() -> None:
    """SGLang, Llama 3 70B at TP 4, 256 requests of 3,000 tokens in flight: the
    attention part of a token's time is the same on both GPUs, while the
    weights stream faster on the H200."""
    model = get_model("llama3-70b")
    plans = InferencePlanTable.from_plans([InferencePlan(4, 1, 256)])
    parts = {}
    for gpu in ("h100", "h200"):
        lat = latency(model, InferenceWorkload(2048, 1024), plans,
                      Cluster(get_gpu(gpu), 1, 4), engine=get_engine("sglang"),
                      mode="continuous")
        parts[gpu] = lat.tpot_parts
    assert parts["h200"].attention_s[0] == pytest.approx(parts["h100"].attention_s[0],
                                                         rel=0.01)
    assert parts["h200"].gemm_s[0] < parts["h100"].gemm_s[0]


@pytest.mark.parametrize("value", ["{hopper: -1}", "{hopper: .inf}", "{hopper: true}", "14"])
def test_a_malformed_per_sm_rate_is_refused(tmp_path, monkeypatch, value) -> None:
    with pytest.raises(CatalogError, match="decode_attention_sm_gb_per_s"):
        load_with_field(tmp_path, monkeypatch, "vllm", "decode_attention_sm_gb_per_s", value)
