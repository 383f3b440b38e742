"""Encoder-decoder (T5, mT5) launch files against the tools that read them.

Megatron-LM: pretrain_t5.py's arguments parse with the recorded core_v0.16.1
parser (tests/data/megatron_lm_args.json, as test_launch_megatron.py) and pass
the T5 rules of its validate_args; megatron-core's TransformerConfig is built
from them as core_transformer_config_from_args does, and for the tiny T5 the
model pretrain_t5.py's model_provider builds from them is built on CPU,
counted and run forward and backward. NeMo 1: the overrides compose with
Hydra's rules against megatron_t5_config.yaml with its
megatron_model_base_config.yaml defaults (both recorded in tests/data with
their commit), and megatron-core's TransformerConfig is built from the
composed config as NeMo's megatron-core T5 builds it. Megatron-Bridge has no
T5 recipe. What a target cannot build gets no file and a one-line reason.
"""

import argparse
import copy
import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import total_params
from autoconfig.core.plan import Plan, Workload
from autoconfig.launch import bridge, megatron_lm, nemo1
from autoconfig.launch.encdec import SENTINEL_TOKENS
from autoconfig.launch.files import launch_document, launch_texts
from autoconfig.launch.megatron_lm import megatron_args, megatron_args_script
from autoconfig.launch.nemo1 import nemo1_overrides, nemo1_text
from autoconfig.launch.sbatch import render_sbatch
from autoconfig.launch.spec import launch_spec
from launch_cases import DATA, T5_CASES, case_spec
from test_launch_megatron import parse, transformer_config
from test_launch_nemo import MISSING, _get, compose, nemo_validated_fusion

TESTS = Path(__file__).resolve().parent
NEMO_T5_CASES = sorted(n for n in T5_CASES if nemo1.not_written_reason(case_spec(n)) is None)
POSITIONS = {"learned": "learned_absolute", "relative": "relative", "rope": "rope"}


def validate_t5_args(ns: argparse.Namespace) -> argparse.Namespace:
    """The T5 rules of Megatron-LM core_v0.16.1 validate_args (arguments.py), then
    what pretrain_t5.py's model_provider reads: a copy of ``ns`` with num_layers,
    seq_length and kv_channels filled in as validate_args fills them, and
    ``decoder_layers_built``, the decoder depth model_provider builds."""
    ns = argparse.Namespace(**vars(ns))
    if ns.num_layers is not None:
        assert ns.encoder_num_layers is None, "cannot have both num-layers and encoder-num-layers"
        ns.encoder_num_layers = ns.num_layers
    else:
        assert ns.encoder_num_layers is not None, "either num-layers or encoder-num-layers"
        ns.num_layers = ns.encoder_num_layers
    if ns.kv_channels is None:
        assert ns.hidden_size % ns.num_attention_heads == 0
        ns.kv_channels = ns.hidden_size // ns.num_attention_heads
    if ns.seq_length is not None:
        assert ns.encoder_seq_length is None
        ns.encoder_seq_length = ns.seq_length
    else:
        assert ns.encoder_seq_length is not None
        ns.seq_length = ns.encoder_seq_length
    assert ns.max_position_embeddings >= ns.seq_length
    if ns.decoder_seq_length is not None:
        assert ns.max_position_embeddings >= ns.decoder_seq_length
    # pretrain_t5.py model_provider: decoder block of config.num_layers // pp layers
    assert ns.pipeline_model_parallel_size == 1, "Pipeline parallelism is not supported for T5."
    ns.decoder_layers_built = ns.num_layers // ns.pipeline_model_parallel_size
    return ns


def t5_variant(**changes):
    """The T5 3B TP 2 case with another model (refusal tests)."""
    spec = case_spec("t5-3b-tp2-full-block")
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, **changes))


# ------------------------------------------------------------ Megatron-LM


def test_t5_validate_rules_catch_gpt_forms():
    """The validate_args rules above refuse what pretrain_t5.py would: --num-layers next to
    --encoder-num-layers, --seq-length next to --encoder-seq-length, short positions."""
    args = megatron_args(case_spec("t5-3b-tp2-full-block"))
    with pytest.raises(AssertionError):
        validate_t5_args(parse(args + ["--num-layers", "48"]))
    with pytest.raises(AssertionError):
        validate_t5_args(parse(args + ["--seq-length", "512"]))
    short = list(args)
    short[short.index("--max-position-embeddings") + 1] = "100"
    with pytest.raises(AssertionError):
        validate_t5_args(parse(short))


@pytest.mark.parametrize("name", sorted(T5_CASES))
def test_t5_args_parse_and_match_the_plan(name):
    spec = case_spec(name)
    ns = validate_t5_args(parse(megatron_args(spec)))
    m, p, w, b, fam = spec.model, spec.plan, spec.workload, spec.base, spec.family
    # shape: the encoder's and decoder's depths, the decoder as model_provider builds it
    assert (ns.encoder_num_layers, ns.decoder_num_layers, ns.decoder_layers_built) == \
        (m.encoder_layers, m.decoder_layers, m.decoder_layers)
    assert (ns.hidden_size, ns.ffn_hidden_size, ns.num_attention_heads, ns.kv_channels) == \
        (m.hidden_size, m.ffn_hidden_size, m.num_heads, m.head_dim)
    assert (ns.encoder_seq_length, ns.decoder_seq_length) == (w.seq_len, m.decoder_seq_len)
    assert not ns.group_query_attention
    # architecture: GeGLU as quick-GeGLU, unfused; nothing GPT-only
    assert ns.quick_geglu == (m.mlp_kind == "geglu") and ns.swiglu == (m.mlp_kind == "swiglu")
    assert not (ns.quick_geglu and ns.bias_gelu_fusion)
    assert ns.position_embedding_type == POSITIONS[m.position_embedding]
    assert ns.normalization == ("RMSNorm" if m.norm_kind == "rmsnorm" else "LayerNorm")
    assert ns.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert ns.add_bias_linear == m.has_bias
    assert (ns.hidden_dropout, ns.attention_dropout) == (m.hidden_dropout, m.attention_dropout)
    assert math.isclose(ns.init_method_std, b.init_method_std, rel_tol=1e-5)
    # vocabulary: the legacy tokenizer's count, padded as Megatron pads it, is the model's
    multiple = ns.make_vocab_size_divisible_by * ns.tensor_model_parallel_size
    assert math.ceil(fam.tokenizer_vocab_size / multiple) * multiple == m.vocab_size
    # plan: pp 1 and no VP/CP/EP flags
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.micro_batch_size,
            ns.global_batch_size, ns.sequence_parallel) == (p.tp, 1, p.mbs, w.global_batch_size,
                                                            p.sp)
    assert ns.context_parallel_size == 1 and ns.expert_model_parallel_size == 1
    assert ns.num_virtual_stages_per_pipeline_rank is None
    assert ns.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    if p.recompute == "full":
        every = 1 if p.recompute_method == "uniform" else max(m.encoder_layers, m.decoder_layers)
        assert ns.recompute_method == p.recompute_method
        assert ns.recompute_num_layers == (p.recompute_num_layers or every)
    assert ns.use_distributed_optimizer == p.distributed_optimizer
    assert not ns.tp_comm_overlap   # one userbuffer size cannot serve both lengths
    # schedule and data
    assert ns.train_samples == spec.train_samples and ns.lr_decay_style == b.lr_decay_style
    assert ns.data_path == ["$DATA_PATH"] and not ns.mock_data
    assert ns.tokenizer_type == {"t5": "BertWordPieceCase",
                                 "mt5": "SentencePieceTokenizer"}[m.family]
    assert (ns.vocab_file, ns.tokenizer_model) == (
        ("$VOCAB_FILE", None) if m.family == "t5" else (None, "$TOKENIZER_MODEL"))
    assert ns.vocab_extra_ids == SENTINEL_TOKENS and ns.legacy_tokenizer


@pytest.mark.parametrize("name", sorted(T5_CASES))
def test_t5_megatron_core_config_accepts_the_args(name):
    """TransformerConfig from the args (core_transformer_config_from_args): the encoder's
    depth, gated quick-GELU without the bias fusion, the plan; model_provider's copy."""
    pytest.importorskip("megatron.core")
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    spec = case_spec(name)
    ns = validate_t5_args(parse(megatron_args(spec)))
    config = transformer_config(ns)
    m, p = spec.model, spec.plan
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size,
            config.num_attention_heads, config.kv_channels) == \
        (m.encoder_layers, m.hidden_size, m.ffn_hidden_size, m.num_heads, m.head_dim)
    assert config.gated_linear_unit and config.activation_func is quick_gelu
    assert not config.bias_activation_fusion
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
            config.sequence_parallel) == (p.tp, 1, p.sp)
    assert config.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    assert (config.fp8 is not None) == (spec.workload.precision == "fp8")
    encoder = copy.deepcopy(config)   # pretrain_t5.py model_provider
    encoder.num_layers = ns.encoder_num_layers
    assert encoder.num_layers == m.encoder_layers


_CHILD = r"""
import json, math, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[3])
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
from copy import deepcopy
from autoconfig.profiling.cpu_bridge import cpu_bridge
from megatron.core import parallel_state
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
bridge = cpu_bridge()   # megatron-core's CUDA RNG tracker and factories, on CPU
bridge.__enter__()
parallel_state.initialize_model_parallel(1, 1)
torch.manual_seed(0)
model_parallel_cuda_manual_seed(0)
from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDataset
from megatron.core.models.T5 import T5Model
from megatron.core.models.T5.t5_spec import (decoder_model_with_local_spec,
                                             encoder_model_with_local_spec)
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from test_launch_megatron import parse, transformer_config
from test_launch_t5 import validate_t5_args
args, tokens = json.loads(sys.argv[1]), int(sys.argv[4])
ns = validate_t5_args(parse(args))
# One CPU process: no TP, fp32, CPU init, and no CUDA-only kernels; the MLP's
# bias-activation fusion stays as the args set it.
ns.tensor_model_parallel_size, ns.sequence_parallel, ns.bf16 = 1, False, False
ns.use_cpu_initialization, ns.gradient_accumulation_fusion = True, False
ns.masked_softmax_fusion = ns.bias_dropout_fusion = False
ns.no_persist_layer_norm = True
config = transformer_config(ns)
# pretrain_t5.py model_provider (core_v0.16.1): the encoder config gets
# --encoder-num-layers; the decoder block gets config.num_layers // pp layers.
# Local layers with a torch norm (the local block helpers name TENorm, None here).
encoder_config = deepcopy(config)
encoder_config.num_layers = ns.encoder_num_layers
def block(layer, n):
    return TransformerBlockSubmodules([layer] * n, layer_norm=WrappedTorchNorm)
multiple = ns.make_vocab_size_divisible_by * 1
padded = math.ceil(tokens / multiple) * multiple
model = T5Model(
    config=config, encoder_config=encoder_config,
    transformer_encoder_layer_spec=block(encoder_model_with_local_spec(),
                                         encoder_config.num_layers),
    transformer_decoder_layer_spec=block(decoder_model_with_local_spec(), config.num_layers),
    vocab_size=padded, max_sequence_length=ns.max_position_embeddings,
    share_embeddings_and_output_weights=not ns.untie_embeddings_and_output_weights,
    position_embedding_type=ns.position_embedding_type, rotary_percent=ns.rotary_percent,
    relative_attention_num_buckets=ns.relative_attention_num_buckets,
    relative_attention_max_distance=ns.relative_attention_max_distance)
params = sum(p.numel() for p in model.parameters())
# one micro-batch as pretrain_t5.py get_batch makes it for the local implementation
b = ns.micro_batch_size
enc = torch.randint(1, padded, (b, ns.encoder_seq_length))
dec = torch.randint(1, padded, (b, ns.decoder_seq_length))
labels = torch.randint(1, padded, (b, ns.decoder_seq_length))
masks = T5MaskedWordPieceDataset.config_attention_mask(enc, dec, None, None, use_local=True)
loss = model(enc, dec, *masks, lm_labels=labels)
loss.float().mean().backward()
print(json.dumps({"params": params, "loss_shape": list(loss.shape),
                  "finite": bool(torch.isfinite(loss).all())}))
"""


def build_t5_from_args(args: list[str], tokens: int) -> subprocess.CompletedProcess:
    """pretrain_t5.py's model from ``args`` in a child process (model-parallel state is
    global), one forward and backward; ``tokens``: the tokenizer's count."""
    with socket.socket() as sock:  # a free port for the one-process gloo group
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args), port, str(TESTS),
                           str(tokens)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=TESTS)


def _tiny_t5_spec(**model_changes):
    tiny = dataclasses.replace(get_model("tiny-t5"), **model_changes)
    gpu = get_gpu("h100-80gb")
    plan = Plan(tp=1, pp=1, dp=1, mbs=2, recompute="full", recompute_method="block")
    return launch_spec(tiny, Workload(16, tiny.seq_len), plan, Cluster(gpu, 1, 1))


def test_tiny_t5_args_build_the_counted_model_and_train():
    """The model pretrain_t5.py builds from the emitted args has exactly the counted
    parameters, and its forward and backward run with the args' activation settings."""
    pytest.importorskip("megatron.core")
    spec = _tiny_t5_spec()
    proc = build_t5_from_args(megatron_args(spec), spec.family.tokenizer_vocab_size)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["params"] == total_params(spec.model)
    assert result["loss_shape"] == [2, spec.model.decoder_seq_len] and result["finite"]


def test_quick_geglu_needs_the_bias_fusion_off():
    """Why --no-bias-gelu-fusion: with Megatron's default fusion a dense quick-GeGLU MLP
    raises in megatron-core 0.16.1 (mlp.py)."""
    pytest.importorskip("megatron.core")
    spec = _tiny_t5_spec()
    args = [a for a in megatron_args(spec) if a != "--no-bias-gelu-fusion"]
    proc = build_t5_from_args(args, spec.family.tokenizer_vocab_size)
    assert proc.returncode != 0 and "Only support fusion of gelu and swiglu" in proc.stderr


def test_unequal_depths_would_build_another_model():
    """Why unequal depths get no file: pretrain_t5.py builds the decoder with the encoder's
    depth, so --decoder-num-layers 1 after 2 encoder layers trains a 2 + 2 model."""
    pytest.importorskip("megatron.core")
    spec = _tiny_t5_spec()
    args = megatron_args(spec)
    args[args.index("--decoder-num-layers") + 1] = "1"
    proc = build_t5_from_args(args, spec.family.tokenizer_vocab_size)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])["params"]
    unequal = dataclasses.replace(spec.model, num_layers=3, decoder_layers=1)
    assert built == total_params(spec.model) != total_params(unequal)


@pytest.mark.parametrize("changes, reason", [
    ({"num_layers": 36, "decoder_layers": 12}, "builds the decoder with the encoder's count"),
    ({"mlp_kind": "reglu"}, "ReGLU"),
    ({"num_kv_heads": 8}, "Group query attention is not currently supported"),
    ({"qk_norm": True}, "Q/K norms")])
def test_megatron_lm_refuses_what_pretrain_t5_cannot_build(changes, reason):
    """No megatron_args.sh or launch.sbatch, a one-line reason in best.yaml's launch part."""
    spec = t5_variant(**changes)
    why = megatron_lm.not_written_reason(spec)
    assert why and reason in why and "\n" not in why
    texts = launch_texts(spec)
    assert "megatron" not in texts and "sbatch" not in texts
    document = launch_document(spec)
    assert document["megatron_not_written"] == why and "megatron_args" not in document


def test_megatron_lm_refuses_a_pipeline_plan():
    spec = case_spec("t5-3b-tp2-full-block")
    spec = dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, pp=2, dp=40))
    assert "pp 2" in megatron_lm.not_written_reason(spec)
    assert "pp 2" in nemo1.not_written_reason(spec)


def test_t5_has_no_mock_data():
    """pretrain_t5.py has no synthetic T5 data: no MOCK_DATA branch, no mock arguments."""
    spec = case_spec("t5-3b-tp2-full-block")
    with pytest.raises(ValueError, match="no mock data"):
        megatron_args(spec, "mock")
    text = megatron_args_script(spec)
    assert "MOCK_DATA:-0" not in text and "# no MOCK_DATA" in text
    document = launch_document(spec)
    assert "megatron_mock_args" not in document and document["megatron_mock_not_written"]
    assert document["megatron_script"] == "pretrain_t5.py"


# ------------------------------------------------------------ sbatch


@pytest.mark.parametrize("name", sorted(T5_CASES))
def test_t5_sbatch_runs_pretrain_t5_with_the_args(name):
    spec = case_spec(name)
    text = render_sbatch(spec)
    assert 'PROGRAM=(python "$MEGATRON_LM/pretrain_t5.py")' in text
    assert "pretrain_gpt" not in text and "MOCK_DATA=1" not in text
    assert "examples/t5/pretrain_t5.py" in text   # where newer Megatron-LM has it
    arrays = megatron_args_script(spec).split("disable=SC2034  # used by whoever sources this\n")[1]
    assert arrays in text


def test_t5_sourced_arguments_are_the_rendered_ones(tmp_path):
    """bash reads megatron_args.sh into exactly megatron_args(spec), placeholders expanded."""
    spec = case_spec("mt5-11b-tp4-sp-full-block")
    script = tmp_path / "megatron_args.sh"
    script.write_text(megatron_args_script(spec))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DATA_PATH": "/d/text",
           "TOKENIZER_MODEL": "/d/mt5.model", "CHECKPOINT_DIR": "/ck", "LOG_DIR": "/logs"}
    proc = subprocess.run(["bash", "-c", f'source {script} && printf "%s\\n" "${{MEGATRON_ARGS[@]}}"'],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    expected = [a.replace("$DATA_PATH", "/d/text").replace("$TOKENIZER_MODEL", "/d/mt5.model")
                .replace("$CHECKPOINT_DIR", "/ck").replace("$LOG_DIR", "/logs")
                for a in megatron_args(spec)]
    assert proc.stdout.splitlines() == expected
    del env["TOKENIZER_MODEL"]
    proc = subprocess.run(["bash", "-c", f"source {script}"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode != 0 and "set TOKENIZER_MODEL" in proc.stderr


# ------------------------------------------------------------ NeMo 1


def nemo_t5_base() -> dict:
    """megatron_t5_config.yaml composed with its defaults list
    (``.@model.encoder``/``.@model.decoder``: megatron_model_base_config) as Hydra does."""
    cfg = yaml.safe_load((DATA / "nemo1_megatron_t5_config.yaml").read_text())
    stack = yaml.safe_load((DATA / "nemo1_megatron_model_base_config.yaml").read_text())
    assert cfg.pop("defaults") == [{".@model.encoder": "megatron_model_base_config"},
                                   {".@model.decoder": "megatron_model_base_config"}]
    cfg["model"]["encoder"] = copy.deepcopy(stack)
    cfg["model"]["decoder"] = copy.deepcopy(stack)
    return cfg


def test_recorded_nemo_t5_yaml_is_sourced():
    for name in ("nemo1_megatron_t5_config.yaml", "nemo1_megatron_model_base_config.yaml"):
        first = (DATA / name).read_text().splitlines()[0]
        assert "NVIDIA/NeMo/blob/8cfedd7203462cb251a914e700e5605444277561" in first
        assert first.endswith(name.replace("nemo1_", ""))
    base = nemo_t5_base()
    assert _get(base, "model.encoder.activations_checkpoint_num_layers") == 1
    assert _get(base, "model.sequence_parallel") is MISSING
    with pytest.raises(KeyError):
        compose(base, ["model.sequence_parallel=true"])


@pytest.mark.parametrize("name", NEMO_T5_CASES)
def test_nemo1_t5_overrides_compose_and_match(name):
    spec = case_spec(name)
    cfg = compose(nemo_t5_base(), nemo1_overrides(spec))
    model, m, p, w, b = cfg["model"], spec.model, spec.plan, spec.workload, spec.base
    assert (cfg["trainer"]["num_nodes"], cfg["trainer"]["devices"]) == \
        (spec.cluster.nodes, spec.cluster.gpus_per_node)
    assert cfg["trainer"]["precision"] == "bf16" and cfg["trainer"]["max_steps"] == spec.train_iters
    assert model["mcore_t5"] is True and model["transformer_engine"] is True
    assert model["megatron_amp_O2"] is True and model["share_token_embeddings"] is True
    assert model["share_decoder_tokens_head_embeddings"] == m.tied_embeddings
    for stack, layers in (("encoder", m.encoder_layers), ("decoder", m.decoder_layers)):
        s = model[stack]
        assert (s["num_layers"], s["hidden_size"], s["ffn_hidden_size"],
                s["num_attention_heads"], s["kv_channels"]) == \
            (layers, m.hidden_size, m.ffn_hidden_size, m.num_heads, m.kv_channels or None)
        assert (s["activation"], s["normalization"], s["bias"]) == \
            (m.mlp_kind, m.norm_kind, m.has_bias)
        assert s["position_embedding_type"] == POSITIONS[m.position_embedding]
        assert s["num_moe_experts"] is None   # megatron-core: no routed experts
        assert (s["hidden_dropout"], s["attention_dropout"]) == (m.hidden_dropout,
                                                                 m.attention_dropout)
        assert s["init_method_std"] == pytest.approx(b.init_method_std, rel=1e-5)
        assert s["activations_checkpoint_granularity"] == (None if p.recompute == "none"
                                                           else p.recompute)
        full = p.recompute == "full"
        assert s["activations_checkpoint_method"] == (p.recompute_method if full else None)
        assert s["activations_checkpoint_num_layers"] == (spec.recompute_num_layers if full
                                                          else None)
    # lengths: the encoder's (data.seq_length follows it), the decoder's, positions for both
    assert model["seq_length"] == w.seq_len and model["data"]["seq_length"] == "${model.seq_length}"
    assert model["data"]["seq_length_dec"] == m.decoder_seq_len
    assert model["max_position_embeddings"] >= max(w.seq_len, m.decoder_seq_len)
    multiple = model["make_vocab_size_divisible_by"] * p.tp
    assert math.ceil(spec.family.tokenizer_vocab_size / multiple) * multiple == m.vocab_size
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"],
            model["sequence_parallel"], model["micro_batch_size"], model["global_batch_size"]) \
        == (p.tp, 1, p.sp, p.mbs, w.global_batch_size)
    tokenizer = model["tokenizer"]
    assert tokenizer["num_sentinel_tokens"] == SENTINEL_TOKENS
    if m.family == "t5":
        assert (tokenizer["library"], tokenizer["type"], tokenizer["vocab_file"]) == \
            ("megatron", "BertWordPieceCase", "${oc.env:VOCAB_FILE}")
    else:
        assert (tokenizer["library"], tokenizer["type"], tokenizer["model"]) == \
            ("sentencepiece", None, "${oc.env:TOKENIZER_MODEL}")
    optim = model["optim"]
    assert optim["name"] == ("distributed_fused_adam" if p.distributed_optimizer
                             else "fused_adam")
    assert optim["lr"] == pytest.approx(b.lr, rel=1e-5)
    assert optim["betas"] == [b.adam_beta1, b.adam_beta2]
    # NeMo's WarmupPolicy: "Either use particular number of step or ratio"
    sched = optim["sched"]
    assert sched["warmup_steps"] == spec.warmup_iters > 0 and sched["warmup_ratio"] is None
    assert sched["name"] == {"linear": "WarmupAnnealing", "cosine": "CosineAnnealing"}[
        b.lr_decay_style]
    assert sched["min_lr"] == pytest.approx(b.min_lr, rel=1e-5)
    if p.distributed_optimizer:
        assert optim["grad_sync_dtype"] == spec.grad_reduce_dtype
    # the T5 yaml lacks the key (megatron-core's default: off); NeMo's start-up check
    # keeps what is written, the stack's value wherever NeMo allows it
    fused = model["gradient_accumulation_fusion"]
    assert nemo_validated_fusion(model, p.dp) == fused
    allowed = nemo_validated_fusion({**model, "gradient_accumulation_fusion": True}, p.dp)
    assert fused == (spec.software.gradient_accumulation_fusion and allowed)


def nemo_t5_transformer_config(cfg: dict):
    """megatron-core TransformerConfig as NeMo 8cfedd7's megatron-core T5 builds it:
    megatron_lm_encoder_decoder_model.py build_transformer_config copies the encoder's
    keys to the model section, megatron_base_model.py build_transformer_config maps
    activation (utils_funcs.py activation_to_func), bias, norm and recompute, and
    build_model_parallel_config passes the parallel fields."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    model = {**cfg["model"], **cfg["model"]["encoder"]}
    activation = model["activation"]
    funcs = {"gelu": F.gelu, "geglu": F.gelu, "reglu": F.relu, "swiglu": F.silu}
    mapped = {
        "gated_linear_unit": activation.endswith("glu"), "activation_func": funcs[activation],
        "add_bias_linear": model["bias"],
        "normalization": {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[model["normalization"]],
        "bias_activation_fusion": model["bias_activation_fusion"],
        "recompute_granularity": model["activations_checkpoint_granularity"],
        "recompute_method": model["activations_checkpoint_method"],
        "recompute_num_layers": model["activations_checkpoint_num_layers"],
        "fp8": None, "persist_layer_norm": False, "masked_softmax_fusion": False,
        "gradient_accumulation_fusion": False}
    names = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: v for k, v in model.items() if k in names and k not in mapped}
    return TransformerConfig(**kw, **mapped)


@pytest.mark.parametrize("name", NEMO_T5_CASES)
def test_nemo1_t5_megatron_core_config_accepts_the_overrides(name):
    """TransformerConfig's own checks on the composed config (the yaml's num_layers 1
    next to selective recompute, which it refuses, included)."""
    pytest.importorskip("megatron.core")
    spec = case_spec(name)
    config = nemo_t5_transformer_config(compose(nemo_t5_base(), nemo1_overrides(spec)))
    m, p = spec.model, spec.plan
    assert (config.num_layers, config.hidden_size, config.num_attention_heads) == \
        (m.encoder_layers, m.hidden_size, m.num_heads)
    assert config.gated_linear_unit and config.bias_activation_fusion
    assert (config.tensor_model_parallel_size, config.sequence_parallel) == (p.tp, p.sp)
    assert config.recompute_granularity == (None if p.recompute == "none" else p.recompute)


@pytest.mark.parametrize("name, key, message", [
    ("t5-3b-tp4-selective", "model.encoder.activations_checkpoint_num_layers",
     "recompute_num_layers must be None"),
    ("mt5-11b-tp4-full-uniform", "model.encoder.num_moe_experts",
     "Bias in Moe is only supported when ETP==1")])
def test_nemo1_t5_keys_the_yaml_default_would_break(name, key, message):
    """Why the overrides null these yaml defaults: left as the yaml has them (1),
    megatron-core's TransformerConfig refuses the composed config."""
    pytest.importorskip("megatron.core")
    overrides = [line for line in nemo1_overrides(case_spec(name))
                 if not line.startswith(key + "=")]
    with pytest.raises((ValueError, AssertionError), match=message):
        nemo_t5_transformer_config(compose(nemo_t5_base(), overrides))


@pytest.mark.parametrize("changes", [{"num_layers": 36, "decoder_layers": 12},
                                     {"mlp_kind": "reglu"}])
def test_nemo1_builds_what_megatron_lm_cannot(changes):
    """NeMo 1 builds the decoder with model.decoder.num_layers and has ReGLU (unfused:
    megatron-core fuses the bias into GELU and SiLU only)."""
    spec = t5_variant(**changes)
    assert nemo1.not_written_reason(spec) is None and "nemo" in launch_texts(spec)
    cfg = compose(nemo_t5_base(), nemo1_overrides(spec))
    assert cfg["model"]["decoder"]["num_layers"] == spec.model.decoder_layers
    assert cfg["model"]["decoder"]["activation"] == spec.model.mlp_kind
    pytest.importorskip("megatron.core")
    config = nemo_t5_transformer_config(cfg)
    assert config.bias_activation_fusion == (spec.model.mlp_kind != "reglu")


def test_nemo1_refuses_fp8_t5():
    spec = case_spec("mt5-11b-tp2-fp8-selective")
    why = nemo1.not_written_reason(spec)
    assert why and "fp8 None" in why and "nemo" not in launch_texts(spec)
    assert launch_document(spec)["nemo1_not_written"] == why


def test_nemo1_t5_text_names_the_t5_script_and_yaml():
    spec = case_spec("t5-3b-tp2-sp-full-block12")
    text = nemo1_text(spec)
    assert "megatron_t5_pretraining.py" in text and "megatron_t5_config.yaml" in text
    assert "megatron_gpt" not in text
    assert [line for line in text.splitlines() if not line.startswith("#")] == \
        nemo1_overrides(spec)


# ------------------------------------------------------------ Megatron-Bridge and the set


@pytest.mark.parametrize("name", sorted(T5_CASES))
def test_bridge_writes_no_t5_file(name):
    """Megatron-Bridge has a T5ModelProvider but no T5 recipe, step or dataset."""
    spec = case_spec(name)
    why = bridge.not_written_reason(spec)
    assert why and "T5ModelProvider" in why
    texts = launch_texts(spec)
    assert "bridge" not in texts and "bridge_sbatch" not in texts
    document = launch_document(spec)
    assert document["bridge_not_written"] == why and "bridge" not in document
    assert set(document["files"]) == set(texts)


def test_t5_tp_overlap_is_off_with_a_reason():
    """The nemo stack asks for TP communication overlap (SP, TP 2): off for T5, said in
    every header."""
    spec = case_spec("t5-3b-tp2-sp-full-block12")
    assert spec.software.tp_comm_overlap and not spec.tp_comm_overlap
    assert "--tp-comm-overlap" not in megatron_args(spec)
    for key, (_, text) in launch_texts(spec).items():
        assert "TP communication overlap off" in text, key


@pytest.mark.parametrize("model", ["t5-3b", "mt5-11b"])
def test_searched_top_t5_plans_launch(model):
    """The plans the search ranks first for T5 3B and mT5 11B (20 nodes of H100, the nemo
    stack) get Megatron-LM and NeMo 1 files that their parsers and megatron-core accept."""
    pytest.importorskip("megatron.core")
    from autoconfig.base.config import base_for_model
    from autoconfig.training.search import search
    m, gpu = get_model(model), get_gpu("h100-80gb")
    result = search(m, Workload(base_for_model(m).global_batch_size, m.seq_len),
                    Cluster(gpu, 20, gpu.gpus_per_node), stack="nemo")
    for plan in result.top_plans(5):
        spec = launch_spec(m, result.workload, plan, result.cluster, software=result.software,
                           stack=result.stack)
        assert {"megatron", "sbatch", "nemo"} <= set(launch_texts(spec))
        ns = validate_t5_args(parse(megatron_args(spec)))
        assert ns.decoder_layers_built == m.decoder_layers
        transformer_config(ns)
        nemo_t5_transformer_config(compose(nemo_t5_base(), nemo1_overrides(spec)))


@pytest.mark.parametrize("style, scheduler", [("linear", "WarmupAnnealing"),
                                              ("cosine", "CosineAnnealing")])
def test_nemo1_t5_schedule_follows_the_base_config(style, scheduler):
    """A base config decaying over part of the run: cosine holds min_lr after the decay
    (constant_steps), as nemo1.py does for GPT; NeMo 1 has no linear decay that holds,
    and the header says the decay runs over all steps."""
    from autoconfig.base.config import base_for_model
    base = base_for_model(get_model("t5-3b"))
    base = dataclasses.replace(base, lr_decay_style=style,
                               lr_decay_steps=base.train_steps * 3 // 4)
    spec = case_spec("t5-3b-tp2-full-block", base=base)
    sched = compose(nemo_t5_base(), nemo1_overrides(spec))["model"]["optim"]["sched"]
    assert sched["name"] == scheduler and sched["warmup_steps"] == spec.warmup_iters
    if style == "cosine":
        assert sched["constant_steps"] == spec.train_iters - spec.decay_iters > 0
    else:
        assert "constant_steps" not in sched
        assert "decays over all" in nemo1_text(spec)
    assert parse(megatron_args(spec)).lr_decay_samples == spec.decay_samples
