"""Encoder-decoder (T5 / mT5) models: shapes, exact counts, FLOPs."""

import pytest

from autoconfig.core.catalog import get_model
from autoconfig.core.model import (ModelSpec, forward_flops_per_token, kind_params,
                                   model_flops_per_token, total_params)
from autoconfig.errors import InputError

T5_SIZES = ("220m", "3b", "11b", "23b", "41b")
MT5_SIZES = ("170m", "390m", "3b", "11b", "23b")


def _hf_t5(layers: int, hidden: int, ffn: int, heads: int, vocab: int) -> ModelSpec:
    """T5 v1.1 / mT5 as Google trained them: GeGLU, no biases, RMS-style norms,
    relative position bias, untied output layer, 64-wide heads."""
    return ModelSpec(name="hf", num_layers=2 * layers, decoder_layers=layers, hidden_size=hidden,
                     num_heads=heads, num_kv_heads=heads, kv_channels=64, ffn_hidden_size=ffn,
                     vocab_size=vocab, seq_len=512, decoder_seq_len=128, mlp_kind="geglu",
                     norm_kind="rmsnorm", position_embedding="relative", tied_embeddings=False,
                     has_bias=False)


def _independent_count(layers, hidden, ffn, heads, vocab) -> int:
    """Module by module as the T5 v1.1 checkpoints hold them: shared embedding,
    per encoder layer q,k,v,o + wi_0, wi_1, wo + 2 norms, per decoder layer
    that plus cross-attention q,k,v,o and a third norm, relative bias in each
    stack's first layer (32 buckets x heads), two final norms, lm_head."""
    inner = heads * 64
    attn = 4 * hidden * inner
    mlp = 3 * hidden * ffn
    encoder = layers * (attn + mlp + 2 * hidden)
    decoder = layers * (2 * attn + mlp + 3 * hidden)
    return vocab * hidden + encoder + decoder + 2 * 32 * heads + 2 * hidden + vocab * hidden


@pytest.mark.parametrize("shape,published", [
    # Xue et al. 2021 (mT5, arXiv 2010.11934) Sec. 3: Small 300M, Base 580M,
    # Large 1.2B, XL 3.7B, XXL 13B parameters (vocabulary 250,112).
    ((8, 512, 1024, 6), 300e6), ((12, 768, 2048, 12), 580e6), ((24, 1024, 2816, 16), 1.2e9),
    ((24, 2048, 5120, 32), 3.7e9), ((24, 4096, 10240, 64), 13e9)])
def test_mt5_counts_match_the_paper_and_an_independent_count(shape, published) -> None:
    model = _hf_t5(*shape, vocab=250112)
    assert total_params(model) == _independent_count(*shape, vocab=250112)
    # The paper rounds to two significant figures.
    assert total_params(model) == pytest.approx(published, rel=0.03)


def test_t5_v11_counts_match_an_independent_count() -> None:
    for shape in ((8, 512, 1024, 6), (24, 2048, 5120, 32), (24, 4096, 10240, 64)):
        assert total_params(_hf_t5(*shape, vocab=32128)) == _independent_count(*shape, vocab=32128)


@pytest.mark.parametrize("family,size,label", [
    # NeMo-Framework-Launcher auto_configurator/conf/search_config/<family>/<size>.yaml
    # names each launcher size by its parameter count in billions.
    ("t5", "220m", 0.22), ("t5", "3b", 2.8), ("t5", "11b", 11.0), ("t5", "23b", 23.5),
    ("t5", "41b", 41.2), ("mt5", "170m", 0.17), ("mt5", "390m", 0.39), ("mt5", "3b", 3.2),
    ("mt5", "11b", 11.9), ("mt5", "23b", 24.65)])
def test_launcher_sizes_count_as_the_launcher_names_them(family, size, label) -> None:
    model = get_model(family, size)
    assert model.is_encoder_decoder and model.encoder_layers == model.decoder_layers
    assert model.layer_pattern == ("encoder",) * model.encoder_layers + \
        ("decoder",) * model.decoder_layers
    digits = len(str(label).split(".")[-1]) if "." in str(label) else 0
    assert round(total_params(model) / 1e9, max(digits, 1)) == pytest.approx(label, abs=1e-9)


def test_decoder_layer_adds_cross_attention_and_a_norm() -> None:
    m = get_model("t5", "3b")
    h, q = m.hidden_size, m.num_heads * 64
    cross = (h * q + q) + (h * 2 * q + 2 * q) + (q * h + h) + 2 * h
    assert kind_params(m, "decoder") - kind_params(m, "encoder") == cross


def test_flops_count_encoder_and_decoder_tokens_apart() -> None:
    """Per sample: encoder layers over 512 tokens, decoder layers over 128 with
    cross-attention keys and values over the 512 encoder outputs, logits over
    the 128 decoder tokens; per token = per sample / 512 encoder tokens."""
    m = get_model("t5", "11b")
    s, d, h, a, f, v = 512, 128, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.vocab_size
    q = a * 64
    attn_w = 4 * h * q
    mlp_w = 3 * h * f
    enc = s * 2 * (attn_w + mlp_w) + s * 2 * s * a * 128
    dec = (d * 2 * (attn_w + mlp_w) + d * 2 * d * a * 128
           + d * 2 * 2 * h * q + s * 2 * 2 * h * q + d * 2 * s * a * 128)
    per_sample = m.encoder_layers * enc + m.decoder_layers * dec + d * 2 * h * v
    assert forward_flops_per_token(m, s) == pytest.approx(per_sample / s, rel=1e-12)
    assert model_flops_per_token(m, s) == pytest.approx(3 * per_sample / s, rel=1e-12)
    # Far from a GPT of the same size at 512 tokens (6N + attention).
    assert model_flops_per_token(m, s) < 0.7 * 6 * total_params(m)


@pytest.mark.parametrize("fields,message", [
    ({"decoder_seq_len": 128}, "without decoder_layers"),
    ({"decoder_layers": 4}, "below the 4 layers"),
    ({"decoder_layers": 2}, "no decoder_seq_len"),
    ({"position_embedding": "relative"}, "only for encoder-decoder"),
    ({"decoder_layers": 2, "decoder_seq_len": 16, "num_experts": 4, "moe_topk": 1,
      "moe_ffn_hidden_size": 64}, "drop num_experts"),
])
def test_encoder_decoder_fields_are_checked(fields, message) -> None:
    base = dict(name="x", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=4,
                ffn_hidden_size=128, vocab_size=1024, seq_len=64)
    with pytest.raises(InputError, match=message):
        ModelSpec(**{**base, **fields})


def test_megatron_core_builds_exactly_the_counted_parameters() -> None:
    """megatron-core's own T5Model, built on CPU with the local layer specs and
    a real final norm per stack (as the Transformer Engine specs have), holds
    exactly ``total_params`` parameters for each variant of the layer kinds."""
    pytest.importorskip("megatron.core")
    from tests.t5_build import count_megatron_t5_params
    from dataclasses import replace
    tiny = get_model("tiny-t5")
    for changes in ({}, {"tied_embeddings": False}, {"position_embedding": "relative"},
                    {"mlp_kind": "gelu", "has_bias": False},
                    {"kv_channels": 8, "num_heads": 6, "num_kv_heads": 6}):
        model = replace(tiny, **changes)
        assert count_megatron_t5_params(model) == total_params(model), changes
