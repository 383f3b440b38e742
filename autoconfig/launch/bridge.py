"""NeMo 2 / Megatron-Bridge: a Python file that starts from the model family's
recipe and sets the plan's, the stack's and the base config's fields.

Field names are those of Megatron-Bridge's ConfigContainer sections (model =
GPTModelProvider/TransformerConfig, train, scheduler, optimizer, ddp,
comm_overlap, mixed_precision, dataset, tokenizer, checkpoint); tests check each
assignment against the fields recorded from the fetched Megatron-Bridge and
Megatron-LM sources (tests/data/megatron_bridge_fields.json).
Run it: ``torchrun --nproc-per-node 8 bridge_recipe.py`` on one node, or
submit launch_bridge.sbatch (the same SLURM template as launch.sbatch).

An MoE model with its own recipe (heuristics/launch.yaml ``moe_recipes``) keeps
the architecture the recipe's provider read from the model's Hugging Face config
(activation, positions, norms, router, MLA); the file sets its shape, the plan
(EP, ETP and the whole pipeline split, replacing the recipe's layout), the
dispatcher and overlaps. Other MoE models start from vanilla GPT with every MoE
field set. The dispatcher is set field by field, not with Bridge's
apply_flex_dispatcher_backend, which silently falls back to alltoall on GPUs
without DeepEP/HybridEP: Bridge's own validation then fails loudly instead.
"""

from autoconfig.launch.megatron_lm import SKIP_WINDOW_EVERY, window_size
from autoconfig.launch.spec import LaunchSpec
from autoconfig.training.stack import MEGATRON_FSDP_SHARDING

MIXED_PRECISION = {None: "bf16_mixed", "tensorwise": "bf16_with_fp8_current_scaling_mixed",
                   "delayed": "bf16_with_fp8_delayed_scaling_mixed",
                   "mxfp8": "bf16_with_mxfp8_mixed",
                   "blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
                   "nvfp4": "bf16_with_nvfp4_mixed"}
"""Megatron-Bridge training/mixed_precision.py recipe names by FP8 recipe."""


def _py(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


ARCHITECTURE = frozenset({"model.normalization", "model.gated_linear_unit",
                          "model.activation_func", "model.add_bias_linear",
                          "model.position_embedding_type",
                          "model.share_embeddings_and_output_weights", "model.rotary_base",
                          "model.window_size", "model.window_attn_skip_freq",
                          "model.softmax_type"})
"""What a model's own recipe keeps from its Hugging Face config (GPT-OSS's clamped
quick-GELU and YaRN positions, say, which autoconfig's shape cannot express)."""


def _precision_key(spec: LaunchSpec) -> str | None:
    """The MIXED_PRECISION key of the run: its FP8 recipe, nvfp4, or None (bf16)."""
    return "nvfp4" if spec.workload.precision == "nvfp4" else spec.fp8_recipe


def not_written_reason(spec: LaunchSpec) -> str | None:
    """Why no bridge_recipe.py can run this model (None: it can)."""
    if spec.model.is_encoder_decoder:
        # Megatron-Bridge 067f987: models/t5_provider.py only; training/ has gpt_step.py and
        # multimodal steps, no T5 step; recipes/ has no t5 (the parts a pre-training file needs)
        return ("no bridge_recipe.py: Megatron-Bridge (067f987) has a T5ModelProvider but no "
                "T5 pre-training recipe, forward step or dataset; use Megatron-LM "
                "pretrain_t5.py or NeMo 1 megatron_t5_pretraining.py")
    if spec.model.attention_kind == "mla" and not spec.family.recipe_builds_model:
        return ("no bridge_recipe.py: multi-latent attention needs an MLA model provider, "
                f"which only a model's own recipe builds; {spec.model.name} has none in "
                "heuristics/launch.yaml moe_recipes, and the vanilla GPT fallback "
                "(GPTModelProvider) has no MLA fields")
    return None


def assignments(spec: LaunchSpec) -> list[tuple[str, object]]:
    """(``section.field``, value) for every field set, in order; values are Python
    literals except the few names the file imports (activation, attention backend)."""
    out = _assignments(spec)
    if spec.family.recipe_builds_model:
        out = [(key, value) for key, value in out if key not in ARCHITECTURE]
    return out


def _experts(spec: LaunchSpec) -> list[tuple[str, object]]:
    """Attention extras, experts, router and MTP of the model section."""
    m, moe = spec.model, spec.moe
    out: list[tuple[str, object]] = []
    if m.attention_kind == "gqa" and m.kv_channels:
        out.append(("model.kv_channels", m.kv_channels))
    if m.qk_norm or m.attention_kind == "mla":   # MLA's latent norms (see megatron_lm.py)
        out.append(("model.qk_layernorm", True))
    if m.sliding_window:    # banded every other layer (megatron_lm.window_args)
        out += [("model.window_size", window_size(m)),
                ("model.window_attn_skip_freq", SKIP_WINDOW_EVERY)]
    if m.attention_sinks:
        out.append(("model.softmax_type", "learnable"))
    if m.attention_kind == "mla":
        out += [("model.multi_latent_attention", True),
                ("model.q_lora_rank", m.q_lora_rank or None),
                ("model.kv_lora_rank", m.kv_lora_rank),
                ("model.qk_head_dim", m.qk_nope_head_dim),
                ("model.qk_pos_emb_head_dim", m.qk_rope_head_dim),
                ("model.v_head_dim", m.v_head_dim)]
    if moe is None:
        return out + ([("model.mtp_num_layers", m.mtp_layers)] if m.mtp_layers else [])
    out += [("model.num_moe_experts", moe.num_experts), ("model.moe_router_topk", moe.topk),
            ("model.moe_ffn_hidden_size", moe.ffn_hidden_size),
            ("model.moe_shared_expert_intermediate_size", moe.shared_ffn_hidden_size),
            # Megatron's list expression is Python too: ([0]*3+[1]*58) is the list
            ("model.moe_layer_freq", 1 if moe.every_layer else _Name(moe.layer_freq_expression)),
            ("model.moe_router_dtype", moe.router_dtype),
            ("model.mtp_num_layers", m.mtp_layers or None)]
    if not spec.family.recipe_builds_model:
        r = moe.router
        out += [("model.moe_router_load_balancing_type", r.load_balancing_type),
                ("model.moe_aux_loss_coeff", r.aux_loss_coeff),
                ("model.moe_router_score_function", r.score_function),
                ("model.moe_router_pre_softmax", r.pre_softmax),
                ("model.moe_router_enable_expert_bias", r.expert_bias),
                ("model.moe_router_topk_scaling_factor", r.topk_scaling_factor),
                ("model.moe_router_num_groups", r.num_groups),
                ("model.moe_router_group_topk", r.group_topk)]
    return out


def _expert_plan(spec: LaunchSpec) -> list[tuple[str, object]]:
    """EP, ETP, the dispatcher and grouped GEMM (nothing for a dense model)."""
    moe = spec.moe
    if moe is None:
        return []
    return [("model.expert_model_parallel_size", moe.ep),
            ("model.expert_tensor_parallel_size", moe.etp),
            ("model.moe_grouped_gemm", moe.grouped_gemm),
            ("model.moe_token_dispatcher_type", moe.dispatcher),
            ("model.moe_flex_dispatcher_backend", moe.flex_backend),
            # The prediction assumes no shared-expert overlap (Megatron-LM's default);
            # megatron-core also refuses it with flex and with EP A2A overlap.
            ("model.moe_shared_expert_overlap", False)]


def _split(spec: LaunchSpec) -> list[tuple[str, object]]:
    """The pipeline split. A model's own recipe may carry a layout (DeepSeek-V3,
    Kimi K2) or the embedding/loss accounting (Qwen3-235B): all of it is replaced."""
    p = spec.plan
    own = spec.family.recipe_builds_model
    if spec.pipeline_layout is not None:
        return [("model.pipeline_model_parallel_layout", spec.pipeline_layout),
                ("model.num_layers_in_first_pipeline_stage", None),
                ("model.num_layers_in_last_pipeline_stage", None),
                ("model.account_for_embedding_in_pipeline_split", False),
                ("model.account_for_loss_in_pipeline_split", False)]
    out = [("model.pipeline_model_parallel_layout", None)] if own else []
    if spec.embedding_and_loss_split:
        out += [("model.account_for_embedding_in_pipeline_split", True),
                ("model.account_for_loss_in_pipeline_split", True)]
        if own:
            out += [("model.num_layers_in_first_pipeline_stage", None),
                    ("model.num_layers_in_last_pipeline_stage", None)]
    else:
        if own:
            out += [("model.account_for_embedding_in_pipeline_split", False),
                    ("model.account_for_loss_in_pipeline_split", False)]
        out += [("model.num_layers_in_first_pipeline_stage", p.first_stage_layers or None),
                ("model.num_layers_in_last_pipeline_stage", p.last_stage_layers or None)]
    return out


def _assignments(spec: LaunchSpec) -> list[tuple[str, object]]:
    m, p, w, b = spec.model, spec.plan, spec.workload, spec.base
    out = [
        ("model.num_layers", m.num_layers), ("model.hidden_size", m.hidden_size),
        ("model.ffn_hidden_size", m.ffn_hidden_size),
        ("model.num_attention_heads", m.num_heads), ("model.num_query_groups", m.num_kv_heads),
        ("model.seq_length", w.seq_len),
        ("model.normalization", "RMSNorm" if m.norm_kind == "rmsnorm" else "LayerNorm"),
        ("model.gated_linear_unit", m.mlp_kind == "swiglu"),
        ("model.activation_func", _Name("F.silu" if m.mlp_kind == "swiglu" else "F.gelu")),
        ("model.add_bias_linear", m.has_bias),
        ("model.position_embedding_type",
         "rope" if m.position_embedding == "rope" else "learned_absolute"),
        ("model.share_embeddings_and_output_weights", m.tied_embeddings),
        ("model.hidden_dropout", m.hidden_dropout),
        ("model.attention_dropout", m.attention_dropout),
        ("model.init_method_std", b.init_method_std),
        ("model.make_vocab_size_divisible_by", spec.vocab_divisor),
    ]
    if m.position_embedding == "rope":
        out.append(("model.rotary_base", spec.family.rotary_base))
    out += _experts(spec)
    out += [
        ("model.tensor_model_parallel_size", p.tp),
        ("model.pipeline_model_parallel_size", p.pp),
        ("model.virtual_pipeline_model_parallel_size", p.vp if p.vp > 1 else None),
    ]
    out += _split(spec)
    out += _expert_plan(spec)
    out += [
        ("model.context_parallel_size", p.cp), ("model.sequence_parallel", p.sp),
        ("model.cp_comm_type", spec.cp_comm[0] if spec.cp_comm else None),
        ("model.hierarchical_context_parallel_sizes", spec.cp_comm[1] if spec.cp_comm else None),
        ("model.recompute_granularity", None if p.recompute == "none" else p.recompute),
    ]
    if p.recompute == "selective":
        # The recipe's own modules are replaced by the plan's (Megatron's default: core_attn).
        out.append(("model.recompute_modules", (p.recompute_modules or "core_attn").split(",")))
    out += [
        ("model.recompute_method", p.recompute_method if p.recompute == "full" else None),
        ("model.recompute_num_layers",
         spec.recompute_num_layers if p.recompute == "full" else None),
        ("model.attention_backend", _Name(f"AttnBackend.{spec.attention_backend}")),
        ("train.train_iters", spec.train_iters),
        ("train.global_batch_size", w.global_batch_size), ("train.micro_batch_size", p.mbs),
        ("scheduler.lr_decay_style", b.lr_decay_style),
        ("scheduler.lr_warmup_iters", spec.warmup_iters),
        ("scheduler.lr_decay_iters", spec.decay_iters),
        ("optimizer.lr", b.lr), ("optimizer.min_lr", b.min_lr),
        ("optimizer.weight_decay", b.weight_decay),
        ("optimizer.adam_beta1", b.adam_beta1), ("optimizer.adam_beta2", b.adam_beta2),
        ("optimizer.adam_eps", b.adam_eps), ("optimizer.clip_grad", b.clip_grad),
        ("optimizer.use_distributed_optimizer", p.distributed_optimizer),
        ("ddp.use_distributed_optimizer", p.distributed_optimizer),
        # Megatron-FSDP as priced (``SoftwareFeatures.megatron_fsdp``), as the Bridge
        # FSDP recipes switch it on (perf_recipes/llama: ddp.use_megatron_fsdp,
        # data_parallel_sharding_strategy "optim_grads_params").
        ("ddp.use_megatron_fsdp", spec.software.megatron_fsdp),
        ("ddp.overlap_grad_reduce", spec.software.overlap_grad_reduce),
        ("ddp.overlap_param_gather", spec.overlap_param_gather),
        ("ddp.grad_reduce_in_fp32", spec.grad_reduce_dtype == "fp32"),
        ("model.gradient_accumulation_fusion", spec.software.gradient_accumulation_fusion),
        ("model.cuda_graph_impl", spec.cuda_graph[0] if spec.cuda_graph else "none"),
        ("model.cuda_graph_scope", spec.cuda_graph[1] if spec.cuda_graph else []),
        # GPTModelProvider fuses the loss by default; the prediction priced the stack's.
        ("model.cross_entropy_loss_fusion", spec.cross_entropy_fusion_impl is not None),
        ("mixed_precision.grad_reduce_in_fp32", spec.grad_reduce_dtype == "fp32"),
        ("dataset.seq_length", w.seq_len),
        ("tokenizer.tokenizer_type",
         "HuggingFaceTokenizer" if not spec.family.placeholder else "NullTokenizer"),
    ]
    if spec.software.megatron_fsdp:
        out += [("ddp.data_parallel_sharding_strategy", MEGATRON_FSDP_SHARDING["full-shard"]),
                ("checkpoint.ckpt_format", "fsdp_dtensor")]
    if spec.software.cpu_offload_layers:
        # as the Bridge FSDP recipes offload (perf_recipes/llama): activations only
        out += [("model.cpu_offloading", True),
                ("model.cpu_offloading_num_layers", spec.software.cpu_offload_layers),
                ("model.cpu_offloading_weights", False)]
    if spec.cross_entropy_fusion_impl:
        out.append(("model.cross_entropy_fusion_impl", spec.cross_entropy_fusion_impl))
    if spec.family.placeholder:
        out.append(("tokenizer.vocab_size", spec.family.tokenizer_vocab_size - 1))
    else:
        out.append(("tokenizer.tokenizer_model", spec.family.tokenizer_model))
    return out


class _Name(str):
    """A Python name written as is (not quoted)."""


def _render_value(v) -> str:
    return str(v) if isinstance(v, _Name) else _py(v)


def _comm_overlap_args(spec: LaunchSpec) -> str:
    """CommOverlapConfig's arguments; the pipeline ones only for the interleaved
    schedule, where Bridge would otherwise choose them itself."""
    args = [f"tp_comm_overlap={spec.tp_comm_overlap!r}"]
    if spec.interleaved:
        args += [f"overlap_p2p_comm={spec.overlap_p2p_comm!r}",
                 f"batch_p2p_comm={not spec.overlap_p2p_comm!r}"]
    if spec.moe is not None:
        args.append(f"overlap_moe_expert_parallel_comm={spec.moe.a2a_overlap!r}")
    return ", ".join(args)


def bridge_text(spec: LaunchSpec) -> str:
    """bridge_recipe.py."""
    module, function = spec.family.bridge_recipe.split(":")
    head = ['"""Megatron-Bridge (NeMo 2) pre-training of the best plan, written by autoconfig.', ""]
    head += spec.describe()
    head += ["", "Run: torchrun --nproc-per-node <GPUs> bridge_recipe.py (one node), or",
             "sbatch launch_bridge.sbatch. DATA_PATH (a preprocessed dataset prefix) selects",
             "real data, otherwise the recipe's mock data; CHECKPOINT_DIR saves and resumes.",
             '"""', "",
             "import os", "",
             "import torch.nn.functional as F",
             "from megatron.core.transformer.enums import AttnBackend",
             f"from {module} import {function}",
             "from megatron.bridge.training.comm_overlap import CommOverlapConfig",
             "from megatron.bridge.training.gpt_step import forward_step",
             "from megatron.bridge.training.mixed_precision import get_mixed_precision_config",
             "from megatron.bridge.training.pretrain import pretrain", "", "",
             "def autoconfig_config():",
             f'    """{function}() with the model, plan, stack and schedule autoconfig chose."""',
             f"    cfg = {function}()",
             f"    cfg.mixed_precision = get_mixed_precision_config("
             f"{MIXED_PRECISION[_precision_key(spec)]!r})",
             f"    cfg.comm_overlap = CommOverlapConfig({_comm_overlap_args(spec)})"]
    body = [f"    cfg.{key} = {_render_value(value)}" for key, value in assignments(spec)]
    tail = ['    data_path = os.environ.get("DATA_PATH")',
            "    if data_path:",
            "        cfg.dataset.blend = ([data_path], None)",
            '    checkpoint_dir = os.environ.get("CHECKPOINT_DIR")',
            "    if checkpoint_dir:",
            "        cfg.checkpoint.save = checkpoint_dir",
            "        cfg.checkpoint.load = checkpoint_dir",
            "    return cfg", "", "",
            'if __name__ == "__main__":',
            "    pretrain(config=autoconfig_config(), forward_step_func=forward_step)"]
    return "\n".join(head + body + tail) + "\n"
