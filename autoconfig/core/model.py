"""Transformer model shapes and their exact parameter and FLOP counts.

A model is a stack of layer kinds (``layer_pattern``): ``dense`` layers
(attention and an MLP) and ``moe`` layers (attention, a router, routed experts
and optional shared experts) for decoder-only models; ``encoder`` layers
(bidirectional self-attention and an MLP over the encoder's tokens) and
``decoder`` layers (causal self-attention over the decoder's tokens,
cross-attention whose keys and values come from the encoder output, and an
MLP) for encoder-decoder models such as T5 (Raffel et al. 2020, arXiv
1910.10683, Sec. 2.1) as megatron-core's ``T5Model`` builds them. Each layer's attention is either grouped-query
attention (``gqa``: Q, K, V and output projections; plain multi-head attention
when ``num_kv_heads == num_heads``) or DeepSeek's multi-latent attention
(``mla``: low-rank Q and KV projections, DeepSeek-V2 arXiv 2405.04434 Sec.
2.1). The MLP is GeLU (2 matrices) or gated, SwiGLU, GeGLU or ReGLU (3
matrices; Shazeer 2020, arXiv 2002.05202); two norms per
layer, a final norm, token embeddings, optional learned position embeddings,
an output layer that may be tied to the embeddings, and optional
multi-token-prediction modules (DeepSeek-V3 arXiv 2412.19437 Sec. 2.2).
Counts are exact: every parameter of the layers as megatron-core builds them.
"""

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, InputError, shown

MLP_KINDS = ("gelu", "swiglu", "geglu", "reglu")
GATED_MLP_KINDS = ("swiglu", "geglu", "reglu")
"""MLPs whose up projection is two matrices (the gate and the value)."""
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rope", "relative")
ATTENTION_KINDS = ("gqa", "mla")
LAYER_KINDS = ("dense", "moe", "encoder", "decoder")
"""Kinds of layer a model's stack is made of (``ModelSpec.layer_pattern``)."""
RELATIVE_ATTENTION_BUCKETS = 32
"""Buckets of a relative position bias table (one learned scalar per bucket
and head): T5's 32 (Raffel et al. 2020 Sec. 2.1), Megatron-LM's
--relative-attention-num-buckets default."""
MAX_PARAMS = 10 ** 15
"""Largest model autoconfig describes (a thousand times the largest trained):
every field may be within its bound while their product is not, and the
memory model's 64-bit arithmetic over plans needs the product bounded."""
MOE_ONLY_FIELDS = ("moe_topk", "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
                   "moe_first_dense_layers")
"""Fields that mean something only with routed experts (and moe_layer_freq != 1)."""
MLA_ONLY_FIELDS = ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Fields that mean something only with multi-latent attention (a kv_lora_rank)."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a transformer: decoder-only, or encoder-decoder when
    ``decoder_layers`` is set."""

    name: str
    num_layers: int
    """Transformer layers of the whole stack; an encoder-decoder model counts
    its encoder's and its decoder's layers together (``encoder_layers`` +
    ``decoder_layers``), the order the layers run in."""
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    """Default training sequence length in tokens (encoder-decoder: the
    encoder's; its tokens are the ones a step's tokens count, as NeMo's
    tools count T5's)."""
    mlp_kind: str = "gelu"
    norm_kind: str = "layernorm"
    position_embedding: str = "learned"
    tied_embeddings: bool = True
    has_bias: bool = True
    """Linear layers carry biases (GPT-3 yes, Llama no)."""
    hidden_dropout: float = 0.1
    """Dropout after the embedding, attention output and MLP output. 0.1 is the
    Megatron-LM default (megatron/training/arguments.py ``--hidden-dropout``) and
    GPT-3's; Llama trains without (NeMo ``LlamaConfig``: hidden_dropout 0.0)."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities: Megatron-LM ``--attention-dropout``
    default 0.1; 0.0 in NeMo ``LlamaConfig``/``Llama3Config``."""
    published_batch_tokens: int | None = None
    """Tokens per optimizer step that the model's own publication states (its
    catalog file cites it); None where none is stated, and the GPT-3 table's
    batch by size is used instead. In tokens so it holds for any sequence length."""
    family: str = ""
    size_label: str = ""
    kv_channels: int = 0
    """Width of one attention head when it is not hidden/heads (Megatron
    --kv-channels; Qwen3 and GPT-OSS set it); 0: hidden/heads."""
    qk_norm: bool = False
    """A norm on each head's queries and keys (Qwen3; Megatron --qk-layernorm)."""
    attention_kind: str = "gqa"
    """gqa (multi-head or grouped-query) or mla (multi-latent attention)."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection; 0 projects queries directly."""
    kv_lora_rank: int = 0
    """MLA: rank of the compressed key-value latent (what the KV cache holds)."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key width with rotary embedding (the key part shared by heads)."""
    v_head_dim: int = 0
    """MLA: per-head value width."""
    num_experts: int = 0
    """Routed experts of each MoE layer; 0: a dense model."""
    moe_topk: int = 0
    """Experts each token is routed to (Megatron --moe-router-topk)."""
    moe_ffn_hidden_size: int = 0
    """FFN width of one routed expert (Megatron --moe-ffn-hidden-size)."""
    moe_shared_expert_ffn_hidden_size: int = 0
    """FFN width of all shared experts together (Megatron
    --moe-shared-expert-intermediate-size); 0: none."""
    moe_first_dense_layers: int = 0
    """Leading dense layers before the MoE layers (DeepSeek-V3: 3)."""
    moe_layer_freq: int = 1
    """After the leading dense layers every n-th layer is MoE (1: all of them)."""
    attention_sinks: bool = False
    """A learned sink logit per head in the attention softmax (GPT-OSS)."""
    sliding_window: int = 0
    """Tokens of the banded (sliding-window) attention every other layer uses
    (GPT-OSS: 128); 0: full attention everywhere."""
    mtp_layers: int = 0
    """Multi-token-prediction modules after the last layer (DeepSeek-V3: 1),
    each one MoE layer plus its norms and a 2h x h projection; they share the
    embedding and the output layer with the main model."""

    decoder_layers: int = 0
    """Decoder layers of an encoder-decoder model (T5: as many as the
    encoder); 0: a decoder-only model."""
    decoder_seq_len: int = 0
    """Decoder tokens per sample of an encoder-decoder model (T5 pre-training:
    128 targets for 512 inputs); 0 for decoder-only models."""

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                      "ffn_hidden_size", "vocab_size", "seq_len"):
            _check_int(self.name, field, getattr(self, field), 1,
                       MAX_SEQ_LEN if field == "seq_len" else MAX_COUNT)
        if self.hidden_size % self.num_heads and not (
                isinstance(self.kv_channels, int) and self.kv_channels > 0):
            raise InputError(f"invalid heads {self.num_heads} for model {self.name!r}: "
                             f"must divide hidden size {self.hidden_size} (or give kv_channels)")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"invalid kv heads {self.num_kv_heads} for model {self.name!r}: "
                             f"must divide heads {self.num_heads}")
        batch = self.published_batch_tokens
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)
                                  or batch < 1):
            raise InputError(f"invalid published_batch_tokens {batch!r} for model "
                             f"{self.name!r}: must be a positive integer")
        for field in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0.0 <= value < 1.0:
                raise InputError(f"invalid {field} {value!r} for model {self.name!r}: "
                                 "must be a probability in [0, 1)")
        _check_choice("mlp_kind", self.mlp_kind, MLP_KINDS)
        _check_choice("norm_kind", self.norm_kind, NORM_KINDS)
        _check_choice("position_embedding", self.position_embedding, POSITION_KINDS)
        _check_choice("attention_kind", self.attention_kind, ATTENTION_KINDS)
        self._check_extensions()

    def _check_extensions(self) -> None:
        """MoE and MLA fields: non-negative integers that make a whole model."""
        for field in ("kv_channels", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                      "qk_rope_head_dim", "v_head_dim", "num_experts", "moe_topk",
                      "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
                      "moe_first_dense_layers", "mtp_layers"):
            _check_int(self.name, field, getattr(self, field), 0, MAX_COUNT)
        _check_int(self.name, "sliding_window", self.sliding_window, 0, MAX_SEQ_LEN)
        self._check_encoder_decoder()
        _check_int(self.name, "moe_layer_freq", self.moe_layer_freq, 1, MAX_COUNT)
        if self.num_experts:
            if not 1 <= self.moe_topk <= self.num_experts:
                raise InputError(f"invalid moe_topk {self.moe_topk} for model {self.name!r}: "
                                 f"must be in 1..{self.num_experts} (the experts)")
            if self.moe_ffn_hidden_size < 1:
                raise InputError(f"invalid moe_ffn_hidden_size {self.moe_ffn_hidden_size} for "
                                 f"model {self.name!r}: an MoE model needs the expert FFN width")
            if self.moe_first_dense_layers >= self.num_layers:
                raise InputError(f"invalid moe_first_dense_layers {self.moe_first_dense_layers} "
                                 f"for model {self.name!r}: must be below the "
                                 f"{self.num_layers} layers")
        else:
            given = [f for f in MOE_ONLY_FIELDS if getattr(self, f)] + \
                ["moe_layer_freq"] * (self.moe_layer_freq != 1)
            if given:
                raise InputError(f"model {self.name!r} gives MoE field(s) {', '.join(given)} "
                                 "without num_experts: give num_experts (--num-experts) too, "
                                 "or drop them")
        if self.attention_kind != "mla":
            given = [f for f in MLA_ONLY_FIELDS if getattr(self, f)]
            if given:
                raise InputError(f"model {self.name!r} gives multi-latent-attention field(s) "
                                 f"{', '.join(given)} without kv_lora_rank (--kv-lora-rank), "
                                 "which turns MLA on")
        if self.attention_kind == "mla":
            for field in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, field) < 1:
                    raise InputError(f"invalid {field} {getattr(self, field)} for model "
                                     f"{self.name!r}: multi-latent attention needs it >= 1")
        elif self.kv_channels == 0 and self.hidden_size % self.num_heads:
            raise InputError(f"invalid heads {self.num_heads} for model {self.name!r}: "
                             f"must divide hidden size {self.hidden_size} (or give kv_channels)")
        params = total_params(self, with_mtp=True)
        if params > MAX_PARAMS:
            raise InputError(f"model {self.name!r} has {params:.3g} parameters: autoconfig "
                             f"describes models of at most {MAX_PARAMS:.0e}")

    def _check_encoder_decoder(self) -> None:
        """Decoder layers and length together, a dense GQA encoder-decoder; a
        relative position bias only where megatron-core has one (T5)."""
        _check_int(self.name, "decoder_layers", self.decoder_layers, 0, MAX_COUNT)
        _check_int(self.name, "decoder_seq_len", self.decoder_seq_len, 0, MAX_SEQ_LEN)
        if not self.decoder_layers:
            if self.decoder_seq_len:
                raise InputError(f"model {self.name!r} gives decoder_seq_len without "
                                 "decoder_layers: an encoder-decoder model needs both")
            if self.position_embedding == "relative":
                raise InputError(f"invalid position_embedding 'relative' for model "
                                 f"{self.name!r}: megatron-core has a relative position bias "
                                 "only for encoder-decoder (T5) models; allowed are learned, rope")
            return
        if self.decoder_layers >= self.num_layers:
            raise InputError(f"invalid decoder_layers {self.decoder_layers} for model "
                             f"{self.name!r}: must be below the {self.num_layers} layers of the "
                             "whole stack (encoder and decoder)")
        if self.decoder_seq_len < 1:
            raise InputError(f"model {self.name!r} has decoder layers but no decoder_seq_len: "
                             "give the decoder's tokens per sample (T5: 128)")
        given = [f for f in ("num_experts", "mtp_layers", "kv_lora_rank", "sliding_window")
                 if getattr(self, f)]
        if given:
            raise InputError(f"model {self.name!r}: encoder-decoder models are dense with "
                             f"multi-head attention here; drop {', '.join(given)}")

    @property
    def is_encoder_decoder(self) -> bool:
        return self.decoder_layers > 0

    @property
    def encoder_layers(self) -> int:
        """Encoder layers of an encoder-decoder model (0 for decoder-only)."""
        return self.num_layers - self.decoder_layers if self.decoder_layers else 0

    @property
    def head_dim(self) -> int:
        """Query/key width of one head (MLA: the no-rope and rope parts together)."""
        if self.attention_kind == "mla":
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.kv_channels or self.hidden_size // self.num_heads

    @property
    def value_head_dim(self) -> int:
        """Value width of one head (MLA's v_head_dim; else the head dim)."""
        return self.v_head_dim if self.attention_kind == "mla" else self.head_dim

    @property
    def kv_hidden_size(self) -> int:
        """Width of K (and of V): kv heads times head dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def q_width(self) -> int:
        """Width of all query heads together (hidden size for GPT/Llama shapes)."""
        return self.num_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def unmodelled(self) -> tuple[str, ...]:
        """Features of the model the step-time model does not price (banded
        attention is priced by its keys: ``banded_layers``,
        ``banded_keys_per_query``). Attention sinks add one learned logit per head
        and query row to the softmax, O(s a) FLOPs against the core's O(s^2 a d),
        but they decide the kernel: Transformer Engine runs a learnable softmax
        only in cuDNN's fused kernel or unfused (FlashAttention is disabled,
        attention/dot_product_attention/utils.py get_attention_backend), at a
        speed not measured here. With sinks taken as free, GPT-OSS's 17 published
        runs came out 22-124% too fast (2026-11-29), so they stay unpriced."""
        return ("attention sinks",) if self.attention_sinks else ()

    @property
    def banded_layers(self) -> int:
        """Layers whose attention is banded (``sliding_window``): every other one,
        the first of each pair (megatron-core window_attn_skip_freq 2, layers 1, 3,
        5... windowed; GPT-OSS's 36 layers: 18); 0 without a window."""
        return (self.num_layers + 1) // 2 if self.sliding_window else 0

    @cached_property
    def layer_pattern(self) -> tuple[str, ...]:
        """The kind of every layer, first to last (``LAYER_KINDS``): dense models
        are all ``dense``; MoE models have ``moe_first_dense_layers`` dense layers,
        then every ``moe_layer_freq``-th layer MoE (Megatron --moe-layer-freq)."""
        if self.is_encoder_decoder:
            return ("encoder",) * self.encoder_layers + ("decoder",) * self.decoder_layers
        if not self.is_moe:
            return ("dense",) * self.num_layers
        first = self.moe_first_dense_layers
        return tuple("dense" if i < first or (i - first) % self.moe_layer_freq else "moe"
                     for i in range(self.num_layers))

    def layers_of(self, kind: str) -> int:
        """Layers of one kind in the main stack (MTP modules not counted)."""
        return self.layer_pattern.count(kind)


def _check_int(model: str, field: str, value, low: int, high: int) -> None:
    """An integer field in [low, high] (one-line error naming the bound)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        what = "a positive integer" if low == 1 else "a non-negative integer"
        raise InputError(f"invalid {field} {shown(value)} for model {model!r}: must be "
                         f"{what} up to {high}")


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"invalid {field} {shown(value)}: allowed are {', '.join(allowed)}")


@dataclass(frozen=True)
class Linear:
    """One weight matrix of a layer: ``in_features`` x ``out_features``, and how
    Megatron's tensor parallelism splits it (``column``: the output features,
    ``row``: the input features, ``replicated``: whole on every TP rank)."""

    name: str
    in_features: int
    out_features: int
    parallel: str

    @property
    def params(self) -> int:
        return self.in_features * self.out_features


def attention_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """The attention's weight matrices.

    gqa: fused QKV (h x (q + 2 kv)) column-parallel, output projection (q x h)
    row-parallel, q = heads x head dim (Shoeybi et al. 2019, Sec. 3).
    mla (megatron-core ``MLASelfAttention``): the query and KV down-projections
    (h x q_lora, h x (kv_lora + rope)) are whole on every TP rank, the
    up-projections (q_lora x heads (nope + rope); kv_lora x heads (nope + v))
    column-parallel, the output projection (heads v x h) row-parallel; without a
    query rank the query is one h x heads (nope + rope) column-parallel matrix.
    """
    h, a = m.hidden_size, m.num_heads
    if m.attention_kind == "gqa":
        return (Linear("qkv", h, m.q_width + 2 * m.kv_hidden_size, "column"),
                Linear("proj", m.q_width, h, "row"))
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    query = ((Linear("q_down", h, m.q_lora_rank, "replicated"),
              Linear("q_up", m.q_lora_rank, a * qk, "column")) if m.q_lora_rank
             else (Linear("q", h, a * qk, "column"),))
    return query + (Linear("kv_down", h, m.kv_lora_rank + m.qk_rope_head_dim, "replicated"),
                    Linear("kv_up", m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim),
                           "column"),
                    Linear("proj", a * m.v_head_dim, h, "row"))


def mlp_linears(m: ModelSpec, ffn: int, prefix: str = "mlp") -> tuple[Linear, ...]:
    """An MLP of width ``ffn``: up (h x ffn, or h x 2 ffn fusing a gated MLP's
    gate) and down (ffn x h)."""
    up = 2 if m.mlp_kind in GATED_MLP_KINDS else 1
    return (Linear(f"{prefix}_up", m.hidden_size, up * ffn, "column"),
            Linear(f"{prefix}_down", ffn, m.hidden_size, "row"))


def attention_weight_params(m: ModelSpec) -> int:
    """Weights of one attention block (GQA: 2h^2 + 2h kv for q = h)."""
    return sum(x.params for x in attention_linears(m))


def attention_extra_params(m: ModelSpec) -> int:
    """Norms inside attention: MLA's norms of the two latents, Q/K norms."""
    extra = 0
    if m.attention_kind == "mla":
        extra += (m.q_lora_rank + m.kv_lora_rank) * _norm_width(m)
    if m.qk_norm:
        extra += 2 * m.head_dim * _norm_width(m)
    return extra


def _norm_width(m: ModelSpec) -> int:
    return 2 if m.norm_kind == "layernorm" else 1


def mlp_weight_params(m: ModelSpec) -> int:
    """GeLU: up and down (2 h f); gated (SwiGLU, GeGLU, ReGLU): gate, up and down (3 h f)."""
    return sum(x.params for x in mlp_linears(m, m.ffn_hidden_size))


def expert_params(m: ModelSpec) -> int:
    """One routed expert: its MLP (and its biases where the model has them)."""
    return (sum(x.params for x in mlp_linears(m, m.moe_ffn_hidden_size))
            + _mlp_bias_params(m, m.moe_ffn_hidden_size))


def shared_expert_params(m: ModelSpec) -> int:
    """All shared experts of one MoE layer (one MLP of the total shared width)."""
    if not m.moe_shared_expert_ffn_hidden_size:
        return 0
    return sum(x.params for x in mlp_linears(m, m.moe_shared_expert_ffn_hidden_size))


def router_params(m: ModelSpec) -> int:
    """The router's h x E gate (plus an expert bias where the model has biases)."""
    return m.hidden_size * m.num_experts + (m.num_experts if m.has_bias else 0)


def norm_params(m: ModelSpec) -> int:
    """One norm: LayerNorm has weight and bias, RMSNorm only a weight."""
    return _norm_width(m) * m.hidden_size


def attention_bias_params(m: ModelSpec) -> int:
    """Biases of the attention: the column-parallel outputs and the projection's h."""
    if not m.has_bias or m.attention_kind != "gqa":
        return 0
    return sum(x.out_features for x in attention_linears(m) if x.parallel == "column") \
        + m.hidden_size


def _mlp_bias_params(m: ModelSpec, ffn: int) -> int:
    """Biases of an MLP of width ffn where the model has biases: its up
    projection's outputs (2 ffn with SwiGLU's gate) and the down projection's h."""
    if not m.has_bias:
        return 0
    return (2 if m.mlp_kind in GATED_MLP_KINDS else 1) * ffn + m.hidden_size


def attention_block_params(m: ModelSpec) -> int:
    """Everything of a layer before its MLP: attention weights, biases and inner
    norms, and the layer's two norms."""
    return (attention_weight_params(m) + attention_extra_params(m)
            + attention_bias_params(m) + 2 * norm_params(m))


def layer_params(m: ModelSpec) -> int:
    """Parameters of one dense transformer layer (GPT-3: 12h^2 + 13h)."""
    return (attention_block_params(m) + mlp_weight_params(m)
            + _mlp_bias_params(m, m.ffn_hidden_size))


def moe_layer_params(m: ModelSpec) -> int:
    """Parameters of one MoE layer: attention block, router, every routed expert
    and the shared experts."""
    return (attention_block_params(m) + router_params(m) + m.num_experts * expert_params(m)
            + shared_expert_params(m))


def moe_layer_active_params(m: ModelSpec) -> int:
    """Parameters one token passes through in an MoE layer: top-k experts."""
    return (attention_block_params(m) + router_params(m) + m.moe_topk * expert_params(m)
            + shared_expert_params(m))


def cross_attention_linears(m: ModelSpec) -> tuple[Linear, ...]:
    """A decoder layer's cross-attention (megatron-core ``CrossAttention``): the
    query from the decoder (h x q) and the keys and values from the encoder
    output (h x 2 kv), both column-parallel, and the output projection (q x h)
    row-parallel."""
    h = m.hidden_size
    return (Linear("cross_q", h, m.q_width, "column"),
            Linear("cross_kv", h, 2 * m.kv_hidden_size, "column"),
            Linear("cross_proj", m.q_width, h, "row"))


def cross_attention_params(m: ModelSpec) -> int:
    """Cross-attention of one decoder layer: weights, biases where the model has
    them, and the norm before it."""
    linears = cross_attention_linears(m)
    bias = sum(x.out_features for x in linears) if m.has_bias else 0
    return sum(x.params for x in linears) + bias + norm_params(m)


def kind_params(m: ModelSpec, kind: str) -> int:
    """Parameters of one layer of a kind (``LAYER_KINDS``)."""
    if kind == "moe":
        return moe_layer_params(m)
    if kind == "decoder":
        return layer_params(m) + cross_attention_params(m)
    return layer_params(m)


def mtp_kind(m: ModelSpec) -> str:
    """The layer kind inside a multi-token-prediction module: the last layer's."""
    return m.layer_pattern[-1]


def mtp_params(m: ModelSpec) -> int:
    """One MTP module (DeepSeek-V3 Sec. 2.2): two norms on its inputs, the 2h x h
    projection of their concatenation, one layer and its final norm; embedding
    and output head are the main model's."""
    h = m.hidden_size
    return 3 * norm_params(m) + 2 * h * h + kind_params(m, mtp_kind(m))


def stack_params(m: ModelSpec) -> int:
    """Parameters of every layer of the main stack."""
    return sum(m.layers_of(k) * kind_params(m, k) for k in LAYER_KINDS)


def embedding_params(m: ModelSpec) -> int:
    """Token embeddings plus learned position embeddings where used (one table
    that an encoder-decoder's encoder and decoder share, megatron-core
    ``T5Model``), or the relative position bias tables (T5: one for the
    encoder, one for the decoder, each buckets x heads)."""
    positions = m.seq_len * m.hidden_size if m.position_embedding == "learned" else 0
    if m.position_embedding == "relative":
        positions = 2 * RELATIVE_ATTENTION_BUCKETS * m.num_heads
    return m.vocab_size * m.hidden_size + positions


def output_layer_params(m: ModelSpec) -> int:
    """The output layer's own parameters: none when tied to the embeddings,
    except the vocabulary-sized bias megatron-core's T5 head then carries
    (``T5LMHead``: bias when sharing the embedding weight)."""
    if m.tied_embeddings:
        return m.vocab_size if m.is_encoder_decoder else 0
    return m.vocab_size * m.hidden_size


def final_norm_params(m: ModelSpec) -> int:
    """The final norm of each stack (the encoder's and the decoder's for T5)."""
    return (2 if m.is_encoder_decoder else 1) * norm_params(m)


def total_params(m: ModelSpec, with_mtp: bool = False) -> int:
    """Exact parameter count (GPT-3 175B shape: 174.6e9, as Narayanan et al. 2021;
    DeepSeek-V3: 671e9 without its MTP module, as its report counts)."""
    return (stack_params(m) + embedding_params(m) + final_norm_params(m)
            + output_layer_params(m) + (m.mtp_layers * mtp_params(m) if with_mtp else 0))


def active_params(m: ModelSpec) -> int:
    """Parameters one token passes through (DeepSeek-V3: 37e9 activated): every
    dense, encoder and decoder layer, and top-k routed plus the shared experts
    of each MoE layer."""
    layers = sum(m.layers_of(k) * (moe_layer_active_params(m) if k == "moe"
                                   else kind_params(m, k)) for k in LAYER_KINDS)
    return layers + embedding_params(m) + final_norm_params(m) + output_layer_params(m)


def layer_matmul_flops_per_token(m: ModelSpec, kind: str = "dense") -> float:
    """Forward FLOPs of one layer's weight matmuls per token: 2 per weight a token
    passes through (MoE: the router, top-k experts and the shared experts;
    encoder and decoder layers as dense ones, a decoder layer's cross-attention
    counted apart by ``cross_attention_flops_per_sample``)."""
    attention = attention_weight_params(m)
    if kind == "moe":
        routed = m.moe_topk * sum(x.params for x in mlp_linears(m, m.moe_ffn_hidden_size))
        return 2.0 * (attention + m.hidden_size * m.num_experts + routed
                      + shared_expert_params(m))
    return 2.0 * (attention + mlp_weight_params(m))


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward QK^T and attention-times-V FLOPs of one layer per token:
    2 s a (d_qk + d_v), which is 4 s h for GPT shapes.

    Counted over the full s x s score matrix, as Megatron-LM and Narayanan et
    al. 2021 (eq. 3) do; causal kernels skip about half of it, so published
    MFU figures that halve this term read slightly lower.
    """
    return 2.0 * seq_len * m.num_heads * (m.head_dim + m.value_head_dim)


def banded_keys_per_query(window: int, seq_len):
    """Mean keys a query of a causal ``window``-token band sees over a sequence:
    position i sees min(i + 1, w), so (w (w + 1) / 2 + (s - w) w) / s for s >= w
    and (s + 1) / 2 (plain causal) for shorter sequences. Elementwise over an
    array of lengths (a float for a number)."""
    w, s = float(window), np.asarray(seq_len, dtype=float)
    banded = (w * (w + 1.0) / 2.0 + (s - w) * w) / np.maximum(s, w)
    keys = np.where(s >= w, banded, (s + 1.0) / 2.0)
    return keys if keys.ndim else float(keys)


def logits_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden_size * m.vocab_size


def stack_matmul_flops_per_token(m: ModelSpec) -> float:
    """Forward weight-matmul FLOPs of the whole main stack per token."""
    return sum(m.layers_of(k) * layer_matmul_flops_per_token(m, k) for k in LAYER_KINDS)


def mtp_forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of the MTP modules per token: each its 2h x h projection,
    one layer and its own logits (Megatron-LM counts them in its FLOPs)."""
    per = (2.0 * 2 * m.hidden_size * m.hidden_size + layer_matmul_flops_per_token(m, mtp_kind(m))
           + attention_core_flops_per_token(m, seq_len) + logits_flops_per_token(m))
    return m.mtp_layers * per


def cross_attention_flops_per_sample(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of one decoder layer's cross-attention per sample: the query
    and output projections over the decoder's tokens, the key and value
    projections over the encoder's ``seq_len`` tokens, and the core, every
    decoder query against every encoder key."""
    q, kv, proj = (x.params for x in cross_attention_linears(m))
    s_dec = m.decoder_seq_len
    return (2.0 * (q + proj) * s_dec + 2.0 * kv * seq_len
            + s_dec * attention_core_flops_per_token(m, seq_len))


def kind_forward_flops_per_sample(m: ModelSpec, kind: str, seq_len: int) -> float:
    """Forward FLOPs of one layer of a kind per sample of ``seq_len`` tokens
    (encoder-decoder: ``seq_len`` encoder tokens, ``decoder_seq_len`` decoder
    tokens): its weight matmuls and attention core over the tokens it sees,
    and a decoder layer's cross-attention."""
    if kind == "decoder":
        s_dec = m.decoder_seq_len
        return (s_dec * (layer_matmul_flops_per_token(m, "dense")
                         + attention_core_flops_per_token(m, s_dec))
                + cross_attention_flops_per_sample(m, seq_len))
    return seq_len * (layer_matmul_flops_per_token(m, kind)
                      + attention_core_flops_per_token(m, seq_len))


def logits_tokens_per_sample(m: ModelSpec, seq_len: int) -> int:
    """Tokens the output layer sees per sample: the decoder's for T5."""
    return m.decoder_seq_len if m.is_encoder_decoder else seq_len


def _stacks_forward_per_sample(m: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs of an encoder-decoder's layers (both stacks) per sample."""
    return sum(m.layers_of(k) * kind_forward_flops_per_sample(m, k, seq_len)
               for k in ("encoder", "decoder"))


def _encoder_decoder_forward_per_token(m: ModelSpec, seq_len: int) -> float:
    return (_stacks_forward_per_sample(m, seq_len)
            + m.decoder_seq_len * logits_flops_per_token(m)) / seq_len


def forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """One forward pass, all layers, MTP modules and the output layer, per token
    (encoder-decoder: per encoder token, every FLOP of the sample counted)."""
    if m.is_encoder_decoder:
        return _encoder_decoder_forward_per_token(m, seq_len)
    return (stack_matmul_flops_per_token(m) + m.num_layers * attention_core_flops_per_token(m, seq_len)
            + logits_flops_per_token(m) + mtp_forward_flops_per_token(m, seq_len))


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Model FLOPs of one training token: forward plus backward (2x forward).

    For GPT-3 shapes this is 72 l h^2 (1 + s/6h + V/12lh) per token, i.e.
    Narayanan et al. 2021 eq. 3 without the recompute forward; ~6N for s << h.
    """
    return 3.0 * forward_flops_per_token(m, seq_len)


def recompute_flops_per_token(m: ModelSpec, seq_len: int, recompute: str,
                              recomputed_layers: int | None = None) -> float:
    """Extra forward FLOPs that activation recomputation adds per token.

    full: the forward of every recomputed layer again (Narayanan eq. 3 counts
    all ``num_layers``, giving 96 B s l h^2 (1 + s/6h + V/16lh) per batch);
    selective: only the attention core (Korthikanti et al. 2022, Sec. 5);
    none: nothing.
    """
    if recompute == "none":
        return 0.0
    if m.is_encoder_decoder and recompute in ("selective", "full"):
        return _encoder_decoder_recompute_per_token(m, seq_len, recompute, recomputed_layers)
    if recompute == "selective":
        return m.num_layers * attention_core_flops_per_token(m, seq_len)
    if recompute == "full":
        layers = m.num_layers if recomputed_layers is None else recomputed_layers
        per_layer = (stack_matmul_flops_per_token(m) / m.num_layers
                     + attention_core_flops_per_token(m, seq_len))
        return layers * per_layer
    raise InputError(f"unknown recompute {recompute!r}: allowed are none, selective, full")


def _encoder_decoder_recompute_per_token(m: ModelSpec, seq_len: int, recompute: str,
                                         recomputed_layers: int | None) -> float:
    """Recompute of an encoder-decoder per encoder token: selective, the self-
    and cross-attention cores; full, the recomputed share of the layers'
    forward (the mean layer's when not all are)."""
    s_dec = m.decoder_seq_len
    if recompute == "selective":
        core = attention_core_flops_per_token
        return (m.encoder_layers * seq_len * core(m, seq_len) + m.decoder_layers * s_dec
                * (core(m, s_dec) + core(m, seq_len))) / seq_len
    share = 1.0 if recomputed_layers is None else recomputed_layers / m.num_layers
    return _stacks_forward_per_sample(m, seq_len) / seq_len * share


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str,
                             recomputed_layers: int | None = None) -> float:
    """Model FLOPs plus the recompute forward: what the GPU really executes."""
    return (model_flops_per_token(m, seq_len)
            + recompute_flops_per_token(m, seq_len, recompute, recomputed_layers))
