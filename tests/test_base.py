"""The base-config library: budget solve both ways, shape rule, heuristics,
and the base YAML/JSON round trip."""

import json
import math

import pytest

from autoconfig.base import config as b
from autoconfig.base import budget as bud
from autoconfig.base import hyperparams
from autoconfig.base import shape
from autoconfig.core.catalog import all_gpus, get_gpu, get_model
from autoconfig.errors import CatalogError, InfeasibleError, InputError
from autoconfig.heuristics import load_heuristics, sourced_entry
from autoconfig.core.model import total_params

# Brown et al. 2020, Table 2.1: learning rate and batch (tokens) by size.
GPT3_PAPER = {"126m": (6.0e-4, 0.5e6), "350m": (3.0e-4, 0.5e6), "760m": (2.5e-4, 0.5e6),
              "1.3b": (2.0e-4, 1e6), "2.7b": (1.6e-4, 1e6), "6.7b": (1.2e-4, 2e6),
              "13b": (1.0e-4, 2e6), "175b": (0.6e-4, 3.2e6)}


def budget(gpu="a100-80gb", nodes=128, days=24.0, tokens=300e9, model="gpt3", **kw):
    gpu_spec = get_gpu(gpu)
    return b.make_base(b.BaseRequest(model=model, gpu=gpu_spec, nodes=nodes,
                                     gpus_per_node=gpu_spec.gpus_per_node, days=days,
                                     tokens=tokens, **kw))


# ------------------------------------------------------------------ size mode

def test_gpt3_175b_gets_paper_shape_lr_and_batch():
    cfg = b.make_base(b.BaseRequest(model="gpt3", size="175b"))
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_heads) == (96, 12288, 96)
    assert cfg.params == pytest.approx(174.6e9, rel=5e-3)
    assert cfg.lr == 0.6e-4
    assert cfg.min_lr == pytest.approx(0.6e-5)
    # 3.2M tokens / 2048 = 1562.5: rounded to a multiple of 128 as Narayanan et al. trained it.
    assert cfg.global_batch_size == 1536
    assert cfg.batch_tokens == pytest.approx(3.2e6, rel=0.02)
    assert cfg.days is None


@pytest.mark.parametrize("size", sorted(GPT3_PAPER))
def test_every_gpt3_catalog_size_gets_its_table_row(size):
    lr, batch_tokens = GPT3_PAPER[size]
    params = total_params(get_model("gpt3", size))
    table = hyperparams.gpt3_table()
    assert hyperparams.table_lr(params, table) == lr
    assert hyperparams.table_batch_tokens(params, table) == batch_tokens


def test_size_mode_with_cluster_reports_days_from_the_formula():
    gpu = get_gpu("a100-80gb")
    cfg = b.make_base(b.BaseRequest(model="gpt3", size="175b", gpu=gpu, nodes=128,
                                    gpus_per_node=8, tokens=300e9, mfu=0.4))
    expected = 6 * cfg.params * 300e9 / (1024 * 312e12 * 0.4) / 86400
    assert cfg.days == pytest.approx(expected, rel=1e-12)
    assert cfg.train_steps == math.ceil(300e9 / (1536 * 2048))


def test_narayanan_175b_estimate_with_full_recompute():
    """Narayanan et al. 2021 Sec. 5.1: 175B, 300B tokens, 1024 A100 at 140
    TFLOP/s (counting recompute, 8NT) -> about 34 days."""
    gpu = get_gpu("a100-80gb")
    cfg = b.make_base(b.BaseRequest(model="gpt3", size="175b", gpu=gpu, nodes=128,
                                    gpus_per_node=8, tokens=300e9, tflops_per_gpu=140,
                                    full_recompute=True))
    assert cfg.flops_formula == "8NT"
    assert cfg.utilisation_kind == "hfu"
    assert cfg.days == pytest.approx(34, rel=0.03)


def test_size_not_in_catalog_uses_the_shape_rule_closest_size():
    cfg = b.make_base(b.BaseRequest(model="gpt3", size="30b"))
    assert cfg.params == pytest.approx(30e9, rel=0.01)
    assert cfg.model.mlp_kind == "gelu" and cfg.model.position_embedding == "learned"


def test_default_tokens_in_size_mode_are_chinchilla():
    cfg = b.make_base(b.BaseRequest(model="llama3", size="8b"))
    assert cfg.tokens == pytest.approx(20 * cfg.params)


# ------------------------------------------------------------------ budget mode

def test_budget_solve_is_the_inverse_of_training_days():
    rate = bud.ComputeRate(num_gpus=1024, peak_tflops=312, utilisation=0.36,
                         utilisation_kind="mfu", flops_per_param_token=6)
    for params in (1e9, 7e9, 175e9):
        days = bud.training_days(params, 300e9, rate)
        assert bud.max_params_for_tokens(days, 300e9, rate) == pytest.approx(params, rel=1e-12)
        chin_days = bud.training_days(params, 20 * params, rate)
        assert bud.max_params_chinchilla(chin_days, 20, rate) == pytest.approx(params, rel=1e-12)


@pytest.mark.parametrize("gpu,nodes,days,tokens", [
    ("a100-80gb", 128, 24, 300e9), ("h100-80gb", 256, 30, 2e12), ("b200", 64, 60, 1e12),
    ("a100-80gb", 16, 90, 300e9), ("gb200", 18, 20, 500e9)])
def test_budget_mode_fills_the_budget_without_exceeding_it(gpu, nodes, days, tokens):
    cfg = budget(gpu=gpu, nodes=nodes, days=days, tokens=tokens)
    assert cfg.mode == "budget"
    assert cfg.params == total_params(cfg.model)
    # inverse: the days of this exact model, at the stated formula and MFU
    rate = bud.ComputeRate(num_gpus=cfg.num_gpus, peak_tflops=cfg.peak_tflops_per_gpu,
                         utilisation=cfg.utilisation, utilisation_kind="mfu",
                         flops_per_param_token=6)
    assert cfg.days == pytest.approx(bud.training_days(cfg.params, tokens, rate), rel=1e-12)
    assert cfg.days <= days
    assert cfg.days >= 0.99 * days


def test_budget_mode_size_grows_with_gpus_and_days_and_falls_with_tokens():
    small = budget(nodes=32).params
    assert budget(nodes=128).params > small
    assert budget(nodes=32, days=48).params > small
    assert budget(nodes=32, tokens=600e9).params < small


def test_full_recompute_counts_8nt():
    six = budget(mfu=0.4)
    eight = budget(mfu=0.4, full_recompute=True)
    assert six.flops_formula == "6NT" and eight.flops_formula == "8NT"
    # same utilisation, a third more FLOPs per token: a smaller model fits
    assert eight.params < six.params
    assert eight.params == pytest.approx(six.params * 6 / 8, rel=0.03)


def test_chinchilla_budget():
    cfg = budget(nodes=64, days=30, tokens=b.CHINCHILLA)
    assert cfg.tokens == pytest.approx(20 * cfg.params)
    assert 0.98 * 30 <= cfg.days <= 30


def test_budget_mode_uses_family_architecture():
    llama = budget(gpu="h100-80gb", nodes=64, days=20, tokens=1e12, model="llama3").model
    assert (llama.mlp_kind, llama.norm_kind, llama.position_embedding) == ("swiglu", "rmsnorm",
                                                                          "rope")
    assert llama.num_kv_heads == 8 and not llama.tied_embeddings
    gpt = budget(nodes=64, days=20, tokens=1e12).model
    assert (gpt.mlp_kind, gpt.norm_kind, gpt.position_embedding) == ("gelu", "layernorm", "learned")
    assert gpt.num_kv_heads == gpt.num_heads and gpt.ffn_hidden_size == 4 * gpt.hidden_size


def test_too_small_budget_is_infeasible_with_a_reason():
    with pytest.raises(InfeasibleError, match="parameters"):
        budget(nodes=1, days=0.01, tokens=300e9)


# ------------------------------------------------------------------ shape rule

@pytest.mark.parametrize("family", ["gpt3", "llama3"])
@pytest.mark.parametrize("target", [3e8, 2e9, 13e9, 70e9, 175e9, 1e12])
def test_shape_rule_respects_its_constraints(family, target):
    rule = shape.shape_rule()
    template = shape.family_template(family)
    for at_most in (True, False):
        model = shape.shape_for_params(target, template, rule, at_most=at_most)
        params = total_params(model)
        assert model.head_dim == 128
        assert rule.aspect_min <= model.hidden_size / model.num_layers <= rule.aspect_max
        if at_most:
            assert params <= target
        if target >= 7e9:  # candidates are dense enough to come within the tolerance
            assert abs(params / target - 1) <= rule.fill_tolerance
        if target >= 50e9:  # and to have heads divisible by 8 (TP up to 8) there
            assert model.num_heads % 8 == 0


def test_shape_rule_prefers_pipeline_friendly_depth_within_tolerance():
    rule = shape.shape_rule()
    model = shape.shape_for_params(175e9, shape.family_template("gpt3"), rule)
    assert (model.num_layers, model.hidden_size, model.num_heads) == (96, 12288, 96)


# ------------------------------------------------------------------ heuristics

def test_lr_falls_and_batch_grows_with_model_size():
    table = hyperparams.gpt3_table()
    sizes = [10 ** (8 + i / 20) for i in range(81)]  # 100M to 1T
    lrs = [hyperparams.table_lr(n, table) for n in sizes]
    batches = [hyperparams.table_batch_tokens(n, table) for n in sizes]
    assert all(later <= earlier for earlier, later in zip(lrs, lrs[1:]))
    assert all(later >= earlier for earlier, later in zip(batches, batches[1:]))
    assert lrs[-1] < lrs[0] and batches[-1] > batches[0]
    for seq_len in (2048, 8192):
        seqs = [hyperparams.batch_sequences(t, seq_len, 128) for t in batches]
        assert all(later >= earlier for earlier, later in zip(seqs, seqs[1:]))


def test_loglog_interpolation_is_geometric_between_rows():
    assert hyperparams.interpolate_loglog(10.0, (1.0, 100.0), (4.0, 1.0)) == pytest.approx(2.0)
    assert hyperparams.interpolate_loglog(0.5, (1.0, 100.0), (4.0, 1.0)) == 4.0
    assert hyperparams.interpolate_loglog(1e3, (1.0, 100.0), (4.0, 1.0)) == 1.0


def test_batch_sequences_rounding():
    assert hyperparams.batch_sequences(3.2e6, 2048, 128) == 1536
    assert hyperparams.batch_sequences(0.5e6, 2048, 128) == 256
    assert hyperparams.batch_sequences(0.5e6, 8192, 128) == 64  # not inflated to one granule


def test_init_std_matches_nemo_175b_and_megatron_default():
    assert hyperparams.init_std(12288, 0.4) == pytest.approx(0.006, abs=3e-4)
    assert hyperparams.init_std(768, 0.4) == pytest.approx(0.02, abs=4e-3)


def test_every_catalog_gpu_has_a_sourced_default_efficiency():
    for gpu in all_gpus():
        value = bud.default_utilisation(gpu.name, "bf16", full_recompute=False)
        assert 0 < value.value <= 1 and value.source
        if gpu.peak_fp8_tflops:
            assert 0 < bud.default_utilisation(gpu.name, "fp8", False).value <= 1


@pytest.mark.parametrize("name", ["hyperparameters", "scaling", "efficiency"])
def test_heuristics_files_load(name):
    assert load_heuristics(name)


def test_unsourced_heuristic_is_a_catalog_error():
    with pytest.raises(CatalogError, match="no source"):
        sourced_entry({"lr": {"value": 1e-4}}, "lr", "x.yaml")
    with pytest.raises(CatalogError, match="'value' and 'source'"):
        sourced_entry({"lr": 1e-4}, "lr", "x.yaml")


def test_bad_mfu_is_an_input_error():
    with pytest.raises(InputError, match="--mfu"):
        budget(mfu=1.5)


# ------------------------------------------------------------------ YAML / JSON

@pytest.mark.parametrize("make", [
    lambda: b.make_base(b.BaseRequest(model="gpt3", size="175b")),
    lambda: budget(),
    lambda: budget(gpu="h100-80gb", nodes=64, days=20, tokens=b.CHINCHILLA, model="llama3"),
])
def test_yaml_and_json_round_trip(make, tmp_path):
    cfg = make()
    path = tmp_path / "base.yaml"
    b.write_base_yaml(cfg, path)
    assert b.read_base_yaml(path) == cfg
    as_json = json.loads(json.dumps(b.base_to_dict(cfg)))
    assert b.base_from_dict(as_json, "json") == cfg


def test_read_base_yaml_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(CatalogError, match="malformed YAML"):
        b.read_base_yaml(bad)
    bad.write_text("name: gpt3-175b\n")
    with pytest.raises(CatalogError, match="not an autoconfig base file"):
        b.read_base_yaml(bad)
    data = b.base_to_dict(budget())
    del data["optimizer"]["lr"]
    import yaml
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(CatalogError, match="lr"):
        b.read_base_yaml(bad)
    with pytest.raises(CatalogError, match="cannot read"):
        b.read_base_yaml(tmp_path / "missing.yaml")


# ------------------------------------------------------------------ request resolution

def test_a_specific_model_name_or_file_is_size_mode(tmp_path):
    assert b.request_mode(b.BaseRequest(model="llama3-70b")) == "size"
    assert b.request_mode(b.BaseRequest(model="gpt3")) == "budget"
    model, why = shape.resolve_sized_model("configs/models/gpt3-13b.yaml", None)
    assert model.num_layers == 40 and "file" in why
    with pytest.raises(InputError, match="does not apply"):
        shape.resolve_sized_model("configs/models/gpt3-13b.yaml", "13b")


def test_a_model_name_in_budget_mode_copies_its_family():
    cfg = budget(gpu="h100-80gb", nodes=16, days=10, tokens=1e12, model="llama3-8b")
    assert cfg.model.family == "llama3" and cfg.model.mlp_kind == "swiglu"
    assert cfg.model.vocab_size == 128256 and cfg.seq_len == 8192


def test_parse_tokens():
    assert b.parse_tokens("300b") == 300e9
    assert b.parse_tokens("Chinchilla") == b.CHINCHILLA
    with pytest.raises(InputError, match="'3 trillion'"):
        b.parse_tokens("3 trillion")


def test_published_batch_wins_over_the_gpt3_table() -> None:
    """Llama 2 states 4M tokens (1024 x 4096); the GPT-3 table would say otherwise."""
    cfg = b.make_base(b.BaseRequest(model="llama2", size="7b"))
    assert cfg.global_batch_size == 1024
    assert "published training batch" in dict(cfg.rationale)["global_batch_size"]
    # The published batch is in tokens: a shorter sequence gets more of them.
    other = b.make_base(b.BaseRequest(model="llama2", size="7b", seq_len=2048))
    assert (other.seq_len, other.global_batch_size) == (2048, 2048)


@pytest.mark.parametrize("model, size, tokens", [("gpt3", "1.3b", 100e6), ("gpt3", "175b", 300e6),
                                                 ("llama3", "8b", 200e6)])
def test_a_run_shorter_than_its_warmup_warms_up_below_the_decay(model, size, tokens):
    """Megatron-LM asserts lr_warmup_steps < lr_decay_steps: GPT-3's 375M-token
    warm-up (or a model's published steps) cannot stand in a shorter run."""
    cfg = b.make_base(b.BaseRequest(model=model, size=size, tokens=tokens))
    assert 1 <= cfg.lr_warmup_steps < cfg.lr_decay_steps <= cfg.train_steps
    assert "Megatron-LM asserts warm-up < decay" in dict(cfg.rationale)["lr_warmup_steps"]


def test_a_long_run_keeps_gpt3s_warmup():
    cfg = b.make_base(b.BaseRequest(model="gpt3", size="1.3b", tokens=300e9))
    assert cfg.lr_warmup_steps == 358


def test_budget_mode_keeps_an_moe_templates_leading_dense_layers():
    """DeepSeek-V3's three dense layers stay: the smallest shape has one MoE layer
    after them (a one-layer candidate failed the model's own check)."""
    cfg = budget(gpu="h100-80gb", nodes=1, days=30, tokens=b.CHINCHILLA, model="deepseek-v3")
    assert cfg.model.is_moe
    assert cfg.model.num_layers > cfg.model.moe_first_dense_layers


def test_a_budget_beyond_the_largest_shape_is_infeasible():
    with pytest.raises(InfeasibleError, match="beyond the largest gpt3 shape"):
        budget(gpu="h100-80gb", nodes=1, days=1e9, tokens=300e9)
