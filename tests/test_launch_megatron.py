"""Megatron-LM arguments against Megatron-LM's own parser and megatron-core.

The parser is tests/data/megatron_lm_args.json: every option of
``add_megatron_arguments`` at Megatron-LM core_v0.16.1 (the commit is in the
file; scripts/megatron_lm_args.py regenerates it), rebuilt here as an
argparse parser with the same types, choices and nargs. Each emitted argument
list must parse, and the parsed values must equal the plan, the model and the
base config. megatron-core's TransformerConfig (installed, 0.16.1) is then built
from the parsed namespace the way Megatron-LM's core_transformer_config_from_args
does, so its own validation runs on the plan.
"""

import argparse
import dataclasses
import math

import pytest

from autoconfig.base.config import base_for_model
from autoconfig.core.catalog import get_model
from autoconfig.launch.megatron_lm import megatron_args
from launch_cases import CASES, case_spec, recorded

TYPES = {"int": int, "float": float, "str": str, "enum": str, None: None}


def recorded_parser() -> argparse.ArgumentParser:
    data = recorded("megatron_lm_args.json")
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    seen = set()
    for flag, opt in data["options"].items():
        key = (opt["dest"], flag)
        if key in seen:
            continue
        seen.add(key)
        kwargs = {"dest": opt["dest"], "default": opt["default"]}
        if opt["action"] == "BooleanOptionalAction":   # --x and --no-x, one dest
            kwargs["action"] = "store_false" if flag.startswith("--no-") else "store_true"
        elif opt["action"] in ("store_true", "store_false", "store_const"):
            kwargs["action"] = opt["action"] if opt["action"] != "store_const" else "store_true"
        else:
            kwargs["type"] = TYPES[opt["type"]]
            if opt["choices"] is not None:
                kwargs["choices"] = opt["choices"]
            if opt["nargs"] is not None:
                kwargs["nargs"] = opt["nargs"]
        parser.add_argument(flag, **kwargs)
    return parser


PARSER = recorded_parser()


def parse(args: list[str]) -> argparse.Namespace:
    known = recorded("megatron_lm_args.json")["options"]
    unknown = [a for a in args if a.startswith("--") and a not in known]
    assert not unknown, f"flags Megatron-LM does not have: {unknown}"
    return PARSER.parse_args(args)


def test_recorded_parser_is_real_and_sourced():
    data = recorded("megatron_lm_args.json")
    assert len(data["commit"]) == 40 and data["ref"] == "core_v0.16.1"
    assert len(data["options"]) > 600
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        PARSER.parse_args(["--lr-decay-style", "cosine-ish"])
    with pytest.raises(AssertionError):
        parse(["--num-layers-per-virtual-stage", "2"])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("data", ["real", "mock"])
def test_args_parse_and_match_the_plan(name, data):
    spec = case_spec(name)
    ns = parse(megatron_args(spec, data))
    m, p, w, b = spec.model, spec.plan, spec.workload, spec.base
    # shape and architecture
    assert (ns.num_layers, ns.hidden_size, ns.ffn_hidden_size, ns.num_attention_heads) == \
        (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_heads)
    assert ns.seq_length == w.seq_len and ns.max_position_embeddings >= w.seq_len
    assert ns.group_query_attention == (m.num_kv_heads != m.num_heads)
    if ns.group_query_attention:
        assert ns.num_query_groups == m.num_kv_heads
    assert ns.swiglu == (m.mlp_kind == "swiglu")
    assert ns.normalization == ("RMSNorm" if m.norm_kind == "rmsnorm" else "LayerNorm")
    assert ns.position_embedding_type == ("rope" if m.position_embedding == "rope"
                                          else "learned_absolute")
    assert ns.untie_embeddings_and_output_weights == (not m.tied_embeddings)
    assert ns.add_bias_linear == m.has_bias
    assert ns.hidden_dropout == m.hidden_dropout and ns.attention_dropout == m.attention_dropout
    if m.family == "llama3":
        assert ns.rotary_base == 500000 and ns.hidden_dropout == 0.0
    assert math.isclose(ns.init_method_std, b.init_method_std, rel_tol=1e-5)
    # vocabulary: Megatron's padding (tokenizer.py _vocab_size_with_padding) gives the plan's
    tokens = (ns.vocab_size + 1 if data == "mock" else spec.family.tokenizer_vocab_size)
    multiple = ns.make_vocab_size_divisible_by * ns.tensor_model_parallel_size
    assert math.ceil(tokens / multiple) * multiple == m.vocab_size
    # plan
    assert (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size,
            ns.context_parallel_size, ns.micro_batch_size, ns.global_batch_size) == \
        (p.tp, p.pp, p.cp, p.mbs, w.global_batch_size)
    assert (ns.num_virtual_stages_per_pipeline_rank or 1) == p.vp
    assert ns.num_layers_per_virtual_pipeline_stage is None
    assert ns.sequence_parallel == p.sp
    if spec.embedding_and_loss_split:
        assert ns.account_for_embedding_in_pipeline_split and ns.account_for_loss_in_pipeline_split
        assert ns.decoder_first_pipeline_num_layers is None
        assert (m.num_layers + 2) // p.pp - 1 == p.first_stage_layers == p.last_stage_layers
    else:
        assert (ns.decoder_first_pipeline_num_layers or 0) == p.first_stage_layers
        assert (ns.decoder_last_pipeline_num_layers or 0) == p.last_stage_layers
    assert ns.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    if p.recompute == "full":
        assert ns.recompute_method == p.recompute_method
        assert ns.recompute_num_layers == spec.recompute_num_layers
    assert ns.use_distributed_optimizer == p.distributed_optimizer
    # stack: exactly the features the prediction assumed
    sw = spec.software
    assert ns.tp_comm_overlap == (sw.tp_comm_overlap and p.tp > 1 and p.sp)
    assert ns.overlap_grad_reduce == sw.overlap_grad_reduce
    assert ns.overlap_param_gather == (sw.overlap_param_gather and sw.overlap_grad_reduce
                                       and p.distributed_optimizer)
    assert ns.grad_reduce_in_bf16 == (sw.grad_reduce_bytes == 2)
    if spec.interleaved:   # Megatron-LM overlaps interleaved pipeline sends unless told not to
        assert ns.overlap_p2p_comm == sw.overlap_p2p_comm
    assert ns.attention_backend == "fused" and ns.transformer_impl == "transformer_engine"
    # precision
    assert ns.bf16
    assert (ns.fp8 is not None) == (w.precision == "fp8")
    if w.precision == "fp8":
        assert (ns.fp8, ns.fp8_recipe) == ("hybrid", "tensorwise")
    # schedule from the base config: nothing left to Megatron's defaults
    assert ns.train_samples == b.train_steps * b.global_batch_size
    assert ns.train_iters is None
    assert math.isclose(ns.lr, b.lr, rel_tol=1e-5)
    assert math.isclose(ns.min_lr, b.min_lr, rel_tol=1e-5)
    assert ns.lr_decay_style == "cosine" == b.lr_decay_style
    assert ns.lr_warmup_samples == b.lr_warmup_steps * b.global_batch_size > 0
    assert ns.lr_decay_samples == b.lr_decay_steps * b.global_batch_size
    assert 0 < ns.lr_warmup_samples < ns.lr_decay_samples <= ns.train_samples
    assert (ns.weight_decay, ns.adam_beta1, ns.adam_beta2, ns.adam_eps, ns.clip_grad) == \
        (b.weight_decay, b.adam_beta1, b.adam_beta2, b.adam_eps, b.clip_grad)
    # data
    assert ns.mock_data == (data == "mock")
    if data == "mock":
        assert ns.tokenizer_type == "NullTokenizer"
    else:
        assert ns.data_path == ["$DATA_PATH"] and ns.tokenizer_type != "NullTokenizer"


def test_megatron_args_checks_catch_disagreement():
    """The checks above fail on a value that disagrees (here: a wrong LR)."""
    spec = case_spec("llama3-8b-bf16-plain")
    args = megatron_args(spec)
    args[args.index("--lr") + 1] = "3e-4"
    assert not math.isclose(parse(args).lr, spec.base.lr, rel_tol=1e-5)
    args = [a for a in megatron_args(spec) if a != "--swiglu"]
    assert not parse(args).swiglu


def test_given_base_config_reaches_the_args():
    base = dataclasses.replace(base_for_model(get_model("llama3-8b")), lr=2.5e-4, min_lr=2.5e-5,
                               lr_warmup_steps=2000, weight_decay=0.05, init_method_std=0.01)
    spec = case_spec("llama3-8b-bf16-plain", base=base)
    ns = parse(megatron_args(spec))
    assert (ns.lr, ns.min_lr, ns.weight_decay, ns.init_method_std) == (2.5e-4, 2.5e-5, 0.05, 0.01)
    assert ns.lr_warmup_samples == 2000 * base.global_batch_size
    assert spec.base_source.startswith("base config")
    assert "defaults" in case_spec("llama3-8b-bf16-plain").base_source


# ------------------------------------------------------------ megatron-core


def transformer_config(ns: argparse.Namespace):
    """megatron-core TransformerConfig from parsed args, as Megatron-LM's
    core_transformer_config_from_args (arguments.py, core_v0.16.1) builds it."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    ns = argparse.Namespace(**vars(ns))
    ns.params_dtype = torch.bfloat16 if ns.bf16 else torch.float32    # validate_args
    ns.attention_backend = AttnBackend[ns.attention_backend]
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(TransformerConfig)
          if hasattr(ns, f.name)}
    kw.update(persist_layer_norm=not ns.no_persist_layer_norm, deallocate_pipeline_outputs=True,
              pipeline_dtype=ns.params_dtype, batch_p2p_comm=not ns.overlap_p2p_comm,
              num_layers_in_first_pipeline_stage=ns.decoder_first_pipeline_num_layers,
              num_layers_in_last_pipeline_stage=ns.decoder_last_pipeline_num_layers,
              num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
              virtual_pipeline_model_parallel_size=ns.num_virtual_stages_per_pipeline_rank)
    if ns.swiglu:
        kw.update(activation_func=F.silu, gated_linear_unit=True,
                  bias_activation_fusion=ns.bias_swiglu_fusion)
    else:
        kw["bias_activation_fusion"] = ns.bias_gelu_fusion
    kw.pop("rope_type", None)
    # No Transformer Engine on this CPU machine: its fused kernels are switched off here
    # (megatron-core raises "apply_rope_fusion is not available" otherwise); on GPUs
    # with TE the emitted arguments keep Megatron's defaults.
    kw.update(apply_rope_fusion=False)
    if isinstance(kw.get("cp_comm_type"), list) and len(kw["cp_comm_type"]) == 1:
        kw["cp_comm_type"] = kw["cp_comm_type"][0]
    return TransformerConfig(**kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_megatron_core_transformer_config_accepts_the_args(name):
    pytest.importorskip("megatron.core")
    spec = case_spec(name)
    ns = parse(megatron_args(spec))
    config = transformer_config(ns)
    m, p = spec.model, spec.plan
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size,
            config.num_attention_heads) == (m.num_layers, m.hidden_size, m.ffn_hidden_size,
                                            m.num_heads)
    assert config.tensor_model_parallel_size == p.tp
    assert config.pipeline_model_parallel_size == p.pp
    assert config.context_parallel_size == p.cp
    assert config.sequence_parallel == p.sp
    assert (config.virtual_pipeline_model_parallel_size or 1) == p.vp
    assert config.gated_linear_unit == (m.mlp_kind == "swiglu")
    assert config.add_bias_linear == m.has_bias
    assert config.normalization == ("RMSNorm" if m.norm_kind == "rmsnorm" else "LayerNorm")
    assert config.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    assert (config.fp8 is not None) == (spec.workload.precision == "fp8")
    assert config.init_method_std == pytest.approx(spec.base.init_method_std, rel=1e-5)
    if spec.embedding_and_loss_split:
        assert config.account_for_embedding_in_pipeline_split
    elif p.first_stage_layers:
        assert config.num_layers_in_first_pipeline_stage == p.first_stage_layers


@pytest.mark.parametrize("model, gpu, nodes, precision", [
    ("gpt3-175b", "a100-80gb", 128, "bf16"), ("llama3-8b", "h100-80gb", 8, "fp8"),
    ("llama3-70b", "h100-80gb", 64, "bf16"), ("llama3-405b", "h100-80gb", 256, "fp8")])
def test_searched_top_plans_are_accepted(model, gpu, nodes, precision):
    """The plans the search ranks first (uneven splits included) launch as Megatron accepts."""
    pytest.importorskip("megatron.core")
    from autoconfig.core.catalog import get_gpu
    from autoconfig.core.hardware import Cluster
    from autoconfig.core.plan import Workload
    from autoconfig.launch.spec import launch_spec
    from autoconfig.training.search import search
    m, g = get_model(model), get_gpu(gpu)
    base = base_for_model(m)
    result = search(m, Workload(base.global_batch_size, m.seq_len, precision),
                    Cluster(g, nodes, g.gpus_per_node))
    for plan in result.top_plans(5):
        spec = launch_spec(m, result.workload, plan, result.cluster, software=result.software,
                           stack=result.stack)
        ns = parse(megatron_args(spec))
        transformer_config(ns)
        assert ns.tensor_model_parallel_size * ns.pipeline_model_parallel_size * \
            ns.context_parallel_size * plan.dp == result.cluster.num_gpus
