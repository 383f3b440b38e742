"""NeMo 1 (megatron_t5_pretraining.py) Hydra overrides for encoder-decoder models.

They compose against NeMo's examples/nlp/language_modeling/conf/megatron_t5_config.yaml,
whose defaults put conf/megatron_model_base_config.yaml at model.encoder and
model.decoder (both recorded with their commit in tests/data/). The rules are
nemo1.py's: a key the composed yaml has is set plainly, one it lacks with ``+``.

How NeMo 8cfedd7 reads them (nemo/collections/nlp/models/language_modeling/):
with mcore_t5, megatron_lm_encoder_decoder_model.py build_transformer_config copies
every model.encoder key to the top level and builds one megatron-core
TransformerConfig from it (num_layers, activation, recompute, position type:
the encoder's, so encoder and decoder get the same values here), and
model_provider_func builds the decoder block with model.decoder.num_layers
layers. megatron_base_model.py build_transformer_config reads the recompute
from activations_checkpoint_granularity/method/num_layers and sets fp8 None;
build_model_parallel_config reads sequence_parallel from the model section.
"""

from autoconfig.core.model import ModelSpec
from autoconfig.launch.encdec import SENTINEL_TOKENS, core_t5_refusal
from autoconfig.launch.spec import LaunchSpec

ADDED_KEYS = frozenset({
    "model.sequence_parallel", "model.optim.sched.warmup_steps",
    "model.optim.sched.constant_steps", "model.optim.overlap_grad_sync",
    "model.optim.overlap_param_sync", "model.optim.grad_sync_dtype",
})
"""Keys megatron_t5_config.yaml (with its defaults) lacks; tests/test_launch_t5.py
composes the overrides against the recorded yaml."""
SCHEDULERS = {"cosine": "CosineAnnealing", "linear": "WarmupAnnealing",
              "constant": "WarmupPolicy"}
"""NeMo scheduler (nemo/core/optim/lr_scheduler.py) for a base config's decay style."""
POSITIONS = {"learned": "learned_absolute", "relative": "relative", "rope": "rope"}


def not_written_reason(spec: LaunchSpec) -> str | None:
    """Why NeMo 1 cannot train this encoder-decoder model or plan (None: it can)."""
    target = "nemo_overrides.txt"
    core = core_t5_refusal(spec.model, spec.plan, target)
    if core:
        return core
    if spec.workload.precision == "fp8":
        return (f"no {target}: NeMo 1's megatron-core T5 runs without FP8 "
                "(megatron_base_model.py build_transformer_config sets fp8 None)")
    style = spec.base.lr_decay_style
    if style not in SCHEDULERS:
        return (f"no {target}: no NeMo 1 scheduler for lr decay style {style!r} "
                f"(mapped: {', '.join(SCHEDULERS)})")
    return None


def bias_activation_fusion(m: ModelSpec) -> bool:
    """Whether megatron-core may fuse the MLP bias into the activation: TransformerConfig
    refuses it for ReLU (ReGLU) and for an ungated GELU without biases
    (transformer_config.py __post_init__, megatron-core 0.16.1); NeMo's default is on."""
    if m.mlp_kind == "reglu":
        return False
    return m.mlp_kind != "gelu" or m.has_bias


def recompute_keys(spec: LaunchSpec, prefix: str) -> dict[str, object]:
    """activations_checkpoint_* of one stack: all three always, since the base yaml's
    num_layers 1 next to selective recompute makes TransformerConfig raise."""
    p = spec.plan
    full = p.recompute == "full"
    return {f"{prefix}.activations_checkpoint_granularity":
            None if p.recompute == "none" else p.recompute,
            f"{prefix}.activations_checkpoint_method": p.recompute_method if full else None,
            f"{prefix}.activations_checkpoint_num_layers":
            spec.recompute_num_layers if full else None}


def stack_keys(spec: LaunchSpec, prefix: str, layers: int) -> dict[str, object]:
    """model.encoder or model.decoder: the shape, architecture and recompute."""
    m, b = spec.model, spec.base
    return {f"{prefix}.num_layers": layers, f"{prefix}.hidden_size": m.hidden_size,
            f"{prefix}.ffn_hidden_size": m.ffn_hidden_size,
            f"{prefix}.num_attention_heads": m.num_heads,
            f"{prefix}.kv_channels": m.kv_channels or None,
            f"{prefix}.init_method_std": b.init_method_std,
            f"{prefix}.hidden_dropout": m.hidden_dropout,
            f"{prefix}.attention_dropout": m.attention_dropout,
            f"{prefix}.position_embedding_type": POSITIONS[m.position_embedding],
            f"{prefix}.bias": m.has_bias, f"{prefix}.normalization": m.norm_kind,
            # NeMo's geglu is exact GELU, gated (utils_funcs.py activation_to_func)
            f"{prefix}.activation": m.mlp_kind,
            f"{prefix}.bias_activation_fusion": bias_activation_fusion(m),
            # The yaml's 1 (NeMo's legacy "no MoE") is one routed expert to megatron-core,
            # which then refuses biases with TP > 1 ("Bias in Moe is only supported when
            # ETP==1", transformer_config.py 0.16.1); only NeMo's legacy T5 reads the key.
            f"{prefix}.num_moe_experts": None,
            **recompute_keys(spec, prefix)}


def optimizer_keys(spec: LaunchSpec) -> dict[str, object]:
    """AdamW and the schedule. The yaml's warmup_ratio goes: NeMo's WarmupPolicy refuses
    it next to warmup_steps."""
    p, b = spec.plan, spec.base
    name = SCHEDULERS[b.lr_decay_style]
    o: dict[str, object] = {
        "model.optim.name": "distributed_fused_adam" if p.distributed_optimizer else "fused_adam",
        "model.optim.lr": b.lr, "model.optim.weight_decay": b.weight_decay,
        "model.optim.betas": f"[{b.adam_beta1:.6g},{b.adam_beta2:.6g}]", "model.optim.eps": b.adam_eps,
        "model.optim.sched.name": name, "model.optim.sched.warmup_steps": spec.warmup_iters,
        "model.optim.sched.warmup_ratio": None, "model.optim.sched.min_lr": b.min_lr}
    if name == "CosineAnnealing":   # decay ends at decay_iters, then min_lr (as nemo1.py)
        o["model.optim.sched.constant_steps"] = max(0, spec.train_iters - spec.decay_iters)
    if p.distributed_optimizer:
        o.update({"model.optim.overlap_grad_sync": spec.software.overlap_grad_reduce,
                  "model.optim.overlap_param_sync": spec.overlap_param_gather,
                  "model.optim.grad_sync_dtype": spec.grad_reduce_dtype})
    return o


def tokenizer_keys(spec: LaunchSpec) -> dict[str, object]:
    """NeMo's tokenizer section: WordPiece from a vocab file, else a SentencePiece model;
    NeMo adds the sentinels itself (megatron_t5_model.py)."""
    if spec.family.tokenizer_type == "BertWordPieceCase":
        tokenizer = {"model.tokenizer.library": "megatron",
                     "model.tokenizer.type": "BertWordPieceCase",
                     "model.tokenizer.vocab_file": "${oc.env:VOCAB_FILE}"}
    else:
        tokenizer = {"model.tokenizer.library": "sentencepiece", "model.tokenizer.type": None,
                     "model.tokenizer.model": "${oc.env:TOKENIZER_MODEL}"}
    return {**tokenizer, "model.tokenizer.num_sentinel_tokens": SENTINEL_TOKENS}


def overrides_dict(spec: LaunchSpec) -> dict[str, object]:
    """key -> value (no '+' yet), in a readable order."""
    m, p, w = spec.model, spec.plan, spec.workload
    o: dict[str, object] = {
        # megatron-core's T5 with Transformer Engine and O2 bf16, as the NeMo launcher's
        # conf/training/t5/*.yaml (megatron_amp_O2: the GPT yaml's default too)
        "model.mcore_t5": True, "model.transformer_engine": True,
        "model.megatron_amp_O2": True,
        "model.seq_length": w.seq_len,
        "model.max_position_embeddings": max(w.seq_len, m.seq_len, m.decoder_seq_len),
        "model.data.seq_length_dec": m.decoder_seq_len,
        "model.make_vocab_size_divisible_by": spec.vocab_divisor,
        # mcore_t5 asserts share_token_embeddings (megatron_lm_encoder_decoder_model.py)
        "model.share_token_embeddings": True,
        "model.share_decoder_tokens_head_embeddings": m.tied_embeddings,
    }
    o.update(stack_keys(spec, "model.encoder", m.encoder_layers))
    o.update(stack_keys(spec, "model.decoder", m.decoder_layers))
    o.update({"model.tensor_model_parallel_size": p.tp, "model.pipeline_model_parallel_size": 1,
              "model.sequence_parallel": p.sp, "model.micro_batch_size": p.mbs,
              "model.global_batch_size": w.global_batch_size})
    o.update(optimizer_keys(spec))
    o.update(tokenizer_keys(spec))
    o["model.data.data_prefix"] = "[1.0,${oc.env:DATA_PATH}]"
    o["exp_manager.exp_dir"] = "${oc.env:CHECKPOINT_DIR}"
    return o


def notes(spec: LaunchSpec) -> list[str]:
    """Header lines after nemo1.py's: the variables to set, and what the overrides
    cannot say themselves."""
    lines = ["set DATA_PATH, CHECKPOINT_DIR and VOCAB_FILE (WordPiece) or TOKENIZER_MODEL "
             "(SentencePiece)"]
    b = spec.base
    if SCHEDULERS.get(b.lr_decay_style) == "WarmupAnnealing" \
            and spec.decay_iters < spec.train_iters:
        lines.append(f"schedule: NeMo 1 has no linear decay that then holds min_lr, so it "
                     f"decays over all {spec.train_iters} steps (Megatron-LM: "
                     f"{spec.decay_iters}); WarmupAnnealing")
    return lines
