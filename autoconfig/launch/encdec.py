"""What launching an encoder-decoder (T5 / mT5) model needs beyond a GPT launch.

Facts every target shares, kept apart from spec.py so spec.py can import them:
the tokenizer of each family (T5 pre-training needs a real tokenizer with
sentinel tokens, never Megatron's NullTokenizer) and what megatron-core's T5
cannot build at all, whichever framework drives it. Megatron-LM-only and NeMo
1-only limits live in megatron_lm.py and nemo1.py.

Sources: Megatron-LM core_v0.16.1 (commit 55ac708, the parser recorded in
tests/data/megatron_lm_args.json), megatron-core 0.16.1, NeMo 8cfedd7.
"""

from dataclasses import dataclass

from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan

SENTINEL_TOKENS = 100
"""T5's span-corruption sentinels <extra_id_0..99>: Megatron-LM --vocab-extra-ids 100
(examples/t5/train_t5_220m_distributed.sh, tests/functional_tests/test_cases/t5/*),
NeMo megatron_t5_config.yaml tokenizer.num_sentinel_tokens 100."""

PRETRAIN_SCRIPT = "pretrain_t5.py"
"""Megatron-LM core_v0.16.1 has pretrain_t5.py at the repository root; newer
Megatron-LM (main) moved it to examples/t5/pretrain_t5.py."""
PRETRAIN_SCRIPT_NOTE = ("pretrain_t5.py is at the root of Megatron-LM core_v0.16.1 (the "
                        "release these arguments are checked against); newer Megatron-LM "
                        "moved it to examples/t5/pretrain_t5.py")

NEMO_SCRIPT = "megatron_t5_pretraining.py"
"""NeMo 1's T5 entry point: examples/nlp/language_modeling/megatron_t5_pretraining.py
(Hydra config conf/megatron_t5_config.yaml)."""


@dataclass(frozen=True)
class EncDecTokenizer:
    """A family's tokenizer as Megatron-LM's T5 pre-training reads it."""

    tokenizer_type: str
    """Megatron-LM --tokenizer-type (legacy tokenizer, which adds the sentinels)."""
    origin: str
    """The vocabulary file or SentencePiece model it reads."""
    vocab_size: int
    """Tokens Megatron-LM's legacy tokenizer counts, sentinels included, before padding."""
    source: str


TOKENIZERS = {
    "t5": EncDecTokenizer(
        "BertWordPieceCase", "bert-large-cased vocab.txt", 28996 + 2 + SENTINEL_TOKENS,
        "NeMo launcher conf/training/t5/*.yaml: tokenizer megatron BertWordPieceCase; "
        "bert-large-cased vocab.txt has 28,996 word pieces (google-research/bert "
        "cased_L-24_H-1024_A-16); Megatron-LM core_v0.16.1 megatron/training/tokenizer/"
        "tokenizer.py _BertWordPieceTokenizer adds [BOS], [EOS] and --vocab-extra-ids"),
    "mt5": EncDecTokenizer(
        "SentencePieceTokenizer", "mT5 SentencePiece model", 250000 + 5 + SENTINEL_TOKENS,
        "NeMo launcher conf/training/mt5/*.yaml: tokenizer sentencepiece mt5_tokenizer.model; "
        "Xue et al. 2021 (mT5, arXiv 2010.11934) Sec. 2: 250,000 wordpieces (with <pad> and "
        "</s>, no <s>, as T5's SentencePiece models); Megatron-LM core_v0.16.1 "
        "_SentencePieceTokenizer adds <CLS>, <SEP>, <EOD>, <MASK>, <BOS> and "
        "--vocab-extra-ids"),
}
PLACEHOLDER_TOKENIZER = EncDecTokenizer(
    "SentencePieceTokenizer", "your SentencePiece model", 0,
    "no tokenizer recorded for the family: a SentencePiece model the user gives, which "
    "with Megatron's special tokens and the sentinels must fill the model's vocabulary")


def family_tokenizer(model: ModelSpec) -> tuple[EncDecTokenizer, bool]:
    """(tokenizer, whether it is a placeholder) of an encoder-decoder family; the
    placeholder counts the model's own vocabulary."""
    known = TOKENIZERS.get(model.family)
    if known is not None:
        return known, False
    return EncDecTokenizer(PLACEHOLDER_TOKENIZER.tokenizer_type, PLACEHOLDER_TOKENIZER.origin,
                           model.vocab_size, PLACEHOLDER_TOKENIZER.source), True


def core_t5_refusal(model: ModelSpec, plan: Plan, target: str) -> str | None:
    """Why megatron-core's T5Model cannot run this model or plan under any
    framework (None: it can); ``target`` is the file not written."""
    if model.num_kv_heads != model.num_heads:
        # megatron-core 0.16.1 transformer/attention.py CrossAttention.__init__
        return (f"no {target}: {model.name} has {model.num_kv_heads} kv heads for "
                f"{model.num_heads} heads, and megatron-core's T5 cross-attention raises "
                "'Group query attention is not currently supported in cross attention'")
    if model.qk_norm:
        # megatron-core 0.16.1 models/T5/t5_spec.py: q_layernorm/k_layernorm are IdentityOp
        return (f"no {target}: {model.name} has Q/K norms, and megatron-core's T5 layer "
                "specs build none (t5_spec.py: q_layernorm and k_layernorm are IdentityOp)")
    parallel = {"pp": plan.pp, "vp": plan.vp, "cp": plan.cp, "ep": plan.ep}
    extra = [f"{k} {v}" for k, v in parallel.items() if v > 1]
    if extra:
        # autoconfig's plan space gives T5 only these (autoconfig/training/space.py)
        return (f"no {target}: the plan has {', '.join(extra)}, and autoconfig launches T5 "
                "with pp = vp = cp = ep = 1 only (Megatron-LM core_v0.16.1 pretrain_t5.py: "
                "'Pipeline parallelism is not supported for T5')")
    return None

