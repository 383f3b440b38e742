"""Serving attention at the model's own widths: MLA decode in the absorbed form its
latent cache implies, and the projections' outputs at the heads' width."""

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.model import attention_core_flops_per_token
from autoconfig.inference.latency import decode_attention_flops_per_token
from autoconfig.inference.memory import _attention_outputs, kv_bytes_per_token_per_gpu


def test_mla_decode_scores_the_latent_with_every_head():
    m = get_model("deepseek-v3")
    # 2 c a (2 d_c + d_r): 128 heads, kv_lora 512, rope 64.
    assert decode_attention_flops_per_token(m, 1000) == pytest.approx(2 * 1000 * 128 * 1088)
    # 3.4x the expanded count, 2 c a (d_qk + d_v) = 2 c 128 (192 + 128).
    ratio = decode_attention_flops_per_token(m, 1000) / attention_core_flops_per_token(m, 1000)
    assert ratio == pytest.approx(1088 / 320)


def test_other_attention_keeps_the_expanded_count():
    m = get_model("llama3", "70b")
    assert decode_attention_flops_per_token(m, 1000) == attention_core_flops_per_token(m, 1000)


def test_mla_decode_is_compute_bound_where_gqa_decode_is_memory_bound():
    """Per cached token a latent decode does ~480 FLOPs a byte (fp8 cache), above an
    H200's bf16 ridge (~200); a GQA decode a few, far below it."""
    gpu = get_gpu("h200")
    ridge = gpu.peak_bf16_tflops * 1e12 / (gpu.hbm_bandwidth_gb_per_s * 1e9)
    for name, size, bound in (("deepseek-v3", None, "compute"), ("llama3", "70b", "memory")):
        m = get_model(name, size)
        flops = m.num_layers * decode_attention_flops_per_token(m, 1.0)
        nbytes = float(kv_bytes_per_token_per_gpu(m, 1, 1, 1.0))
        assert (flops / nbytes > ridge) == (bound == "compute"), name


def test_activations_hold_the_projections_outputs_at_the_heads_width():
    """GQA: q + 2 kv values a token over tp, q the heads' width (Llama: the hidden
    size; Qwen3-235B-A22B: 64 x 128 = 8192 on a 4096 stream); MLA: its latents whole
    on every GPU, its up projections split."""
    llama = get_model("llama3", "70b")
    assert _attention_outputs(llama, 8.0) == pytest.approx((8192 + 2 * 1024) / 8)
    qwen = get_model("qwen3-235b-a22b")
    assert _attention_outputs(qwen, 4.0) == pytest.approx((8192 + 2 * 4 * 128) / 4)
    ds = get_model("deepseek-v3")
    tp = np.array([1.0, 8.0])
    latents = ds.q_lora_rank + ds.kv_lora_rank + ds.qk_rope_head_dim
    heads = 128 * 192 + 128 * (128 + 128)
    assert np.allclose(_attention_outputs(ds, tp), latents + heads / tp)
