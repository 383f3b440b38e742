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
import re

import pytest

from autoconfig.base.config import base_for_model
from autoconfig.core.catalog import get_model
from autoconfig.launch.megatron_lm import megatron_args
from autoconfig.launch.spec import MEGATRON_FUSED_LOSSES
from launch_cases import ALL_CASES, MOE_CASES, case_spec, recorded

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


@pytest.mark.parametrize("name", sorted(ALL_CASES))
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
    assert ns.num_layers_per_virtual_pipeline_stage is None
    assert ns.sequence_parallel == p.sp
    comm = spec.software.cp_comm_type if p.cp > 1 else "p2p"
    assert ns.cp_comm_type == [comm]
    if comm == "a2a+p2p":   # megatron validate_args: the sizes multiply to cp
        assert math.prod(ns.hierarchical_context_parallel_sizes) == p.cp
    else:
        assert ns.hierarchical_context_parallel_sizes is None
    if ns.pipeline_model_parallel_layout:
        # megatron-core's own layout parser gives the plan's virtual stages and the
        # decoder layers of every pipeline rank, and validates MTP and loss placement.
        layouts = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
        layout = layouts.PipelineParallelLayerLayout.from_str(
            ns.pipeline_model_parallel_layout, pipeline_model_parallel_size=p.pp)
        assert ns.num_virtual_stages_per_pipeline_rank is None
        assert (layout.virtual_pipeline_model_parallel_size or 1) == p.vp
        per_rank = tuple(sum(t.name == "decoder" for chunk in rank for t in chunk)
                         for rank in layout.layout)
        assert per_rank == spec.stage_layers
        layout.validate_layer_layout(m.num_layers, m.mtp_layers)
        assert ns.decoder_last_pipeline_num_layers is None
    else:
        assert (ns.num_virtual_stages_per_pipeline_rank or 1) == p.vp
    if ns.pipeline_model_parallel_layout:
        pass
    elif spec.embedding_and_loss_split:
        assert ns.account_for_embedding_in_pipeline_split and ns.account_for_loss_in_pipeline_split
        assert ns.decoder_first_pipeline_num_layers is None
        assert (m.num_layers + 2) // p.pp - 1 == p.first_stage_layers == p.last_stage_layers
    else:
        assert (ns.decoder_first_pipeline_num_layers or 0) == p.first_stage_layers
        assert (ns.decoder_last_pipeline_num_layers or 0) == p.last_stage_layers
    assert ns.recompute_granularity == (None if p.recompute == "none" else p.recompute)
    assert ns.recompute_modules == (p.recompute_modules.split(",") if p.recompute_modules
                                    else None)
    if p.recompute == "full":
        assert ns.recompute_method == p.recompute_method
        assert ns.recompute_num_layers == spec.recompute_num_layers
    assert ns.use_distributed_optimizer == p.distributed_optimizer
    # Megatron-FSDP exactly where the prediction sharded the weights; validate_args
    # asserts the fsdp_dtensor checkpoint format with it
    assert ns.use_megatron_fsdp == spec.software.megatron_fsdp
    if ns.use_megatron_fsdp:
        assert ns.data_parallel_sharding_strategy == "optim_grads_params"
        assert ns.ckpt_format == "fsdp_dtensor"
    else:
        assert ns.ckpt_format == "torch_dist"
    assert ns.cpu_offloading_num_layers == spec.software.cpu_offload_layers
    # stack: exactly the features the prediction assumed
    sw = spec.software
    assert ns.tp_comm_overlap == (sw.tp_comm_overlap and p.tp > 1 and p.sp)
    assert ns.overlap_grad_reduce == sw.overlap_grad_reduce
    assert ns.overlap_param_gather == (sw.overlap_param_gather and sw.overlap_grad_reduce
                                       and p.distributed_optimizer)
    assert ns.grad_reduce_in_bf16 == (sw.grad_reduce_bytes == 2)
    assert ns.gradient_accumulation_fusion == sw.gradient_accumulation_fusion
    assert ns.cross_entropy_loss_fusion == (sw.cross_entropy in MEGATRON_FUSED_LOSSES)
    if ns.cross_entropy_loss_fusion:
        assert ns.cross_entropy_fusion_impl == sw.cross_entropy
    if spec.interleaved:   # Megatron-LM overlaps interleaved pipeline sends unless told not to
        assert ns.overlap_p2p_comm == sw.overlap_p2p_comm
    assert ns.attention_backend == "fused" and ns.transformer_impl == "transformer_engine"
    # precision
    assert ns.bf16
    assert (ns.fp8 is not None) == (w.precision == "fp8")
    if w.precision == "fp8":
        # the stack's or --fp8-recipe's recipe, else the generation's (tensorwise on Hopper)
        expected = sw.fp8_recipe or {"hopper": "tensorwise"}.get(spec.cluster.gpu.generation,
                                                                 "mxfp8")
        assert ns.fp8_recipe == expected
        assert ns.fp8 == ("e4m3" if expected == "mxfp8" else "hybrid")
    # NVFP4 as Megatron-Bridge's bf16_with_nvfp4_mixed: E2M1, the nvfp4 recipe, FP4 weights
    assert (ns.fp4 is not None) == (w.precision == "nvfp4")
    if w.precision == "nvfp4":
        assert (ns.fp4, ns.fp4_recipe, ns.fp4_param) == ("e2m1", "nvfp4", True)
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
        assert ns.data_path == ["$DATA_PATH"]
        # a family without a recorded tokenizer gets the plan's vocabulary as a placeholder
        assert (ns.tokenizer_type == "NullTokenizer") == spec.family.placeholder


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


def moe_freq_type(text: str):
    """Megatron-LM arguments.py moe_freq_type/_eval_pattern (core_v0.16.1): an int, or
    a list expression of digits, brackets, commas, + and * only."""
    if "[" not in text:
        return int(text)
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise ValueError(f"Invalid pattern: {text}")
    return eval(text)   # noqa: S307 - checked as Megatron checks it


def transformer_config(ns: argparse.Namespace):
    """megatron-core TransformerConfig (MLATransformerConfig with multi-latent
    attention) from parsed args, as Megatron-LM's validate_args and
    core_transformer_config_from_args (arguments.py, core_v0.16.1) build it."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    ns = argparse.Namespace(**vars(ns))
    ns.params_dtype = torch.bfloat16 if ns.bf16 else torch.float32    # validate_args
    ns.attention_backend = AttnBackend[ns.attention_backend]
    # validate_args: ETP defaults to TP, the expert FFN to the FFN, one-element
    # router lists to their element; the parser's type converts --moe-layer-freq
    if ns.expert_tensor_parallel_size is None:
        ns.expert_tensor_parallel_size = ns.tensor_model_parallel_size
    if ns.num_experts is not None and ns.moe_ffn_hidden_size is None:
        ns.moe_ffn_hidden_size = ns.ffn_hidden_size
    for name in ("moe_router_load_balancing_type", "moe_aux_loss_coeff"):
        value = getattr(ns, name)
        if isinstance(value, list) and len(value) == 1:
            setattr(ns, name, value[0])
    ns.moe_layer_freq = moe_freq_type(str(ns.moe_layer_freq))
    # the parser's types (arguments.py tuple_type, moe_freq_type), recorded as str
    if ns.window_size is not None:
        ns.window_size = tuple(int(i) for i in str(ns.window_size).strip("()").split(","))
    if ns.window_attn_skip_freq is not None:
        ns.window_attn_skip_freq = moe_freq_type(str(ns.window_attn_skip_freq))
    config_class = MLATransformerConfig if ns.multi_latent_attention else TransformerConfig
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(config_class)
          if hasattr(ns, f.name)}
    kw["num_moe_experts"] = ns.num_experts
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
    if ns.quick_geglu:   # T5's GeGLU (megatron_lm.py activation_args)
        from megatron.core.fusions.fused_bias_geglu import quick_gelu
        kw.update(activation_func=quick_gelu, gated_linear_unit=True)
    kw.pop("rope_type", None)
    # No Transformer Engine on this CPU machine: its fused kernels are switched off here
    # (megatron-core raises "apply_rope_fusion is not available" otherwise); on GPUs
    # with TE the emitted arguments keep Megatron's defaults.
    kw.update(apply_rope_fusion=False)
    if isinstance(kw.get("cp_comm_type"), list) and len(kw["cp_comm_type"]) == 1:
        kw["cp_comm_type"] = kw["cp_comm_type"][0]
    return config_class(**kw)


@pytest.mark.parametrize("name", sorted(ALL_CASES))
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


# ------------------------------------------------------------ mixture of experts


@pytest.mark.parametrize("name", sorted(MOE_CASES))
def test_moe_args_carry_the_model_and_plan(name):
    """Experts, their layers, router, EP/ETP, dispatcher, MLA and MTP parse to the
    model and plan, and megatron-core's config (MLA's for MLA) carries them."""
    spec = case_spec(name)
    ns = parse(megatron_args(spec))
    m, p, moe = spec.model, spec.plan, spec.moe
    pattern = [1 if kind == "moe" else 0 for kind in m.layer_pattern]
    assert (ns.num_experts, ns.moe_router_topk, ns.moe_ffn_hidden_size) == \
        (m.num_experts, m.moe_topk, m.moe_ffn_hidden_size)
    assert ns.moe_shared_expert_intermediate_size == (m.moe_shared_expert_ffn_hidden_size
                                                      or None)
    freq = moe_freq_type(ns.moe_layer_freq)
    assert (freq == 1 and all(pattern)) or freq == pattern
    assert (ns.expert_model_parallel_size, ns.expert_tensor_parallel_size) == (p.ep, p.etp)
    assert ns.moe_grouped_gemm == spec.software.moe_grouped_gemm
    dispatcher, _, backend = spec.software.moe_dispatcher.partition("-")
    assert ns.moe_token_dispatcher_type == dispatcher
    if backend:
        assert ns.moe_flex_dispatcher_backend == backend
    assert ns.overlap_moe_expert_parallel_comm == moe.a2a_overlap
    graph = {"none": ("none", []), "te-scoped": ("transformer_engine",
                                                 ["attn", "moe_router", "moe_preprocess"]),
             "full-iteration": ("local", ["full_iteration"])}[spec.software.cuda_graph]
    if spec.cuda_graph_off:     # megatron-core 0.16: not beside EP A2A overlap
        graph = ("none", [])
    assert (ns.cuda_graph_impl, ns.cuda_graph_scope) == graph
    # megatron-core 0.16's validate_args for whole-iteration local graphs
    assert ns.check_for_nan_in_loss_and_grad == (graph[0] != "local")
    assert ns.moe_pad_experts_for_cuda_graph_inference == (graph[0] == "local" and p.ep > 1)
    assert ns.moe_router_load_balancing_type == [moe.router.load_balancing_type]
    assert ns.moe_aux_loss_coeff == [moe.router.aux_loss_coeff]
    assert ns.mtp_num_layers == (m.mtp_layers or None)
    mla = m.attention_kind == "mla"
    assert ns.multi_latent_attention == mla and ns.qk_layernorm == (mla or m.qk_norm)
    if mla:
        assert (ns.q_lora_rank, ns.kv_lora_rank, ns.qk_head_dim, ns.qk_pos_emb_head_dim,
                ns.v_head_dim) == (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim,
                                   m.qk_rope_head_dim, m.v_head_dim)
        assert not ns.group_query_attention
    else:
        assert ns.kv_channels == (m.kv_channels or None)
        assert ns.num_query_groups == m.num_kv_heads
    # banded layers see themselves and sliding_window - 1 tokens before, every other layer
    window = (m.sliding_window - 1, 0) if m.sliding_window else None
    assert ns.window_size == (f"{window[0]},{window[1]}" if window else None)
    assert ns.window_attn_skip_freq == ("2" if window else None)
    assert ns.softmax_type == ("learnable" if m.attention_sinks else "vanilla")

    pytest.importorskip("megatron.core")
    config = transformer_config(ns)
    assert config.window_size == window and config.softmax_type == ns.softmax_type
    if window:   # megatron-core's layer rule: 1 = windowed; layers 1, 3, 5... banded
        assert config.window_attn_skip_freq == 2
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == \
        (m.num_experts, m.moe_topk, m.moe_ffn_hidden_size)
    assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == \
        (p.ep, p.etp)
    assert config.moe_layer_freq in (1, pattern) and (config.moe_layer_freq == 1) == all(pattern)
    assert config.moe_token_dispatcher_type == dispatcher
    assert config.overlap_moe_expert_parallel_comm == moe.a2a_overlap
    assert config.moe_router_load_balancing_type == moe.router.load_balancing_type
    assert config.moe_router_score_function == moe.router.score_function
    assert config.moe_router_enable_expert_bias == moe.router.expert_bias
    assert config.multi_latent_attention == mla
    assert config.qk_layernorm == (mla or m.qk_norm)
    assert config.mtp_num_layers == (m.mtp_layers or None)
    if mla:
        assert (config.q_lora_rank, config.kv_lora_rank, config.qk_head_dim,
                config.qk_pos_emb_head_dim, config.v_head_dim) == \
            (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
             m.v_head_dim)
    else:
        assert config.kv_channels == m.head_dim


def test_moe_cases_cover_what_the_brief_needs():
    """DeepSeek-V3 with EP 64, MTP and dense-first layers; Qwen3 with EP 8;
    Mixtral with ETP != TP; an A2A overlap kept on; a flex dispatcher."""
    specs = [case_spec(name) for name in MOE_CASES]
    assert any(s.model.attention_kind == "mla" and s.plan.ep == 64 and s.model.mtp_layers
               and s.model.moe_first_dense_layers for s in specs)
    assert any(s.model.qk_norm and s.plan.ep == 8 for s in specs)
    assert any(s.plan.etp != s.plan.tp and s.model.attention_kind == "gqa" for s in specs)
    assert any(s.moe.a2a_overlap for s in specs) and any(s.moe.flex_backend for s in specs)


def test_a2a_overlap_off_where_megatron_core_refuses_it():
    """The stack asks for EP A2A overlap, but megatron-core refuses it with full
    recompute: the flag is left out and every header says why."""
    spec = case_spec("mixtral-8x7b-etp2")
    assert spec.software.moe_a2a_overlap and not spec.moe.a2a_overlap
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(spec)
    assert any("full recompute" in line for line in spec.describe())


def test_moe_layer_freq_expression_is_megatrons_list():
    """Leading dense layers and a period > 1 both become the list Megatron evaluates."""
    from autoconfig.core.model import ModelSpec
    from autoconfig.launch.moe import MoeRouter, moe_launch
    from autoconfig.core.plan import Plan
    from autoconfig.training.stack import load_stack
    features = load_stack("megatron-lm").features
    for first, freq in ((3, 1), (0, 2), (1, 2), (0, 1)):
        model = ModelSpec(name="m", num_layers=12, hidden_size=256, num_heads=4, num_kv_heads=4,
                          ffn_hidden_size=512, vocab_size=1024, seq_len=128, num_experts=8,
                          moe_topk=2, moe_ffn_hidden_size=128, moe_first_dense_layers=first,
                          moe_layer_freq=freq)
        moe = moe_launch(model, Plan(tp=1, pp=1, dp=8, ep=8), features, MoeRouter())
        expected = [1 if kind == "moe" else 0 for kind in model.layer_pattern]
        value = moe_freq_type(moe.layer_freq_expression)
        assert value == expected or (value == 1 and all(expected))
    assert moe_launch(dataclasses.replace(model, moe_topk=1), Plan(tp=1, pp=1, dp=8),
                      features, MoeRouter()).router.pre_softmax   # megatron-core asks for it


@pytest.mark.parametrize("model, nodes", [("DEEPSEEK_V3", 64), ("QWEN3_30B_A3B", 2),
                                          ("MIXTRAL_8X7B", 8)])
def test_searched_top_moe_plans_are_accepted(model, nodes):
    """The MoE plans the search ranks first launch as Megatron accepts them."""
    pytest.importorskip("megatron.core")
    import launch_cases
    from autoconfig.core.catalog import get_gpu
    from autoconfig.core.hardware import Cluster
    from autoconfig.core.plan import Workload
    from autoconfig.launch.spec import launch_spec
    from autoconfig.training.search import search
    m, g = getattr(launch_cases, model), get_gpu("h100-80gb")
    result = search(m, Workload(1024, m.seq_len), Cluster(g, nodes, g.gpus_per_node),
                    stack="nemo")
    for plan in result.top_plans(5):
        spec = launch_spec(m, result.workload, plan, result.cluster, software=result.software,
                           stack=result.stack)
        ns = parse(megatron_args(spec))
        config = transformer_config(ns)
        assert (config.expert_model_parallel_size, config.expert_tensor_parallel_size) == \
            (plan.ep, plan.etp)


def test_whole_iteration_graphs_left_off_beside_a2a_overlap_say_so():
    """megatron-core 0.16 refuses local graphs with EP A2A overlap: the launch keeps
    the overlap, leaves the graph off and says so in its header."""
    spec = case_spec("qwen3-30b-a3b-ep8-full-graph")
    both = dataclasses.replace(spec, software=dataclasses.replace(spec.software,
                                                                  moe_a2a_overlap=True))
    assert both.moe.a2a_overlap and both.cuda_graph is None
    assert any("CUDA graphs left off" in line for line in both.describe())
    ns = parse(megatron_args(both))
    assert ns.cuda_graph_impl == "none" and ns.overlap_moe_expert_parallel_comm
    transformer_config(ns)
