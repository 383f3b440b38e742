"""NeMo 1 (megatron_gpt_pretraining.py / NeMo-Framework-Launcher) Hydra overrides.

They compose against NeMo's examples/nlp/language_modeling/conf/megatron_gpt_config.yaml
(recorded with its commit in tests/data/): a key that the base yaml has is set
plainly, a key it lacks is added with ``+`` (Hydra refuses either the other way
round). The full model shape and architecture, the plan, the stack's overlaps,
precision and the base config's optimizer and schedule are all set, so nothing
falls back to the yaml's 12-layer GPT defaults. Paths are ``${oc.env:VAR}``
placeholders resolved from the environment at start.

Mixture-of-experts (NeMo 8cfedd7, nemo/collections/nlp/models/language_modeling/):
megatron_gpt_model.py reads num_moe_experts, moe_router_topk, moe_grouped_gemm,
moe_router_load_balancing_type and moe_aux_loss_coeff from the model config, and
megatron_base_model.py build_transformer_config passes every other
TransformerConfig field the config has (moe_ffn_hidden_size, moe_layer_freq,
qk_layernorm, the dispatcher...) straight through. Its default layer spec
(``te_gpt``) builds one layer kind for all layers and no Q/K norm, so MoE and
QK-norm models ask for ``decoder_block_gpt`` (megatron-core
get_gpt_decoder_block_spec: per-layer kinds and norms from the config). What
NeMo 1 cannot build gets no file and a reason (``not_written_reason``).

Encoder-decoder models (T5, mT5) get megatron_t5_pretraining.py's overrides
(nemo1_t5.py) against megatron_t5_config.yaml instead.
"""

from autoconfig.launch import nemo1_t5
from autoconfig.launch.encdec import NEMO_SCRIPT
from autoconfig.launch.spec import LaunchSpec

# Keys of megatron_gpt_config.yaml (NeMo 8cfedd7) that the overrides set without '+'
# are checked against the recorded yaml by tests/test_launch_nemo.py; these are
# the ones it lacks.
ADDED_KEYS = frozenset({
    "model.context_parallel_size", "model.rotary_base", "model.optim.eps",
    "model.optim.overlap_grad_sync", "model.optim.overlap_param_sync",
    "model.optim.grad_sync_dtype", "model.num_layers_in_first_pipeline_stage",
    "model.num_layers_in_last_pipeline_stage", "model.fp8_recipe",
    "model.account_for_embedding_in_pipeline_split", "model.account_for_loss_in_pipeline_split",
    "model.name", "model.qk_layernorm", "model.num_moe_experts", "model.moe_router_topk",
    "model.moe_ffn_hidden_size", "model.moe_shared_expert_intermediate_size",
    "model.moe_layer_freq", "model.moe_grouped_gemm", "model.moe_router_load_balancing_type",
    "model.moe_aux_loss_coeff", "model.moe_router_score_function", "model.moe_router_pre_softmax",
    "model.moe_router_enable_expert_bias", "model.moe_router_topk_scaling_factor",
    "model.moe_router_num_groups", "model.moe_router_group_topk", "model.moe_router_dtype",
    "model.moe_token_dispatcher_type", "model.moe_flex_dispatcher_backend",
    "model.overlap_moe_expert_parallel_comm",
})
CROSS_ENTROPY_KEYS = frozenset({"model.cross_entropy_loss_fusion",
                                "model.cross_entropy_fusion_impl"})
"""megatron-core TransformerConfig fields (from ModelParallelConfig) that neither NeMo
yaml has; build_transformer_config passes them through to the model's loss."""
NEMO_TOKENIZERS = {
    # Megatron tokenizer type -> (library, type) of NeMo's tokenizer section.
    "GPT2BPETokenizer": ("megatron", "GPT2BPETokenizer"),
    "HuggingFaceTokenizer": ("huggingface", None),
    "NullTokenizer": ("megatron", "GPT2BPETokenizer"),
}


def not_written_reason(spec: LaunchSpec) -> str | None:
    """Why NeMo 1 cannot run this model or plan (None: it can)."""
    m, p = spec.model, spec.plan
    t5 = nemo1_t5.not_written_reason(spec) if m.is_encoder_decoder else None
    if t5:
        return t5
    if spec.workload.precision == "nvfp4":
        # Megatron-Bridge (bf16_with_nvfp4_mixed) and Megatron-LM (--fp4-format) are
        # where NVFP4 training is set up; NeMo 1 overrides are written for bf16 and FP8.
        return ("no nemo_overrides.txt: NVFP4 runs are written for Megatron-LM and "
                "Megatron-Bridge only (NeMo 1 overrides cover bf16 and FP8)")
    if m.attention_kind == "mla":
        # megatron_base_model.py only swaps in MLATransformerConfig; no NeMo 1 config or
        # layer spec builds MLA layers; NeMo's DeepSeek is NeMo 2 (llm/gpt/model/deepseek.py).
        return ("no nemo_overrides.txt: NeMo 1 does not support multi-latent attention "
                "(no NeMo 1 config or default layer spec builds it); use Megatron-LM or "
                "Megatron-Bridge")
    if m.sliding_window or m.attention_sinks:
        # megatron_gpt_config.yaml has neither window_size nor softmax_type, and NeMo 1's
        # GPT model builds its TransformerConfig from the yaml's keys only
        return (f"no nemo_overrides.txt: NeMo 1 cannot build {m.name}'s "
                + " and ".join(what for what, has in (
                    (f"{m.sliding_window}-token banded attention", m.sliding_window),
                    ("learned attention sinks", m.attention_sinks)) if has)
                + " (megatron_gpt_config.yaml has no window_size or softmax_type); use "
                "Megatron-LM or Megatron-Bridge")
    if spec.software.megatron_fsdp:
        # megatron_gpt_config.yaml's fsdp switches on torch FSDP (NLPFSDPStrategy), a
        # different framework from the Megatron-FSDP the prediction priced.
        return ("no nemo_overrides.txt: the plan shards with Megatron-FSDP, and NeMo 1's "
                "fsdp option is PyTorch FSDP; use Megatron-LM or Megatron-Bridge")
    if m.mtp_layers:
        return ("no nemo_overrides.txt: NeMo 1 builds no multi-token-prediction block "
                "(megatron_gpt_model.py model_provider_func passes no mtp_block_spec)")
    if p.recompute_modules:
        return (f"no nemo_overrides.txt: NeMo 1 has no recompute modules (the plan recomputes "
                f"{p.recompute_modules}; its activations_checkpoint_granularity selective "
                "recomputes the attention core only)")
    if spec.cp_comm is not None:
        return (f"no nemo_overrides.txt: the plan's context parallelism runs "
                f"{spec.cp_comm[0]}, and NeMo 1's megatron_gpt_config.yaml has no "
                "cp_comm_type (its ring, p2p, only); use Megatron-LM or Megatron-Bridge")
    if spec.moe is not None and p.etp != p.tp:
        return (f"no nemo_overrides.txt: the plan's expert tensor parallelism ({p.etp}) differs "
                f"from TP ({p.tp}), and NeMo 1 initialises model parallelism without it "
                "(megatron_init.py initialize_model_parallel_for_nemo: ETP = TP)")
    return None


def fuses_grad_accumulation(spec: LaunchSpec) -> bool:
    """Whether NeMo 1 runs this plan with gradient accumulation fused into the GEMMs.

    NeMo 8cfedd7 megatron_base_model.py ``_validate_config`` switches the fusion off,
    whatever the yaml asks, when DP > 1 and PP = 1 without the distributed optimizer:
    its own async data-parallel all-reduce reads ``param.grad``, which a fused
    GEMM never writes. Writing that value keeps the file honest; ``unfused_note``
    says what it costs. (Its other two conditions never hold here: the files set
    megatron_amp_O2 and never FSDP.)
    """
    p = spec.plan
    pp = 1 if spec.model.is_encoder_decoder else p.pp   # NeMo 1 T5 runs PP 1
    forced_off = p.dp > 1 and pp == 1 and not p.distributed_optimizer
    return spec.software.gradient_accumulation_fusion and not forced_off


def unfused_note(spec: LaunchSpec) -> list[str]:
    """A header line when NeMo 1 will not fuse what the prediction assumed fused."""
    if fuses_grad_accumulation(spec) == spec.software.gradient_accumulation_fusion:
        return []
    return ["NeMo 1 fuses gradient accumulation only with PP > 1, DP 1 or the distributed "
            "optimizer (megatron_base_model.py _validate_config), so this plan runs it "
            "unfused: `autoconfig estimate ... --no-gradient-accumulation-fusion` predicts "
            "that; the distributed optimizer keeps it fused"]


def _experts(spec: LaunchSpec) -> dict[str, object]:
    """Layer spec, attention extras and MoE keys (none for a dense GPT/Llama shape)."""
    m, moe = spec.model, spec.moe
    o: dict[str, object] = {}
    if moe is not None or m.qk_norm:
        o["model.name"] = "decoder_block_gpt"
    if m.kv_channels:
        o["model.kv_channels"] = m.kv_channels
    if m.qk_norm:
        o["model.qk_layernorm"] = True
    if moe is None:
        return o
    r = moe.router
    o.update({"model.expert_model_parallel_size": moe.ep,
              "model.num_moe_experts": moe.num_experts, "model.moe_router_topk": moe.topk,
              "model.moe_ffn_hidden_size": moe.ffn_hidden_size})
    if moe.shared_ffn_hidden_size:
        o["model.moe_shared_expert_intermediate_size"] = moe.shared_ffn_hidden_size
    o.update({"model.moe_layer_freq": 1 if moe.every_layer
              else "[" + ",".join(map(str, moe.layer_pattern)) + "]",
              "model.moe_grouped_gemm": moe.grouped_gemm,
              "model.moe_router_load_balancing_type": r.load_balancing_type,
              "model.moe_aux_loss_coeff": r.aux_loss_coeff})
    if r.score_function != "softmax":
        o["model.moe_router_score_function"] = r.score_function
    if r.pre_softmax:
        o["model.moe_router_pre_softmax"] = True
    if r.expert_bias:
        o["model.moe_router_enable_expert_bias"] = True
    if r.topk_scaling_factor:
        o["model.moe_router_topk_scaling_factor"] = r.topk_scaling_factor
    if r.num_groups:
        o.update({"model.moe_router_num_groups": r.num_groups,
                  "model.moe_router_group_topk": r.group_topk})
    if moe.router_dtype:
        o["model.moe_router_dtype"] = moe.router_dtype
    o["model.moe_token_dispatcher_type"] = moe.dispatcher
    if moe.flex_backend:
        o["model.moe_flex_dispatcher_backend"] = moe.flex_backend
    if moe.a2a_overlap:
        o["model.overlap_moe_expert_parallel_comm"] = True
    return o


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def overrides_dict(spec: LaunchSpec) -> dict[str, object]:
    """key -> value (no '+' yet), in a readable order."""
    m, p, w, b = spec.model, spec.plan, spec.workload, spec.base
    o: dict[str, object] = {
        # shape and architecture
        "model.num_layers": m.num_layers, "model.hidden_size": m.hidden_size,
        "model.ffn_hidden_size": m.ffn_hidden_size, "model.num_attention_heads": m.num_heads,
        "model.num_query_groups": m.num_kv_heads if m.num_kv_heads != m.num_heads else None,
        "model.encoder_seq_length": w.seq_len,
        "model.max_position_embeddings": max(w.seq_len, m.seq_len),
        "model.activation": "swiglu" if m.mlp_kind == "swiglu" else "gelu",
        "model.normalization": m.norm_kind, "model.bias": m.has_bias,
        "model.position_embedding_type": ("rope" if m.position_embedding == "rope"
                                          else "learned_absolute"),
        "model.share_embeddings_and_output_weights": m.tied_embeddings,
        "model.hidden_dropout": m.hidden_dropout, "model.attention_dropout": m.attention_dropout,
        "model.init_method_std": b.init_method_std,
        "model.make_vocab_size_divisible_by": spec.vocab_divisor,
        # plan
        "model.tensor_model_parallel_size": p.tp, "model.pipeline_model_parallel_size": p.pp,
        "model.virtual_pipeline_model_parallel_size": p.vp if p.vp > 1 else None,
        "model.context_parallel_size": p.cp, "model.sequence_parallel": p.sp,
        "model.micro_batch_size": p.mbs, "model.global_batch_size": w.global_batch_size,
    }
    if m.position_embedding == "rope":
        o["model.rotary_base"] = spec.family.rotary_base
    o.update(_experts(spec))
    if spec.embedding_and_loss_split:
        o["model.account_for_embedding_in_pipeline_split"] = True
        o["model.account_for_loss_in_pipeline_split"] = True
    else:
        if p.pp > 1 and p.first_stage_layers:
            o["model.num_layers_in_first_pipeline_stage"] = p.first_stage_layers
        if p.pp > 1 and p.last_stage_layers:
            o["model.num_layers_in_last_pipeline_stage"] = p.last_stage_layers
    if p.recompute == "none":
        o["model.activations_checkpoint_granularity"] = None
    elif p.recompute == "selective":
        o["model.activations_checkpoint_granularity"] = "selective"
    else:
        o.update({"model.activations_checkpoint_granularity": "full",
                  "model.activations_checkpoint_method": p.recompute_method,
                  "model.activations_checkpoint_num_layers": spec.recompute_num_layers})
    # stack and precision: Transformer Engine always (fused attention, FP8 and context
    # parallelism need it; the predictions assume it)
    o.update({"model.transformer_engine": True,
              "model.ub_tp_comm_overlap": spec.tp_comm_overlap,
              "model.gradient_accumulation_fusion": fuses_grad_accumulation(spec),
              "model.fp8": w.precision == "fp8"})
    if spec.interleaved:
        # NeMo 1's yaml leaves interleaved pipeline sends batched and blocking.
        o.update({"model.overlap_p2p_comm": spec.overlap_p2p_comm,
                  "model.batch_p2p_comm": not spec.overlap_p2p_comm})
    if w.precision == "fp8":
        o["model.fp8_hybrid"] = spec.fp8_format == "hybrid"
        o["model.fp8_recipe"] = spec.fp8_recipe
    if spec.software.cpu_offload_layers:
        # activations only, as priced (the yaml offloads weights too by default)
        o.update({"model.cpu_offloading": True,
                  "model.cpu_offloading_num_layers": spec.software.cpu_offload_layers,
                  "model.cpu_offloading_activations": True,
                  "model.cpu_offloading_weights": False})
    # optimizer and schedule (base config)
    o.update({"model.optim.name": ("distributed_fused_adam" if p.distributed_optimizer
                                   else "fused_adam"),
              "model.optim.lr": b.lr, "model.optim.weight_decay": b.weight_decay,
              "model.optim.betas": f"[{_value(b.adam_beta1)},{_value(b.adam_beta2)}]",
              "model.optim.eps": b.adam_eps,
              "model.optim.sched.name": "CosineAnnealing",
              "model.optim.sched.warmup_steps": spec.warmup_iters,
              "model.optim.sched.constant_steps": max(0, spec.train_iters - spec.decay_iters),
              "model.optim.sched.min_lr": b.min_lr})
    if p.distributed_optimizer:
        o.update({"model.optim.overlap_grad_sync": spec.software.overlap_grad_reduce,
                  "model.optim.overlap_param_sync": spec.overlap_param_gather,
                  "model.optim.grad_sync_dtype": spec.grad_reduce_dtype})
    # data and tokenizer (placeholders from the environment)
    library, kind = NEMO_TOKENIZERS.get(spec.family.tokenizer_type, ("huggingface", None))
    o["model.tokenizer.library"] = library
    if library == "huggingface":
        o["model.tokenizer.type"] = spec.family.tokenizer_model
    else:
        o.update({"model.tokenizer.type": kind,
                  "model.tokenizer.vocab_file": "${oc.env:VOCAB_FILE}",
                  "model.tokenizer.merge_file": "${oc.env:MERGE_FILE}"})
    o["model.data.data_prefix"] = "[1.0,${oc.env:DATA_PATH}]"
    o["exp_manager.exp_dir"] = "${oc.env:CHECKPOINT_DIR}"
    return o


def nemo1_overrides(spec: LaunchSpec) -> list[str]:
    """``key=value`` lines, ``+key=value`` for keys the base yaml lacks."""
    if spec.model.is_encoder_decoder:
        # megatron_t5_config.yaml has no such key, and megatron-core's default is off
        fusion = {"model.gradient_accumulation_fusion": fuses_grad_accumulation(spec)}
        added = nemo1_t5.ADDED_KEYS | fusion.keys()
        overrides = {**nemo1_t5.overrides_dict(spec), **fusion}
    else:
        added, overrides = ADDED_KEYS, overrides_dict(spec)
    overrides = {**trainer_overrides(spec), **overrides, **_cross_entropy(spec)}
    added = added | CROSS_ENTROPY_KEYS
    return [f"{'+' if key in added else ''}{key}={_value(value)}"
            for key, value in overrides.items()]


def _cross_entropy(spec: LaunchSpec) -> dict[str, object]:
    """The fused loss of the stack (nothing for megatron-core's unfused default)."""
    if spec.cross_entropy_fusion_impl is None:
        return {}
    return {"model.cross_entropy_loss_fusion": True,
            "model.cross_entropy_fusion_impl": spec.cross_entropy_fusion_impl}


def trainer_overrides(spec: LaunchSpec) -> dict[str, object]:
    """The trainer keys every model's overrides start with (GPT and T5)."""
    return {"trainer.num_nodes": spec.cluster.nodes,
            "trainer.devices": spec.cluster.gpus_per_node,
            "trainer.precision": "bf16", "trainer.max_steps": spec.train_iters,
            "trainer.gradient_clip_val": spec.base.clip_grad}


def entry_point(spec: LaunchSpec) -> tuple[str, str]:
    """(script, Hydra config) in NeMo's examples/nlp/language_modeling/ that the
    overrides are for."""
    if spec.model.is_encoder_decoder:
        return NEMO_SCRIPT, "megatron_t5_config.yaml"
    return "megatron_gpt_pretraining.py", "megatron_gpt_config.yaml"


def nemo1_text(spec: LaunchSpec) -> str:
    """nemo_overrides.txt: comment header, one override per line."""
    script, config = entry_point(spec)
    head = [f"# {line}" for line in spec.describe()]
    head += [f"# NeMo 1: composes with examples/nlp/language_modeling/conf/{config};",
             "# mapfile -t O < <(grep -v '^#' nemo_overrides.txt) && "
             f'python {script} "${{O[@]}}"']
    head += [f"# {line}" for line in unfused_note(spec)]
    if spec.model.is_encoder_decoder:
        head += [f"# {line}" for line in nemo1_t5.notes(spec)]
    else:
        head += ["# set DATA_PATH, CHECKPOINT_DIR (and VOCAB_FILE, MERGE_FILE for GPT-2 BPE)"]
    return "\n".join(head + nemo1_overrides(spec)) + "\n"
