"""``autoconfig base`` for encoder-decoder models (T5, mT5): the NeMo launcher's
schedule with its sources, shapes for sizes not in the catalog, and a budget
solve that charges a T5 its own FLOPs per encoder token, not 6N."""

import json
import math

import pytest

from autoconfig.base import config as b
from autoconfig.base import budget as bud
from autoconfig.base import shape
from autoconfig.base.hyperparams import default_global_batch_size
from autoconfig.cli.base_cmd import table_rows
from autoconfig.core.catalog import all_models, get_gpu, get_model
from autoconfig.core.model import hardware_flops_per_token, model_flops_per_token, total_params
from cli_runner import cli, run_cli

# NeMo-Framework-Launcher (commit 26e42fa9) launcher_scripts/conf/training/t5/3b.yaml
# and mt5/11b.yaml: optim lr 0.0001, sched WarmupAnnealing min_lr 0.00001 warmup_ratio
# 0.01, betas [0.9, 0.999], eps 1e-8, weight_decay 0.01, gradient_clip_val 1.0,
# init_method_std 0.015, hidden/attention dropout 0.1, global_batch_size 1920,
# seq_length 512, seq_length_dec 128, max_steps 1066667.
LAUNCHER = {"lr": 1e-4, "min_lr": 1e-5, "lr_decay_style": "linear", "adam_beta1": 0.9,
            "adam_beta2": 0.999, "adam_eps": 1e-8, "weight_decay": 0.01, "clip_grad": 1.0,
            "init_method_std": 0.015, "hidden_dropout": 0.1, "attention_dropout": 0.1,
            "global_batch_size": 1920, "seq_len": 512}
LAUNCHER_STEPS = 1066667
GPT_ONLY = ("GPT-3", "Brown et al.", "Chowdhery", "PaLM", "Kaplan", "Chinchilla", "6 N T")


def size_mode(model: str, size: str | None = None, **kw) -> b.BaseConfig:
    return b.make_base(b.BaseRequest(model=model, size=size, **kw))


def budget(model="t5", gpu="h100", nodes=8, days=10.0, tokens=300e9, **kw) -> b.BaseConfig:
    spec = get_gpu(gpu)
    return b.make_base(b.BaseRequest(model=model, gpu=spec, nodes=nodes,
                                     gpus_per_node=spec.gpus_per_node, days=days, tokens=tokens,
                                     **kw))


# ------------------------------------------------------------------ size mode: catalog sizes

@pytest.mark.parametrize("family,size", [("t5", "3b"), ("mt5", "11b")])
def test_catalog_size_gets_the_launchers_schedule(family, size):
    cfg = size_mode(family, size)
    for key, value in LAUNCHER.items():
        assert getattr(cfg, key) == (value if isinstance(value, str)
                                     else pytest.approx(value, rel=1e-12)), key
    assert cfg.model.decoder_seq_len == 128
    assert cfg.model.encoder_layers == cfg.model.decoder_layers == 24
    # tokens are encoder tokens: samples x 512, as the launcher counts them
    assert cfg.batch_tokens == 1920 * 512
    assert cfg.tokens == pytest.approx(LAUNCHER_STEPS * 1920 * 512, rel=1e-4)
    assert cfg.train_steps == math.ceil(cfg.tokens / (1920 * 512))
    assert cfg.train_steps == pytest.approx(LAUNCHER_STEPS, rel=1e-4)
    # warm-up 1% of the steps, linear decay to min_lr at the last step (WarmupAnnealing)
    assert cfg.lr_warmup_steps == pytest.approx(0.01 * cfg.train_steps, abs=1)
    assert cfg.lr_decay_steps == cfg.train_steps
    # the model trains with that dropout (memory and search count the masks)
    assert cfg.model.hidden_dropout == cfg.model.attention_dropout == 0.1


@pytest.mark.parametrize("family,size", [("t5", "3b"), ("mt5", "11b"), ("t5", "7b")])
def test_every_value_has_a_source_and_none_is_a_gpt_claim(family, size):
    cfg = size_mode(family, size)
    rows = table_rows(cfg)
    assert all(why.strip() for _, _, why in rows), [key for key, _, why in rows if not why]
    shown = {key for key, _, _ in rows}
    assert {"decoder_seq_len", "seq_len", "global_batch_size", "tokens", "train_steps", "lr",
            "min_lr", "lr_warmup_steps", "lr_decay_steps", "hidden_dropout"} <= shown
    why = dict(cfg.rationale)
    for key in b._OPTIMIZER_KEYS + ("tokens", "seq_len", "decoder_seq_len", "global_batch_size",
                                    "train_steps", "flops_formula", "precision"):
        assert why.get(key, "").strip(), key
        assert not any(claim in why[key] for claim in GPT_ONLY), (key, why[key])
    assert "launcher" in why["lr"]
    assert any(word in why["global_batch_size"] for word in ("launcher", "configs/models/"))
    assert "encoder" in why["tokens"] and "encoder" in why["seq_len"]


def test_table_says_samples_and_encoder_tokens():
    rows = {key: value for key, value, _ in table_rows(size_mode("t5", "3b"))}
    assert rows["global_batch_size"] == "1920 samples (983K encoder tokens)"
    assert rows["tokens"].endswith("encoder tokens")
    assert rows["seq_len"] == "512 (encoder)" and rows["decoder_seq_len"] == "128"
    assert rows["shape"].startswith("24 encoder + 24 decoder layers, hidden 2048, 32 heads x 64")


def test_given_tokens_rescale_the_warm_up_as_the_launchers_ratio():
    cfg = size_mode("mt5", "11b", tokens=100e9)
    assert cfg.train_steps == math.ceil(100e9 / (1920 * 512))
    assert cfg.lr_warmup_steps == int(0.01 * cfg.train_steps)
    assert cfg.lr_decay_steps == cfg.train_steps
    assert cfg.lr == 1e-4 and "published" in cfg.why("lr")


def test_compute_is_the_encoder_decoders_own_flops_not_6n():
    cfg = size_mode("t5", "3b", gpu=get_gpu("h100"), nodes=4, gpus_per_node=8, mfu=0.4)
    per_token = model_flops_per_token(cfg.model, 512)
    assert cfg.flops_formula == "FT"
    assert cfg.total_flops == pytest.approx(per_token * cfg.tokens, rel=1e-12)
    assert 0.6 < cfg.total_flops / (6 * cfg.params * cfg.tokens) < 0.66
    assert cfg.days == pytest.approx(cfg.total_flops / (32 * 989e12 * 0.4) / 86400, rel=1e-9)


# ------------------------------------------------------------------ size mode: other sizes

@pytest.mark.parametrize("name", [m.name for m in all_models() if m.family in ("t5", "mt5")])
def test_the_width_table_and_depth_rule_reproduce_every_launcher_size(name):
    """Each launcher size, asked by its exact count, gets back its own shape."""
    model = get_model(name)
    template = shape.family_template(model.family)
    got = shape.encoder_decoder_shape_for_params(total_params(model), template,
                                                 shape.shape_rule())
    fields = ("num_layers", "decoder_layers", "hidden_size", "num_heads", "ffn_hidden_size",
              "kv_channels", "vocab_size", "seq_len", "decoder_seq_len", "mlp_kind")
    assert [getattr(got, f) for f in fields] == [getattr(model, f) for f in fields]


def test_size_not_in_the_catalog_is_scaled_in_the_family_shape():
    cfg = size_mode("t5", "7b")
    m = cfg.model
    assert m.family == "t5" and m.name == f"t5-{m.size_label}"
    assert m.encoder_layers == m.decoder_layers
    # utils.py calculate_model_size_params, 5B <= size < 15B: 4096 / 64 heads / 10240, kv 64
    assert (m.hidden_size, m.num_heads, m.ffn_hidden_size, m.head_dim) == (4096, 64, 10240, 64)
    assert (m.mlp_kind, m.seq_len, m.decoder_seq_len) == ("geglu", 512, 128)
    assert cfg.params == pytest.approx(7e9, rel=0.02)
    # one pair of layers fewer or more lands farther from 7B
    for depth in (m.decoder_layers - 1, m.decoder_layers + 1):
        other = shape.encoder_decoder_shape(shape.family_template("t5"),
                                            shape.width_for(7e9, shape.width_table("t5")), depth)
        assert abs(total_params(other) - 7e9) > abs(cfg.params - 7e9)
    # the launcher's rule, not the GPT-3 table, and no other model's published batch
    assert (cfg.lr, cfg.min_lr, cfg.global_batch_size) == (1e-4, 1e-5, 1920)
    assert "published training batch" not in cfg.why("global_batch_size")
    assert cfg.lr_warmup_steps == int(0.01 * cfg.train_steps)
    # default tokens: the family's published count (every launcher T5 trains ~1.05T)
    assert cfg.tokens == 1066667 * 1920 * 512 and "t5-41b" in cfg.why("tokens")


def test_small_scaled_t5_gets_the_launchers_small_batch():
    m = size_mode("t5", "600m").model
    assert m.hidden_size == 1024 and default_global_batch_size(m, 512) == 2048
    assert default_global_batch_size(size_mode("t5", "7b").model, 512) == 1920


def test_yaml_and_json_keep_the_decoder(tmp_path):
    for cfg in (size_mode("t5", "3b"), size_mode("mt5", "7b"), budget()):
        path = tmp_path / "base.yaml"
        b.write_base_yaml(cfg, path)
        back = b.read_base_yaml(path)
        assert back == cfg
        assert (back.model.decoder_layers, back.model.decoder_seq_len) == (
            cfg.model.decoder_layers, 128)
        assert b.base_from_dict(json.loads(json.dumps(b.base_to_dict(cfg))), "json") == cfg


def test_launch_defaults_for_a_t5_are_the_launchers():
    cfg = b.base_for_model(get_model("t5-220m"))
    assert (cfg.global_batch_size, cfg.lr, cfg.lr_warmup_steps) == (2048, 1e-4, 10000)
    assert cfg.tokens == 1_000_000 * 2048 * 512 and cfg.lr_decay_steps == cfg.train_steps
    assert cfg.total_flops == pytest.approx(model_flops_per_token(cfg.model, 512) * cfg.tokens)


# ------------------------------------------------------------------ budget mode

@pytest.mark.parametrize("family,gpu,nodes,days,tokens", [
    ("t5", "h100", 8, 10, 300e9), ("t5", "a100-80gb", 64, 30, 1e12),
    ("mt5", "b200", 16, 20, 500e9), ("mt5", "h100", 2, 5, 100e9)])
def test_budget_proposes_a_family_shape_whose_flops_fit(family, gpu, nodes, days, tokens):
    cfg = budget(model=family, gpu=gpu, nodes=nodes, days=days, tokens=tokens)
    m = cfg.model
    assert m.family == family and m.is_encoder_decoder and m.encoder_layers == m.decoder_layers
    rate = nodes * get_gpu(gpu).gpus_per_node * cfg.peak_tflops_per_gpu * 1e12 * cfg.utilisation
    budget_flops = days * 86400 * rate
    assert cfg.total_flops == pytest.approx(model_flops_per_token(m, 512) * tokens, rel=1e-12)
    assert cfg.total_flops <= budget_flops and cfg.days <= days
    # the largest: one encoder and decoder layer more breaks the budget or the row's widths
    rows = shape.width_table(family)
    deeper = shape.encoder_decoder_shape(shape.family_template(family),
                                         shape.width_for(cfg.params, rows), m.decoder_layers + 1)
    assert (model_flops_per_token(deeper, 512) * tokens > budget_flops
            or shape.width_for(total_params(deeper), rows) != shape.width_for(cfg.params, rows))
    # a GPT under 6NT gets fewer parameters from the same budget
    assert cfg.params > budget_flops / (6 * tokens)


def test_full_recompute_charges_one_more_forward():
    six = budget(mfu=0.4)
    eight = budget(mfu=0.4, full_recompute=True)
    assert eight.flops_formula == "4FT/3" and eight.utilisation_kind == "hfu"
    assert eight.total_flops == pytest.approx(
        hardware_flops_per_token(eight.model, 512, "full") * eight.tokens, rel=1e-12)
    assert eight.params < six.params


def test_chinchilla_budget_is_said_to_be_a_decoder_only_fit():
    cfg = budget(model="mt5", nodes=32, days=20, tokens=b.CHINCHILLA)
    assert cfg.tokens == pytest.approx(20 * cfg.params)
    assert "decoder-only" in cfg.why("tokens")
    assert cfg.total_flops <= 20 * 86400 * bud.compute_rate(
        get_gpu("h100"), 256, "bf16", False).flops_per_s


def test_budget_beyond_the_launchers_table_takes_its_largest_shape_and_says_so():
    cfg = budget(gpu="gb200", nodes=1000, days=100, tokens=1e12)
    assert cfg.params <= 250e9 and cfg.model.hidden_size == 12288
    assert "stops at 250B" in cfg.why("model")


# ------------------------------------------------------------------ the command line

def test_t5_3b_through_the_command_line():
    proc = cli("base", "--model", "t5", "--size", "3b", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"]["decoder_layers"] == 24 and out["model"]["decoder_seq_len"] == 128
    assert out["training"]["global_batch_size"] == 1920 and out["training"]["seq_len"] == 512
    assert out["optimizer"]["lr"] == 1e-4 and out["optimizer"]["min_lr"] == 1e-5


@pytest.mark.parametrize("args,names", [
    (("--model", "t5", "--size", "300b"), "220m, 3b, 11b, 23b, 41b"),
    (("--model", "mt5", "--size", "1t"), "170m, 390m, 3b, 11b, 23b"),
    (("--model", "tiny-t5", "--size", "1b"), "tiny"),
    (("--model", "t5", "--gpu", "h100", "--nodes", "1", "--days", "0.001", "--tokens", "1t"),
     "smallest t5 shape"),
    (("--model", "t5", "--size", "3x"), "'3x'"),
])
def test_bad_t5_input_is_one_line_and_nonzero(args, names, capsys):
    code, stdout, stderr = run_cli(["base", *args], capsys)
    assert code != 0 and stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0]
    assert "Traceback" not in stderr
