"""Transformer model shapes and their exact parameter and FLOP counts.

Counts follow the Megatron GPT layer: attention (Q, K, V, output projection,
with grouped-query attention when ``num_kv_heads < num_heads``), an MLP that is
either GeLU (2 matrices) or SwiGLU (3 matrices), two norms per layer, a final
norm, token embeddings, optional learned position embeddings and an output
layer that may be tied to the embeddings.
"""

from dataclasses import dataclass

from autoconfig.errors import InputError

MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rope")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    """Default training sequence length in tokens."""
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

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                      "ffn_hidden_size", "vocab_size", "seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"invalid {field} {value!r} for model {self.name!r}: "
                                 "must be a positive integer")
        if self.hidden_size % self.num_heads:
            raise InputError(f"invalid heads {self.num_heads} for model {self.name!r}: "
                             f"must divide hidden size {self.hidden_size}")
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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_hidden_size(self) -> int:
        """Width of K (and of V): kv heads times head dim."""
        return self.num_kv_heads * self.head_dim


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"invalid {field} {value!r}: allowed are {', '.join(allowed)}")


def attention_weight_params(m: ModelSpec) -> int:
    """Q and output projections are h x h; K and V are h x kv_hidden each."""
    return 2 * m.hidden_size * m.hidden_size + 2 * m.hidden_size * m.kv_hidden_size


def mlp_weight_params(m: ModelSpec) -> int:
    """GeLU: up and down (2 h f); SwiGLU: gate, up and down (3 h f)."""
    matrices = 3 if m.mlp_kind == "swiglu" else 2
    return matrices * m.hidden_size * m.ffn_hidden_size


def norm_params(m: ModelSpec) -> int:
    """One norm: LayerNorm has weight and bias, RMSNorm only a weight."""
    return (2 if m.norm_kind == "layernorm" else 1) * m.hidden_size


def layer_bias_params(m: ModelSpec) -> int:
    if not m.has_bias:
        return 0
    mlp_up = (2 if m.mlp_kind == "swiglu" else 1) * m.ffn_hidden_size
    return (m.hidden_size + 2 * m.kv_hidden_size) + m.hidden_size + mlp_up + m.hidden_size


def layer_params(m: ModelSpec) -> int:
    """Parameters of one transformer layer (GPT-3: 12h^2 + 13h)."""
    return (attention_weight_params(m) + mlp_weight_params(m)
            + layer_bias_params(m) + 2 * norm_params(m))


def embedding_params(m: ModelSpec) -> int:
    """Token embeddings plus learned position embeddings where used."""
    positions = m.seq_len * m.hidden_size if m.position_embedding == "learned" else 0
    return m.vocab_size * m.hidden_size + positions


def output_layer_params(m: ModelSpec) -> int:
    return 0 if m.tied_embeddings else m.vocab_size * m.hidden_size


def total_params(m: ModelSpec) -> int:
    """Exact parameter count (GPT-3 175B shape: 174.6e9, as Narayanan et al. 2021)."""
    return (m.num_layers * layer_params(m) + embedding_params(m)
            + norm_params(m) + output_layer_params(m))


def layer_matmul_flops_per_token(m: ModelSpec) -> float:
    """Forward FLOPs of one layer's weight matmuls per token: 2 per weight."""
    return 2.0 * (attention_weight_params(m) + mlp_weight_params(m))


def attention_core_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward QK^T and attention-times-V FLOPs of one layer per token: 4 s h.

    Counted over the full s x s score matrix, as Megatron-LM and Narayanan et
    al. 2021 (eq. 3) do; causal kernels skip about half of it, so published
    MFU figures that halve this term read slightly lower.
    """
    return 4.0 * seq_len * m.hidden_size


def logits_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.hidden_size * m.vocab_size


def forward_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """One forward pass, all layers and the output layer, per token."""
    per_layer = layer_matmul_flops_per_token(m) + attention_core_flops_per_token(m, seq_len)
    return m.num_layers * per_layer + logits_flops_per_token(m)


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
    if recompute == "selective":
        return m.num_layers * attention_core_flops_per_token(m, seq_len)
    if recompute == "full":
        layers = m.num_layers if recomputed_layers is None else recomputed_layers
        per_layer = layer_matmul_flops_per_token(m) + attention_core_flops_per_token(m, seq_len)
        return layers * per_layer
    raise InputError(f"unknown recompute {recompute!r}: allowed are none, selective, full")


def hardware_flops_per_token(m: ModelSpec, seq_len: int, recompute: str,
                             recomputed_layers: int | None = None) -> float:
    """Model FLOPs plus the recompute forward: what the GPU really executes."""
    return (model_flops_per_token(m, seq_len)
            + recompute_flops_per_token(m, seq_len, recompute, recomputed_layers))
