"""Click options shared by several commands, and their parsing.

Command modules (``*_cmd.py``) import this module and the library, never each
other. Values are parsed here; what they mean is decided in the library.
"""

import click

from autoconfig.core.plan import RECOMPUTE_KINDS
from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, InputError, shown
from autoconfig.training.context_parallel import CP_COMM_TYPES
from autoconfig.training.space import SWITCH_MODES
from autoconfig.training.stack import (CROSS_ENTROPY_KERNELS, CUDA_GRAPHS, DEFAULT_STACK,
                                       FSDP_SHARDING, GRAD_REDUCE_DTYPES, MOE_DISPATCHERS,
                                       OVERRIDES, resolve_software)


class ListOrAuto(click.ParamType):
    """A comma-separated list (``4,8`` -> (4, 8)) or ``auto`` -> None; each item
    goes through ``parse_item``, which returns None for a bad item."""

    def __init__(self, name: str, parse_item, allowed: str, allow_auto: bool = True) -> None:
        self.name = name
        self._parse_item = parse_item
        self._allowed = allowed
        self._allow_auto = allow_auto

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, tuple):
            return value
        text = str(value).strip().lower()
        if self._allow_auto and text == "auto":
            return None
        values = tuple(self._parse_item(v.strip()) for v in text.split(","))
        if any(v is None for v in values):
            flag = param.opts[0] if param is not None and param.opts else "value"
            auto = ", or auto" if self._allow_auto else ""
            raise InputError(f"invalid {flag} {shown(str(value))}: expected {self._allowed} "
                             f"separated by commas{auto}")
        return values


def positive_int(text: str) -> int | None:
    """A positive integer up to MAX_COUNT, or None."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(MAX_COUNT)):
        return None
    return int(text) if 0 < int(text) <= MAX_COUNT else None


class Count(click.types.IntParamType):
    """An integer option in [low, high] (default high MAX_COUNT): a one-line error
    that names the flag, the (shortened) value and the bounds."""

    name = "integer"

    def __init__(self, low: int = 0, high: int = MAX_COUNT) -> None:
        self.low = low
        self.high = high

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            digits = text[1:] if text[:1] in "+-" else text
            number = int(text) if digits.isascii() and digits.isdigit() else None
        if number is None or not self.low <= number <= self.high:
            flag = param.opts[0] if param is not None and param.opts else "value"
            raise InputError(f"invalid {flag} {shown(str(value))}: expected an integer from "
                             f"{self.low} to {self.high}")
        return number


class OutputDir(click.Path):
    """A report folder; an empty value is refused: it read as "not given" and the
    report went to the default folder."""

    def __init__(self) -> None:
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            flag = param.opts[0] if param is not None and param.opts else "value"
            raise InputError(f"invalid {flag} {value!r}: give a folder, or leave {flag} out "
                             "for the default one")
        return super().convert(value, param, ctx)


OUTPUT_DIR = OutputDir()


def _float(value) -> float | None:
    """``value`` (an option's text, or a default already a number) as a float, or
    None when it is not a number."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


BATCH = Count(1)
"""--gbs: 0 is refused like -5 (a falsy 0 read as "not given" ran the default)."""
SEQ_LEN = Count(1, MAX_SEQ_LEN)
"""--seq-len, refused at 0 like -5 for the same reason."""


class RateOrMax(click.ParamType):
    """A request rate (a float; its range is the library's to check) or ``max``,
    returned as the string "max": the largest rate meeting the latency limits."""

    name = "FLOAT|max"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, float):
            return value
        text = str(value).strip().lower()
        if text == "max":
            return "max"
        rate = _float(text)
        if rate is None:
            flag = param.opts[0] if param is not None and param.opts else "value"
            raise InputError(f"invalid {flag} {shown(str(value))}: expected a number of "
                             "requests/s greater than 0, or max")
        return rate


def _recompute_kind(text: str) -> str | None:
    return text if text in RECOMPUTE_KINDS else None


IntListOrAuto = ListOrAuto("N[,N...]|auto", positive_int,
                           f"positive integers up to {MAX_COUNT}")
KindListOrAuto = ListOrAuto("KIND[,KIND...]|auto", _recompute_kind,
                            f"recompute kinds ({', '.join(RECOMPUTE_KINDS)})")


def model_options(func):
    """--model/--size, or the shape inline (--layers --hidden --heads ...)."""
    options = [
        click.option("--model", help="Catalog model (gpt3, llama3-8b...) or a model YAML path."),
        click.option("--size", help="Model size within the family, e.g. 175b."),
        click.option("--layers", type=int, help="Inline shape: transformer layers."),
        click.option("--hidden", type=int, help="Inline shape: hidden size."),
        click.option("--heads", type=int, help="Inline shape: attention heads."),
        click.option("--kv-heads", type=int, help="Inline shape: kv heads (GQA; default heads)."),
        click.option("--ffn", type=int, help="Inline shape: MLP hidden size (default 4h, or "
                     "Megatron's 8h/3 rounded to 64 with --swiglu)."),
        click.option("--vocab", type=int, help="Inline shape: vocabulary size."),
        click.option("--swiglu", is_flag=True, help="Inline shape: Llama-style layer (SwiGLU, "
                     "RMSNorm, RoPE, no biases, untied output layer)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


MOE_SHAPE_OPTIONS = {"num_experts": "num_experts", "moe_topk": "moe_topk",
                     "moe_ffn": "moe_ffn_hidden_size",
                     "shared_experts_ffn": "moe_shared_expert_ffn_hidden_size",
                     "moe_first_dense_layers": "moe_first_dense_layers",
                     "moe_layer_freq": "moe_layer_freq", "mtp_layers": "mtp_layers",
                     "kv_channels": "kv_channels", "q_lora_rank": "q_lora_rank",
                     "kv_lora_rank": "kv_lora_rank", "qk_head_dim": "qk_nope_head_dim",
                     "qk_rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim",
                     "decoder_layers": "decoder_layers", "decoder_seq_len": "decoder_seq_len"}
"""Option name (without --) -> the ModelSpec field it sets (``catalog.with_layers``)."""


def moe_shape_options(func):
    """--num-experts --moe-topk --moe-ffn --shared-experts-ffn ... and MLA's
    ranks: mixture-of-experts and multi-latent-attention fields of the model
    (``autoconfig.core.catalog.with_layers``), inline or over a catalog model."""
    helps = {"num_experts": "MoE: routed experts per MoE layer.",
             "moe_topk": "MoE: experts per token (router top-k).",
             "moe_ffn": "MoE: FFN width of one routed expert.",
             "shared_experts_ffn": "MoE: FFN width of all shared experts together.",
             "moe_first_dense_layers": "MoE: leading dense layers.",
             "moe_layer_freq": "MoE: every n-th layer after them is MoE (default 1).",
             "mtp_layers": "Multi-token-prediction modules.",
             "kv_channels": "Head width when it is not hidden/heads.",
             "q_lora_rank": "MLA: query down-projection rank (0: none).",
             "kv_lora_rank": "MLA: key-value latent rank (turns MLA on).",
             "qk_head_dim": "MLA: per-head query/key width without rope.",
             "qk_rope_head_dim": "MLA: per-head rope width.",
             "v_head_dim": "MLA: per-head value width.",
             "decoder_layers": "Encoder-decoder (T5): decoder layers; an inline shape's "
                               "--layers are then the encoder's.",
             "decoder_seq_len": "Encoder-decoder (T5): decoder tokens per sample (--seq-len "
                                "is the encoder's)."}
    for name in reversed(tuple(MOE_SHAPE_OPTIONS)):
        low = 1 if name == "moe_layer_freq" else 0
        func = click.option(f"--{name.replace('_', '-')}", name, type=Count(low), default=None,
                            help=helps[name])(func)
    return func


def pop_layers(options: dict) -> dict:
    """Remove the MoE/MLA shape options from ``options``: {ModelSpec field: value}."""
    values = {name: options.pop(name, None) for name in MOE_SHAPE_OPTIONS}
    return {MOE_SHAPE_OPTIONS[name]: v for name, v in values.items() if v is not None}


def narrowing_options(func):
    """--tp --pp --vp --cp --mbs --recompute --sp --distributed-optimizer ..."""
    options = [
        click.option("--tp", type=IntListOrAuto, default=None,
                     help="Tensor-parallel sizes to try, e.g. 4,8 (default auto)."),
        click.option("--pp", type=IntListOrAuto, default=None,
                     help="Pipeline-parallel sizes (default auto: divisors of the layers)."),
        click.option("--vp", type=IntListOrAuto, default=None,
                     help="Virtual pipeline stages per rank (default auto)."),
        click.option("--cp", type=IntListOrAuto, default=None,
                     help="Context-parallel sizes (default auto: only for seq >= 4096)."),
        click.option("--mbs", type=IntListOrAuto, default=None,
                     help="Micro-batch sizes (default auto: divisors of the global batch)."),
        click.option("--recompute", type=KindListOrAuto, default=None,
                     help="Recompute kinds: none, selective, full (default auto: all)."),
        click.option("--sp", type=click.Choice(SWITCH_MODES), default="auto",
                     show_default=True, help="Sequence parallelism."),
        click.option("--distributed-optimizer", type=click.Choice(SWITCH_MODES),
                     default="auto", show_default=True, help="Distributed optimizer."),
        click.option("--max-tp-per-node", "--max-tp", "max_tp_per_node", type=int,
                     default=None, help="Largest TP tried (default: GPUs per NVLink domain)."),
        click.option("--ep", type=IntListOrAuto, default=None,
                     help="MoE: expert-parallel sizes (default auto: divisors of the GPUs up "
                          "to the expert count that divide the experts)."),
        click.option("--etp", type=IntListOrAuto, default=None,
                     help="MoE: expert tensor-parallel sizes (default auto: 1 and tp)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def architecture_options(func):
    """--mlp --norm --positions --tied-embeddings --bias --dropout: architecture
    details of the model (``autoconfig.core.catalog.with_architecture``)."""
    options = [
        click.option("--mlp", type=click.Choice(("gelu", "swiglu")), default=None,
                     help="MLP kind (default: the model's)."),
        click.option("--norm", type=click.Choice(("layernorm", "rmsnorm")), default=None,
                     help="Normalisation (default: the model's)."),
        click.option("--positions", type=click.Choice(("learned", "rope")), default=None,
                     help="Position embedding: learned table or rotary/ALiBi (no parameters)."),
        click.option("--tied-embeddings/--untied-embeddings", "tied_embeddings", default=None,
                     help="Output layer shares the word embeddings (default: the model's)."),
        click.option("--bias/--no-bias", default=None,
                     help="Linear layers have biases (default: the model's)."),
        click.option("--dropout", type=float, default=None,
                     help="Hidden and attention dropout (default: the model's)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def stack_options(func):
    """--stack and the single-feature overrides (``autoconfig.training.stack``),
    and --calibration (the constants the model runs with)."""
    options = [
        click.option("--calibration", type=click.Path(dir_okay=False), default=None,
                     help="Calibration file from `autoconfig calibrate` (constants refitted on "
                          "measurements of this GPU); refused for another GPU or model version."),
        click.option("--stack", default=None,
                     help=f"Software stack the run uses (default {DEFAULT_STACK}; see "
                          "heuristics/stacks/: megatron-lm, nemo, megatron-deepspeed, "
                          "pytorch-fsdp, llm-foundry)."),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
                     help="Override: TP communication overlapped with GEMMs (TE userbuffers)."),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=None,
                     help="Override: DP gradient reduce overlapped with backward."),
        click.option("--overlap-param-gather/--no-overlap-param-gather", default=None,
                     help="Override: distributed-optimizer param all-gather overlapped."),
        click.option("--grad-reduce-dtype", type=click.Choice(tuple(GRAD_REDUCE_DTYPES)),
                     default=None, help="Override: dtype of the gradient reduction."),
        click.option("--gradient-accumulation-fusion/--no-gradient-accumulation-fusion",
                     default=None,
                     help="Override: weight-gradient GEMMs accumulate into the fp32 main "
                          "gradient (Megatron default); off: a separate pass over the "
                          "stage's gradients every micro-batch."),
        click.option("--fused-attention/--no-fused-attention", default=None,
                     help="Override: fused (flash) attention."),
        click.option("--p2p-scatter-gather/--no-p2p-scatter-gather", default=None,
                     help="Override: pipeline sends split over the TP ranks."),
        click.option("--tp-async-backward/--no-tp-async-backward", default=None,
                     help="Override: backward TP collectives overlapped with weight-gradient "
                          "GEMMs (megatron-core default)."),
        click.option("--overlap-p2p-comm/--no-overlap-p2p-comm", default=None,
                     help="Override: pipeline sends of the interleaved schedule (VP > 1) "
                          "overlapped with compute (Megatron-LM default)."),
        click.option("--fsdp-sharding", type=click.Choice(tuple(FSDP_SHARDING)), default=None,
                     help="Override: fully sharded data parallel. PyTorch FSDP stacks: "
                          "full-shard or shard-grad-op; megatron-core stacks: full-shard, "
                          "Megatron-FSDP optim_grads_params (weights, gradients and "
                          "optimizer state sharded; the launch files switch it on)."),
        click.option("--fp8-recipe", default=None,
                     help="Override for --precision fp8: delayed, tensorwise (current scaling), "
                          "mxfp8 (Blackwell) or blockwise (default: what the Megatron-Bridge "
                          "recipes run on the GPU: tensorwise on Hopper, mxfp8 on Blackwell)."),
        click.option("--cross-entropy", type=click.Choice(CROSS_ENTROPY_KERNELS), default=None,
                     help="Override: how the loss over the vocabulary runs: unfused "
                          "(Megatron-LM default), native or te (--cross-entropy-loss-fusion "
                          "with that --cross-entropy-fusion-impl; the Bridge recipes run te), "
                          "flash-attn (llm-foundry), torch."),
        click.option("--moe-dispatcher", type=click.Choice(MOE_DISPATCHERS), default=None,
                     help="Override for MoE models: token dispatcher (megatron-lm default "
                          "allgather; the Bridge recipes alltoall, flex-deepep or flex-hybridep)."),
        click.option("--cuda-graph", type=click.Choice(CUDA_GRAPHS), default=None,
                     help="Override: what of a step replays as CUDA graphs: none "
                          "(megatron-core default), te-scoped (attention, MoE router and "
                          "preprocess) or full-iteration; only full-iteration takes an MoE "
                          "layer's per-expert kernel launches off the GPU's clock."),
        click.option("--cp-comm-type", type=click.Choice(CP_COMM_TYPES), default=None,
                     help="Override for --cp > 1: how context-parallel attention exchanges "
                          "its chunks (Megatron --cp-comm-type): p2p ring attention, K and V "
                          "sent round the ring behind the attention (megatron-core default); "
                          "a2a all-to-all of Q, K, V and the output, not overlapped, needs "
                          "the heads per TP rank divisible by cp; a2a+p2p the all-to-all "
                          "inside a node and the ring across."),
        click.option("--moe-a2a-overlap/--no-moe-a2a-overlap", default=None,
                     help="Override: MoE dispatch/combine overlapped with another micro-batch's "
                          "compute (--overlap-moe-expert-parallel-comm)."),
        click.option("--moe-grouped-gemm/--no-moe-grouped-gemm", default=None,
                     help="Override: a rank's experts run as one grouped GEMM."),
        click.option("--recompute-early-stop/--no-recompute-early-stop", default=None,
                     help="Override: full recompute stops before a dense layer's last GEMM "
                          "(PyTorch's non-reentrant checkpoint, on for the FSDP stacks); off: "
                          "the whole forward again (Megatron's checkpoint)."),
        click.option("--moe-imbalance", type=float, default=None,
                     help="MoE: tokens of the busiest expert rank over the mean (default 1.0: "
                          "balanced, as the published benchmarks force)."),
        click.option("--moe-capacity-factor", type=float, default=None,
                     help="MoE: expert capacity factor (tokens over it are dropped); 0: dropless."),
        click.option("--cpu-offload-layers", type=int, default=None,
                     help="Copy the activations the first N layers save to host memory and "
                          "back (Megatron --cpu-offloading-num-layers); needs --pp 1 and "
                          "--recompute none (megatron-core's rule). Default 0: off."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


STACK_OPTION_NAMES = ("stack", *OVERRIDES)


def pop_software(options: dict, default_stack: str | None = None):
    """Remove the stack options from ``options``; (Stack, SoftwareFeatures)."""
    values = {name: options.pop(name) for name in STACK_OPTION_NAMES}
    return resolve_software(values.pop("stack") or default_stack, **values)
