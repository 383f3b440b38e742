"""Encoder-decoder (T5 / mT5) models: shapes, exact counts, FLOPs."""

import dataclasses
import json

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import (ModelSpec, forward_flops_per_token, kind_params,
                                   model_flops_per_token, total_params)
from autoconfig.core.plan import Plan, PlanTable, Workload
from autoconfig.errors import InputError
from autoconfig.training import memory
from autoconfig.training.space import R_ENC_DEC, AxisChoices, enumerate_plans
from autoconfig.training.step_time import step_time
from tests.cli_runner import run_cli

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
    tiny = get_model("tiny-t5")
    for changes in ({}, {"tied_embeddings": False}, {"position_embedding": "relative"},
                    {"mlp_kind": "gelu", "has_bias": False},
                    {"kv_channels": 8, "num_heads": 6, "num_kv_heads": 6}):
        model = dataclasses.replace(tiny, **changes)
        assert count_megatron_t5_params(model) == total_params(model), changes


# ---------------------------------------------------- plan space, memory, time

GIB = 2**30
T5_WORKLOAD = Workload(1920, 512)


def _cluster(nodes=20):
    return Cluster(get_gpu("a100-80gb"), nodes, 8)


def _plan(**kw):
    base = dict(tp=2, pp=1, dp=80, sp=True, mbs=24, recompute="none",
                distributed_optimizer=True)
    return Plan(**{**base, **kw})


def _as_gpt(m):
    """The same layers as one decoder-only stack at the encoder's length: what
    predicting T5 as a GPT of its size would do."""
    return dataclasses.replace(m, name="as-gpt", decoder_layers=0, decoder_seq_len=0)


def test_plan_space_keeps_t5_on_one_pipeline_stage_and_counts_why():
    space = enumerate_plans(get_model("t5", "3b"), T5_WORKLOAD, _cluster())
    assert len(space.plans) > 0
    assert set(space.plans.pp) == {1} and set(space.plans.cp) == {1}
    assert space.rejected[R_ENC_DEC] > 0
    # SP needs both sequence lengths divisible by tp.
    odd = dataclasses.replace(get_model("tiny-t5"), decoder_seq_len=18)
    tiny = enumerate_plans(odd, Workload(16, 64), Cluster(get_gpu("h100"), 1, 4),
                           AxisChoices(tp=(4,), sp="on"))
    assert len(tiny.plans) == 0


def test_estimate_refuses_pipeline_parallel_t5(capsys):
    code, out, err = run_cli(["estimate", "--model", "t5", "--size", "3b", "--nodes", "20",
                              "--tp", "2", "--pp", "2", "--gbs", "1920", "--mbs", "24"], capsys)
    assert code != 0 and "Traceback" not in err
    assert "pretrain_t5.py" in err and len(err.strip().splitlines()) == 1


def test_encoder_and_decoder_memory_add_up_to_the_stage():
    m = get_model("t5", "11b")
    for kw in ({}, {"recompute": "full", "recompute_method": "block", "recompute_num_layers": 4},
               {"recompute": "selective", "sp": False}):
        plans = PlanTable.from_plans([_plan(tp=4, dp=40, **kw)])
        parts = memory.encoder_decoder_memory(m, T5_WORKLOAD, plans)
        whole = memory.allocated_bytes(memory.memory_breakdown(m, T5_WORKLOAD, plans))[0]
        summed = sum(v[0] for part in parts.values() for v in part.values())
        assert summed == pytest.approx(whole, rel=1e-9)
        # Equal layer counts: the decoder's layers hold more weights (cross-attention)
        # but fewer activations (128 tokens against 512).
        assert parts["decoder"]["states"][0] > parts["encoder"]["states"][0]
        assert parts["decoder"]["activations"][0] < parts["encoder"]["activations"][0]


def test_block_recompute_applies_to_each_stack():
    """N layers of block recompute keep only the input of the first N layers of
    the encoder and of the decoder: activations fall with N in both."""
    m = get_model("t5", "3b")
    acts = []
    for n in (0, 6, 12):
        kw = {"recompute": "full", "recompute_method": "block", "recompute_num_layers": n} \
            if n else {}
        parts = memory.encoder_decoder_memory(m, T5_WORKLOAD, PlanTable.from_plans([_plan(**kw)]))
        acts.append((parts["encoder"]["activations"][0], parts["decoder"]["activations"][0]))
    assert acts[0][0] > acts[1][0] > acts[2][0]
    assert acts[0][1] > acts[1][1] > acts[2][1]


def test_cross_attention_is_in_the_step_and_t5_is_not_a_gpt():
    m = get_model("t5", "11b")
    plans = PlanTable.from_plans([_plan(tp=4, dp=40)])
    t5 = step_time(m, T5_WORKLOAD, plans, _cluster())
    gpt = step_time(_as_gpt(m), T5_WORKLOAD, plans, _cluster())
    assert 0 < t5.cross_attention_s[0] < t5.compute_s[0]
    # The decoder runs 128 tokens, not 512: far less compute than the same layers as a GPT.
    assert t5.compute_s[0] < 0.8 * gpt.compute_s[0]
    # Memory: the GPT view stores 512-token activations in all 48 layers.
    t5_mem = memory.memory_breakdown(m, T5_WORKLOAD, plans).activations_bytes[0]
    gpt_mem = memory.memory_breakdown(_as_gpt(m), T5_WORKLOAD, plans).activations_bytes[0]
    assert t5_mem < gpt_mem
    # Model FLOPs count encoder tokens: tokens/s x FLOPs/token = achieved model FLOP/s.
    assert t5.model_tflops_per_gpu[0] == pytest.approx(
        t5.tokens_per_s_per_gpu[0] * model_flops_per_token(m, 512) / 1e12, rel=1e-9)


def test_longer_decoder_sequences_cost_more():
    m = get_model("t5", "3b")
    plans = PlanTable.from_plans([_plan()])
    short = step_time(m, T5_WORKLOAD, plans, _cluster()).step_time_s[0]
    longer = step_time(dataclasses.replace(m, decoder_seq_len=512), T5_WORKLOAD, plans,
                       _cluster()).step_time_s[0]
    assert longer > short


@pytest.mark.parametrize("family,size", [("t5", "3b"), ("mt5", "11b")])
def test_search_ranks_t5_plans_and_names_the_split(family, size, tmp_path, capsys):
    code, out, err = run_cli(["search", "--model", family, "--size", size, "--nodes", "20",
                              "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "encoder 24 layers x 512 tokens, decoder 24 layers x 128 tokens" in out
    assert "T5 has no pp or cp in megatron-core" in out
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["plan"]["pp"] == 1
    assert "cross-attention" in (tmp_path / "report.md").read_text()


def test_estimate_shows_encoder_decoder_memory_and_cross_attention(capsys):
    args = ["estimate", "--model", "t5", "--size", "3b", "--nodes", "20", "--tp", "2", "--sp",
            "--mbs", "24", "--gbs", "1920", "--recompute", "full", "--recompute-method",
            "block", "--recompute-num-layers", "4"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "cross-attention" in out and "encoder (GiB/GPU)" in out and "decoder (GiB/GPU)" in out
    code, out, err = run_cli(args + ["--format", "json"], capsys)
    result = json.loads(out)
    assert set(result["memory_by_stack_gib"]) == {"encoder", "decoder", "embedding and output"}
    assert result["cross_attention_s"] > 0 and result["decoder_seq_len"] == 128


def test_infer_says_what_it_leaves_out(capsys):
    code, _, err = run_cli(["infer", "--model", "t5", "--size", "3b", "--input-len", "512",
                            "--output-len", "128", "--nodes", "1"], capsys)
    assert code != 0 and "encoder-decoder" in err and "Traceback" not in err


def test_catalog_lists_the_ten_sizes(capsys):
    code, out, _ = run_cli(["catalog", "models"], capsys)
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {f"t5-{s}" for s in T5_SIZES} | {f"mt5-{s}" for s in MT5_SIZES} <= names
    line = next(l for l in out.splitlines() if l.startswith("t5-41b "))
    assert "41.19B" in line


def test_validate_reads_t5_rows_by_catalog_name_and_skips_what_estimate_refuses():
    """A published T5 run is described like a user's: the catalog model and the
    plan. One-stage plans are scored; a pipeline-split row is not (estimate
    refuses it: megatron-core trains T5 on one stage)."""
    import csv
    from autoconfig.paths import benchmarks_dir
    from autoconfig.validation.runs import row_to_run
    with open(benchmarks_dir() / "published_runs.csv", newline="") as handle:
        columns = next(csv.reader(handle))
    row = dict.fromkeys(columns, "")
    row.update(record_id="T1", source_id="S18", source_location="test", confidence="A",
               model_name="T5-3B", catalog_model="t5-3b", seq_len="512",
               gpu_type="A100-SXM4-80GB", num_gpus="160", tp="2", pp="1", dp="80",
               micro_batch_size="24", global_batch_size="1920", recompute="full",
               precision="bf16", tokens_per_s_per_gpu="1000")
    run = row_to_run(row)
    assert not run.skip_reason and run.model.is_encoder_decoder
    assert run.model.decoder_seq_len == 128 and run.plan.pp == 1
    split = row_to_run({**row, "pp": "2", "dp": "40"})
    assert "not modelled" in split.skip_reason


def test_capacity_and_sweep_files_take_t5_models(tmp_path, capsys):
    code, out, err = run_cli(["capacity", "--model", "mt5", "--size", "3b", "--gpu", "a100-80gb",
                              "--nodes", "4,20", "--tokens", "100b", "--no-plots", "-o",
                              str(tmp_path / "cap")], capsys)
    assert code == 0, err
    import pandas as pd
    table = pd.read_csv(tmp_path / "cap" / "capacity.csv")
    assert (table["status"] == "ok").all() and len(table) == 2
    sweep = tmp_path / "t5.yaml"
    sweep.write_text("name: t5\nmatrix:\n  model: [{model: t5, size: 3b}, {model: mt5, size: 11b}]\n"
                     "  gpu: [a100-80gb]\n  nodes: [20]\n  mode: [predict]\n")
    code, out, err = run_cli(["sweep", str(sweep), "--no-plots", "-o", str(tmp_path / "sw")],
                             capsys)
    assert code == 0, err
    rows = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert set(rows["status"]) == {"ok"} and len(rows) == 2
