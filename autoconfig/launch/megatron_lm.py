"""Megatron-LM ``pretrain_gpt.py`` (``pretrain_t5.py`` for T5) arguments for a LaunchSpec.

Flag names and choices are those of Megatron-LM's own parser at the commit
recorded in tests/data/megatron_lm_args.json (scripts/megatron_lm_args.py), and
tests build megatron-core's TransformerConfig from them. Arguments come in
groups (model, parallel, stack, precision, schedule, data, output) so the
sbatch script can show them apart. Data, tokenizer and output paths are shell
variables (``$DATA_PATH``...) the user sets: clearly placeholders, never guesses.

Mixture-of-experts and multi-latent attention use only flags of that parser
(core_v0.16.1). MLA keeps Megatron's default rope type for MLA (YaRN) with the
parser's --rotary-scaling-factor 1.0, which is plain RoPE (YaRN with factor 1
changes no frequency and no softmax scale) and, unlike --rope-type rope, works
with Megatron's default rope fusion.

Encoder-decoder models (T5, mT5) run pretrain_t5.py (core_v0.16.1: at the
repository root; newer Megatron-LM: examples/t5/pretrain_t5.py) with its own
shape flags (--encoder/--decoder-num-layers, --encoder/--decoder-seq-length),
a tokenizer with sentinels (--vocab-extra-ids, --legacy-tokenizer) and no
synthetic data. What that script cannot build gets no file and a reason
(``not_written_reason``).
"""

from autoconfig.core.model import ModelSpec
from autoconfig.launch.encdec import (PRETRAIN_SCRIPT, PRETRAIN_SCRIPT_NOTE, SENTINEL_TOKENS,
                                      core_t5_refusal)
from autoconfig.launch.spec import LaunchSpec
from autoconfig.training.stack import MEGATRON_FSDP_SHARDING

DATA_MODES = ("real", "mock")
PLACEHOLDERS = {
    "DATA_PATH": "prefix of your preprocessed dataset (tools/preprocess_data.py output, without "
                 ".bin/.idx)",
    "VOCAB_FILE": "GPT-2 BPE vocab.json",
    "MERGE_FILE": "GPT-2 BPE merges.txt",
    "CHECKPOINT_DIR": "where checkpoints are saved and resumed from",
    "LOG_DIR": "where TensorBoard logs go",
}
ENCODER_DECODER_PLACEHOLDERS = {
    **PLACEHOLDERS,
    "DATA_PATH": "prefix of your preprocessed T5 dataset (tools/preprocess_data.py output "
                 "with the same tokenizer, without .bin/.idx)",
    "VOCAB_FILE": "WordPiece vocab.txt (T5: bert-large-cased)",
    "TOKENIZER_MODEL": "SentencePiece .model file (mT5: the mT5 SentencePiece model)",
}
GPT_SCRIPT = "pretrain_gpt.py"
SPLIT = "99,1,0"
SAVE_INTERVAL = 1000
LOG_INTERVAL = 10
EVAL_INTERVAL = 1000
EVAL_ITERS = 10


def pretrain_script(spec: LaunchSpec) -> str:
    """The Megatron-LM script that trains the model."""
    return PRETRAIN_SCRIPT if spec.model.is_encoder_decoder else GPT_SCRIPT


def not_written_reason(spec: LaunchSpec) -> str | None:
    """Why pretrain_t5.py cannot train this model or plan (None: it can, or it is GPT)."""
    m = spec.model
    target = "megatron_args.sh or launch.sbatch"
    if not m.is_encoder_decoder:
        if m.mlp_kind == "reglu":
            return (f"no {target}: {m.name}'s ReGLU MLP cannot be expressed: Megatron-LM "
                    "core_v0.16.1's only gated activations are --swiglu and --quick-geglu")
        return None
    core = core_t5_refusal(m, spec.plan, target)
    if core:
        return core
    if m.encoder_layers != m.decoder_layers:
        # core_v0.16.1 pretrain_t5.py model_provider: the decoder block spec gets
        # config.num_layers // pp layers, and config.num_layers is --encoder-num-layers
        return (f"no {target}: {m.name} has {m.encoder_layers} encoder and {m.decoder_layers} "
                "decoder layers, and Megatron-LM core_v0.16.1 pretrain_t5.py builds the "
                "decoder with the encoder's count (--decoder-num-layers is read only by the "
                "legacy model), so the file would train a different model")
    if m.mlp_kind == "reglu":
        return (f"no {target}: {m.name}'s ReGLU MLP cannot be expressed: Megatron-LM "
                "core_v0.16.1's only gated activations are --swiglu and --quick-geglu "
                "(arguments.py core_transformer_config_from_args)")
    return None


def model_args(spec: LaunchSpec) -> list[str]:
    """Shape and architecture: exactly the model the prediction sized."""
    if spec.model.is_encoder_decoder:
        return t5_model_args(spec)
    m, w = spec.model, spec.workload
    args = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
            "--ffn-hidden-size", str(m.ffn_hidden_size),
            "--num-attention-heads", str(m.num_heads),
            "--seq-length", str(w.seq_len),
            "--max-position-embeddings", str(max(w.seq_len, m.seq_len))]
    if m.num_kv_heads != m.num_heads and m.attention_kind != "mla":
        args += ["--group-query-attention", "--num-query-groups", str(m.num_kv_heads)]
    args += attention_args(spec) + activation_args(m)
    return args + architecture_args(spec) + experts_args(spec)


def t5_model_args(spec: LaunchSpec) -> list[str]:
    """pretrain_t5.py's shape: encoder and decoder depths and sequence lengths in place
    of --num-layers/--seq-length (validate_args refuses both forms together)."""
    m, w = spec.model, spec.workload
    args = ["--encoder-num-layers", str(m.encoder_layers),
            "--decoder-num-layers", str(m.decoder_layers),
            "--hidden-size", str(m.hidden_size), "--ffn-hidden-size", str(m.ffn_hidden_size),
            "--num-attention-heads", str(m.num_heads),
            "--encoder-seq-length", str(w.seq_len),
            "--decoder-seq-length", str(m.decoder_seq_len),
            # validate_args: at least the encoder's and the decoder's length
            "--max-position-embeddings", str(max(w.seq_len, m.seq_len, m.decoder_seq_len))]
    if m.kv_channels:
        args += ["--kv-channels", str(m.kv_channels)]
    return args + activation_args(m) + architecture_args(spec)


def activation_args(m: ModelSpec) -> list[str]:
    """The MLP's activation, GPT and T5 alike; geglu as --quick-geglu
    (megatron_notes says why)."""
    if m.mlp_kind == "swiglu":
        return ["--swiglu"]
    if m.mlp_kind == "geglu":
        # megatron-core 0.16.1 mlp.py fuses the bias into gelu and swiglu only (a dense
        # MLP raises "Only support fusion of gelu and swiglu"): unfused for quick-GELU.
        return ["--quick-geglu", "--no-bias-gelu-fusion"]
    return []   # gelu; reglu gets no file (not_written_reason)


def position_args(spec: LaunchSpec) -> list[str]:
    """Learned absolute, RoPE with the family's base, or T5's relative bias."""
    m = spec.model
    if m.position_embedding == "rope":
        return ["--position-embedding-type", "rope", "--rotary-base", str(spec.family.rotary_base)]
    if m.position_embedding == "relative":   # T5's bias, 32 buckets (Megatron's default)
        return ["--position-embedding-type", "relative"]
    return ["--position-embedding-type", "learned_absolute"]


def architecture_args(spec: LaunchSpec) -> list[str]:
    """Norm, positions, tying, biases, dropout, init and vocabulary padding."""
    m = spec.model
    args = ["--normalization", "RMSNorm" if m.norm_kind == "rmsnorm" else "LayerNorm"]
    args += position_args(spec)
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.has_bias:
        args.append("--disable-bias-linear")
    return args + ["--attention-dropout", f"{m.attention_dropout:g}",
                   "--hidden-dropout", f"{m.hidden_dropout:g}",
                   "--init-method-std", f"{spec.base.init_method_std:.6g}",
                   "--make-vocab-size-divisible-by", str(spec.vocab_divisor)]


def attention_args(spec: LaunchSpec) -> list[str]:
    """Head width, Q/K norms and multi-latent attention (nothing for GPT/Llama shapes)."""
    m = spec.model
    args = []
    if m.attention_kind == "mla":
        args.append("--multi-latent-attention")
        if m.q_lora_rank:   # 0: queries projected directly (Megatron's None)
            args += ["--q-lora-rank", str(m.q_lora_rank)]
        args += ["--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim", str(m.qk_nope_head_dim),
                 "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim),
                 "--v-head-dim", str(m.v_head_dim)]
    elif m.kv_channels:
        args += ["--kv-channels", str(m.kv_channels)]
    if m.qk_norm or m.attention_kind == "mla":
        # megatron-core builds MLA's norms of the query and KV latents (which the model
        # counts) only with qk_layernorm (gpt_layer_specs.py: *_up_proj with layer norm).
        args.append("--qk-layernorm")
    return args + window_args(m)


SKIP_WINDOW_EVERY = 2
"""megatron-core's window_attn_skip_freq for a model whose every other layer is banded:
one full-attention layer after each windowed one (the banded layer first, as GPT-OSS:
Megatron-Bridge models/gpt_oss/gpt_oss_bridge.py sets window_attn_skip_freq = 2)."""


def window_size(m: ModelSpec) -> tuple[int, int] | None:
    """megatron-core's (left, right) window of a banded layer: a token sees itself and
    the ``sliding_window - 1`` before it (Megatron-Bridge's GPT-OSS bridge:
    ``window_size = (config.sliding_window - 1, 0)``); None for full attention."""
    return (m.sliding_window - 1, 0) if m.sliding_window else None


def window_args(m: ModelSpec) -> list[str]:
    """Banded attention on every other layer and learned attention sinks (GPT-OSS):
    TransformerConfig window_size / window_attn_skip_freq and softmax_type 'learnable'."""
    args = []
    if m.sliding_window:
        left, right = window_size(m)
        args += ["--window-size", f"{left},{right}",
                 "--window-attn-skip-freq", str(SKIP_WINDOW_EVERY)]
    if m.attention_sinks:
        args += ["--softmax-type", "learnable"]
    return args


def experts_args(spec: LaunchSpec) -> list[str]:
    """Routed and shared experts, which layers have them, the router, MTP."""
    moe, m = spec.moe, spec.model
    args = []
    if moe is not None:
        r = moe.router
        args += ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.topk),
                 "--moe-ffn-hidden-size", str(moe.ffn_hidden_size)]
        if moe.shared_ffn_hidden_size:
            args += ["--moe-shared-expert-intermediate-size", str(moe.shared_ffn_hidden_size)]
        args += ["--moe-layer-freq", moe.layer_freq_expression,
                 "--moe-router-load-balancing-type", r.load_balancing_type,
                 "--moe-aux-loss-coeff", f"{r.aux_loss_coeff:g}"]
        if r.score_function != "softmax":
            args += ["--moe-router-score-function", r.score_function]
        if r.pre_softmax:
            args.append("--moe-router-pre-softmax")
        if r.expert_bias:
            args.append("--moe-router-enable-expert-bias")
        if r.topk_scaling_factor:
            args += ["--moe-router-topk-scaling-factor", f"{r.topk_scaling_factor:g}"]
        if r.num_groups:
            args += ["--moe-router-num-groups", str(r.num_groups),
                     "--moe-router-group-topk", str(r.group_topk)]
        if moe.router_dtype:
            args += ["--moe-router-dtype", moe.router_dtype]
    if m.mtp_layers:
        args += ["--mtp-num-layers", str(m.mtp_layers)]
    return args


def parallel_args(spec: LaunchSpec) -> list[str]:
    """The plan: TP/PP/VP/CP/SP, batch, recompute, distributed optimizer, stage split."""
    plan = spec.plan
    args = ["--tensor-model-parallel-size", str(plan.tp),
            "--pipeline-model-parallel-size", str(plan.pp)]
    layout = spec.pipeline_layout
    if plan.vp > 1 and layout is None:
        # --num-virtual-stages-per-pipeline-rank (not --num-layers-per-virtual-pipeline-stage):
        # the only VP form Megatron accepts together with an uneven first/last stage.
        args += ["--num-virtual-stages-per-pipeline-rank", str(plan.vp)]
    if layout is not None:
        # The layout sets the virtual stages itself (Megatron allows one of the VP flags).
        args += ["--pipeline-model-parallel-layout", layout]
    elif spec.embedding_and_loss_split:
        # first = last = (L + 2)/pp - 1: Megatron's own form of this split, the one it
        # accepts with virtual stages when (L + 2) divides by pp x vp
        args += ["--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split"]
    else:
        if plan.pp > 1 and plan.first_stage_layers:
            args += ["--decoder-first-pipeline-num-layers", str(plan.first_stage_layers)]
        if plan.pp > 1 and plan.last_stage_layers:
            args += ["--decoder-last-pipeline-num-layers", str(plan.last_stage_layers)]
    if plan.cp > 1:
        args += ["--context-parallel-size", str(plan.cp)]
    if spec.cp_comm is not None:
        comm, sizes = spec.cp_comm
        args += ["--cp-comm-type", comm]
        if sizes:
            args += ["--hierarchical-context-parallel-sizes", *map(str, sizes)]
    if spec.moe is not None:
        # ETP always: Megatron's default (None) is TP, which the plan may not be.
        args += ["--expert-model-parallel-size", str(plan.ep),
                 "--expert-tensor-parallel-size", str(plan.etp)]
    if plan.sp:
        args.append("--sequence-parallel")
    args += ["--micro-batch-size", str(plan.mbs),
             "--global-batch-size", str(spec.workload.global_batch_size)]
    if plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if plan.recompute_modules:  # '' is Megatron's default, core_attn
            args += ["--recompute-modules", *plan.recompute_modules.split(",")]
    elif plan.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", plan.recompute_method,
                 "--recompute-num-layers", str(spec.recompute_num_layers)]
    if plan.distributed_optimizer:
        args.append("--use-distributed-optimizer")
    if spec.software.megatron_fsdp:
        args += MEGATRON_FSDP_ARGS
    if spec.software.cpu_offload_layers:
        # validate_args sets cpu_offloading from it (activations only, as priced)
        args += ["--cpu-offloading-num-layers", str(spec.software.cpu_offload_layers)]
    return args


MEGATRON_FSDP_ARGS = ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                      MEGATRON_FSDP_SHARDING["full-shard"], "--ckpt-format", "fsdp_dtensor"]
"""Megatron-FSDP as the prediction priced it (``SoftwareFeatures.megatron_fsdp``):
weights, gradients and optimizer state sharded over the data-parallel ranks.
Megatron-LM's validate_args asserts the ``fsdp_dtensor`` checkpoint format with
it (megatron/training/arguments.py, core_v0.16.1)."""


def stack_args(spec: LaunchSpec) -> list[str]:
    """The software features the prediction assumed, switched on exactly."""
    args = ["--transformer-impl", "transformer_engine",
            "--attention-backend", spec.attention_backend]
    if spec.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if spec.software.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if spec.overlap_param_gather:
        args.append("--overlap-param-gather")
    if spec.grad_reduce_dtype == "bf16":
        args.append("--grad-reduce-in-bf16")
    if not spec.software.gradient_accumulation_fusion:
        args.append("--no-gradient-accumulation-fusion")
    if spec.cross_entropy_fusion_impl:
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl",
                 spec.cross_entropy_fusion_impl]
    if spec.interleaved and not spec.overlap_p2p_comm:
        # Megatron-LM overlaps interleaved pipeline sends by default.
        args.append("--no-overlap-p2p-communication")
    graph = spec.cuda_graph
    if graph is not None:
        args += ["--cuda-graph-impl", graph[0], "--cuda-graph-scope", *graph[1]]
        if graph[0] == "local":
            # megatron-core 0.16 validate_args: a whole-iteration graph needs the
            # NaN check off, and local graphs with EP > 1 need the experts padded.
            args.append("--no-check-for-nan-in-loss-and-grad")
            if spec.moe is not None and spec.plan.ep > 1:
                args.append("--moe-pad-experts-for-cuda-graph-inference")
    moe = spec.moe
    if moe is not None:
        if moe.grouped_gemm:
            args.append("--moe-grouped-gemm")
        args += ["--moe-token-dispatcher-type", moe.dispatcher]
        if moe.flex_backend:
            args += ["--moe-flex-dispatcher-backend", moe.flex_backend]
        if moe.a2a_overlap:
            args.append("--overlap-moe-expert-parallel-comm")
    return args


def precision_args(spec: LaunchSpec) -> list[str]:
    args = ["--bf16"]
    if spec.workload.precision == "fp8":
        args += ["--fp8-format", spec.fp8_format, "--fp8-recipe", spec.fp8_recipe]
    elif spec.workload.precision == "nvfp4":
        # As Megatron-Bridge's bf16_with_nvfp4_mixed: the compute weights kept (and
        # gathered) in NVFP4, every layer's GEMMs in FP4.
        args += ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--fp4-param-gather"]
    return args


def schedule_args(spec: LaunchSpec) -> list[str]:
    """Token budget, LR schedule and AdamW from the base config (in samples, so a
    global batch other than the base config's keeps the same schedule)."""
    b = spec.base
    return ["--train-samples", str(spec.train_samples),
            "--lr", f"{b.lr:.6g}", "--min-lr", f"{b.min_lr:.6g}",
            "--lr-decay-style", b.lr_decay_style,
            "--lr-warmup-samples", str(spec.warmup_samples),
            "--lr-decay-samples", str(spec.decay_samples),
            "--weight-decay", f"{b.weight_decay:g}",
            "--adam-beta1", f"{b.adam_beta1:g}", "--adam-beta2", f"{b.adam_beta2:g}",
            "--adam-eps", f"{b.adam_eps:g}", "--clip-grad", f"{b.clip_grad:g}"]


def data_args(spec: LaunchSpec, data: str = "real") -> list[str]:
    """Dataset and tokenizer: placeholders for real data; ``mock`` runs Megatron's
    synthetic data with a NullTokenizer of the same vocabulary (a smoke test)."""
    if data not in DATA_MODES:
        raise ValueError(f"data must be one of {DATA_MODES}, got {data!r}")
    if spec.model.is_encoder_decoder:
        return t5_data_args(spec, data)
    fam = spec.family
    if data == "mock" or fam.placeholder:
        # NullTokenizer adds one end-of-document token to --vocab-size.
        tokenizer = ["--tokenizer-type", "NullTokenizer",
                     "--vocab-size", str(fam.tokenizer_vocab_size - 1)]
    elif fam.tokenizer_type == "GPT2BPETokenizer":
        tokenizer = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "$VOCAB_FILE",
                     "--merge-file", "$MERGE_FILE"]
    else:
        tokenizer = ["--tokenizer-type", fam.tokenizer_type,
                     "--tokenizer-model", fam.tokenizer_model]
    if data == "mock":
        return ["--mock-data"] + tokenizer
    return ["--data-path", "$DATA_PATH", "--split", SPLIT] + tokenizer


def t5_data_args(spec: LaunchSpec, data: str = "real") -> list[str]:
    """pretrain_t5.py's dataset and tokenizer: real data only, the legacy tokenizer with
    the sentinels (megatron_notes says why)."""
    if data != "real":
        raise ValueError(f"no {data} data for {spec.model.name}: pretrain_t5.py has no "
                         "synthetic T5 data")
    fam = spec.family
    if fam.tokenizer_type == "BertWordPieceCase":
        tokenizer = ["--tokenizer-type", fam.tokenizer_type, "--vocab-file", "$VOCAB_FILE"]
    else:
        tokenizer = ["--tokenizer-type", fam.tokenizer_type, "--tokenizer-model",
                     "$TOKENIZER_MODEL"]
    return (["--data-path", "$DATA_PATH", "--split", SPLIT] + tokenizer
            + ["--vocab-extra-ids", str(SENTINEL_TOKENS), "--legacy-tokenizer"])


def megatron_notes(spec: LaunchSpec) -> list[str]:
    """Header lines on what the arguments cannot say themselves (none for a GPT
    with a GeLU or SwiGLU MLP)."""
    m = spec.model
    geglu = (["GeGLU: Megatron-LM has no gated MLP with exact GELU; --quick-geglu "
              "builds the same gated MLP (shapes, parameters) with quick-GELU "
              "x*sigmoid(1.702x), a close approximation of GELU"]
             if m.mlp_kind == "geglu" else [])
    if not m.is_encoder_decoder:
        return geglu
    notes = [PRETRAIN_SCRIPT_NOTE] + geglu
    notes += ["no MOCK_DATA: pretrain_t5.py's T5MaskedWordPieceDataset has no synthetic mode "
              "and needs the tokenizer's sentinel tokens",
              "--legacy-tokenizer: the dataset reads the tokenizer that sized the vocabulary, "
              "sentinels included (as Megatron-LM's own t5_11b_mcore_tp4_pp1 test)"]
    if spec.family.placeholder:
        notes.append(f"no tokenizer recorded for {m.family}: TOKENIZER_MODEL, with Megatron's "
                     f"special tokens and {SENTINEL_TOKENS} sentinels, must fill the "
                     f"{m.vocab_size}-token vocabulary")
    return notes


def output_args(spec: LaunchSpec) -> list[str]:
    return ["--save", "$CHECKPOINT_DIR", "--load", "$CHECKPOINT_DIR",
            "--save-interval", str(SAVE_INTERVAL), "--log-interval", str(LOG_INTERVAL),
            "--eval-interval", str(EVAL_INTERVAL), "--eval-iters", str(EVAL_ITERS),
            "--tensorboard-dir", "$LOG_DIR/tensorboard"]


GROUPS = (("MODEL_ARGS", "model shape and architecture", model_args),
          ("PARALLEL_ARGS", "the parallel plan", parallel_args),
          ("STACK_ARGS", "software features the prediction assumed", stack_args),
          ("PRECISION_ARGS", "precision", precision_args),
          ("SCHEDULE_ARGS", "token budget, LR schedule, optimizer (base config)", schedule_args),
          ("OUTPUT_ARGS", "checkpoints and logs (placeholders)", output_args))


def megatron_args(spec: LaunchSpec, data: str = "real") -> list[str]:
    """Every argument, in group order, data last."""
    args = []
    for _, _, build in GROUPS:
        args += build(spec)
    return args + data_args(spec, data)


def used_placeholders(args: list[str]) -> list[str]:
    """The $VARIABLES the arguments need, in order of first use."""
    names = []
    for token in args:
        if token.startswith("$"):
            name = token[1:].split("/")[0]
            if name not in names:
                names.append(name)
    return names


def shell_word(token: str) -> str:
    """A token as bash reads it: placeholders double-quoted (expanded), the rest literal."""
    if token.startswith("$"):
        return f'"{token}"'
    if token and all(c.isalnum() or c in "-_.:/=+" for c in token):
        return token
    return "'" + token.replace("'", "'\\''") + "'"


def bash_array(name: str, args: list[str], indent: str = "") -> list[str]:
    """``NAME=(`` one flag (and its value) per line ``)``."""
    lines, i = [f"{indent}{name}=("], 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"{indent}    {args[i]} {shell_word(args[i + 1])}")
            i += 2
        else:
            lines.append(f"{indent}    {args[i]}")
            i += 1
    return lines + [f"{indent})"]


def argument_arrays(spec: LaunchSpec) -> list[str]:
    """The bash arrays both megatron_args.sh and launch.sbatch carry (identical text):
    one per group, then DATA_ARGS chosen by MOCK_DATA=1 (synthetic) or real data
    (real data only for T5)."""
    lines = []
    for name, title, build in GROUPS:
        lines += [f"# {title}"] + bash_array(name, build(spec))
    lines += _t5_data_lines(spec) if spec.model.is_encoder_decoder else _data_lines(spec)
    for name in used_placeholders(output_args(spec)):
        lines.insert(0, f'{name}="${{{name}:-$PWD/{name.lower().replace("_dir", "")}}}"'
                        f"  # {PLACEHOLDERS[name]}")
    names = " ".join(f'"${{{name}[@]}}"' for name, _, _ in GROUPS)
    return lines + [f'MEGATRON_ARGS=({names} "${{DATA_ARGS[@]}}")']


def _data_lines(spec: LaunchSpec) -> list[str]:
    real, mock = data_args(spec, "real"), data_args(spec, "mock")
    lines = ["# data and tokenizer: MOCK_DATA=1 for a smoke test on synthetic data",
             'if [[ "${MOCK_DATA:-0}" == 1 ]]; then']
    lines += bash_array("DATA_ARGS", mock, "    ")
    lines += ["else"]
    for name in used_placeholders(real):
        lines.append(f'    : "${{{name}:?set {name}: {PLACEHOLDERS[name]}}}"')
    return lines + bash_array("DATA_ARGS", real, "    ") + ["fi"]


def _t5_data_lines(spec: LaunchSpec) -> list[str]:
    real = t5_data_args(spec)
    lines = ["# data and tokenizer (pretrain_t5.py has no synthetic data)"]
    for name in used_placeholders(real):
        lines.append(f': "${{{name}:?set {name}: {ENCODER_DECODER_PLACEHOLDERS[name]}}}"')
    return lines + bash_array("DATA_ARGS", real)


def megatron_args_script(spec: LaunchSpec) -> str:
    """megatron_args.sh: source it to get MEGATRON_ARGS (launch.sbatch has the same text)."""
    script = pretrain_script(spec)
    head = ["#!/bin/bash", f"# Megatron-LM {script} arguments of the best plan. Source it:",
            f'#   source megatron_args.sh && torchrun ... {script} "${{MEGATRON_ARGS[@]}}"',
            "# or submit launch.sbatch, which carries the same arguments."]
    head += [f"# {line}" for line in spec.describe() + megatron_notes(spec)]
    body = argument_arrays(spec)
    return "\n".join(head + ["# shellcheck disable=SC2034  # used by whoever sources this"]
                     + body) + "\n"
