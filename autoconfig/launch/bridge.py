"""NeMo 2 / Megatron-Bridge: a Python file that starts from the model family's
recipe and sets the plan's, the stack's and the base config's fields.

Field names are those of Megatron-Bridge's ConfigContainer sections (model =
GPTModelProvider/TransformerConfig, train, scheduler, optimizer, ddp,
comm_overlap, mixed_precision, dataset, tokenizer, checkpoint); tests check each
assignment against the fields recorded from the fetched Megatron-Bridge and
Megatron-LM sources (tests/data/megatron_bridge_fields.json).
Run it: ``torchrun --nproc-per-node 8 bridge_recipe.py`` on one node, or
submit launch_bridge.sbatch (the same SLURM template as launch.sbatch).
"""

from autoconfig.launch.spec import LaunchSpec

MIXED_PRECISION = {None: "bf16_mixed", "tensorwise": "bf16_with_fp8_current_scaling_mixed",
                   "delayed": "bf16_with_fp8_delayed_scaling_mixed",
                   "mxfp8": "bf16_with_mxfp8_mixed"}
"""Megatron-Bridge training/mixed_precision.py recipe names by FP8 recipe."""


def _py(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def assignments(spec: LaunchSpec) -> list[tuple[str, object]]:
    """(``section.field``, value) for every field set, in order; values are Python
    literals except the few names the file imports (activation, attention backend)."""
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
    out += [
        ("model.tensor_model_parallel_size", p.tp),
        ("model.pipeline_model_parallel_size", p.pp),
        ("model.virtual_pipeline_model_parallel_size", p.vp if p.vp > 1 else None),
    ]
    if spec.embedding_and_loss_split:
        out += [("model.account_for_embedding_in_pipeline_split", True),
                ("model.account_for_loss_in_pipeline_split", True)]
    else:
        out += [("model.num_layers_in_first_pipeline_stage", p.first_stage_layers or None),
                ("model.num_layers_in_last_pipeline_stage", p.last_stage_layers or None)]
    out += [
        ("model.context_parallel_size", p.cp), ("model.sequence_parallel", p.sp),
        ("model.recompute_granularity", None if p.recompute == "none" else p.recompute),
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
        ("ddp.overlap_grad_reduce", spec.software.overlap_grad_reduce),
        ("ddp.overlap_param_gather", spec.overlap_param_gather),
        ("ddp.grad_reduce_in_fp32", spec.grad_reduce_dtype == "fp32"),
        ("mixed_precision.grad_reduce_in_fp32", spec.grad_reduce_dtype == "fp32"),
        ("dataset.seq_length", w.seq_len),
        ("tokenizer.tokenizer_type",
         "HuggingFaceTokenizer" if not spec.family.placeholder else "NullTokenizer"),
    ]
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
             f"{MIXED_PRECISION[spec.fp8_recipe]!r})",
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
