"""The plan space: every valid parallel layout of one model on one cluster.

Each axis has a small generator that yields only values valid for the model
on its own (calculon's ``get_all_tensor_parallelisms`` style); the cross-axis
rules are masks over a numpy cartesian product, and each rejected candidate is
counted under the first rule it breaks. No Plan object is built per candidate.

Axis rules (Megatron-LM ``megatron/training/arguments.py`` and
``megatron/core/pipeline_parallel/schedules.py``):

- tp divides heads, kv heads and ffn hidden (column/row-parallel splits), and is
  at most the NVLink domain (GPUs per node) unless the user says otherwise.
- pp splits the layers: evenly (L/pp), or unevenly with Megatron's
  ``--decoder-first/last-pipeline-num-layers`` (``stage_splits``): the split
  that counts the embedding and the output layer as one layer each (Megatron
  --account-for-embedding/loss-in-pipeline-split: first = last = (L+2)/pp - 1)
  and, for a pp that does not divide L, the split closest to even with the
  remainder taken off the first and last stages.
- vp (virtual stages per rank) divides layers/pp, needs pp > 1, and the number
  of micro-batches must be a multiple of pp ("number of microbatches is not
  divisible by pipeline-parallel size when using interleaved schedule").
  Recent Megatron overlaps the interleaved p2p by default, so pp = 2 is allowed.
- cp: ``seq_len % (2 cp) == 0`` (each rank holds two balanced chunks). Tried
  automatically only for seq_len >= 4096 and seq/cp >= 1024; CP on short
  sequences only shrinks the GEMMs. Megatron does not force SP on with CP.
- dp = GPUs / (tp pp cp) must be integral; GBS must be divisible by mbs dp.
- sp only with tp > 1 (Megatron turns it off at tp = 1), and the CP-local
  sequence must split over tp: ``(seq/cp) % tp == 0``.
- recompute: none, selective (attention core only), or full with method
  uniform (groups of n layers, n a divisor of the layers of one model chunk)
  or block (the first n layers of each chunk, 1 <= n < chunk layers; n equal
  to the chunk is the same as uniform 1 and is not listed twice). A model chunk
  is layers/(pp vp): Megatron applies ``--recompute-num-layers`` per chunk.
- distributed optimizer on/off; on is only listed when dp > 1 (with dp = 1 it
  shards nothing).
- ep and etp (MoE models only; megatron-core ``initialize_model_parallel``):
  ep divides the routed experts (arguments.py: "Number of experts should be a
  multiple of expert model parallel_size"); the expert grid etp x ep x edp x pp
  folds into the same world as tp x cp x dp x pp, so ep * etp divides tp * cp *
  dp; etp splits every expert's FFN, so it divides the expert FFN width.
  Automatic ep: the divisors of the world size up to the expert count; etp: 1
  or tp (megatron's default when --expert-tensor-parallel-size is not given).
  MoE layers with tp > 1 are modelled with sequence parallelism only (tokens
  split over tp before dispatch, as every NVIDIA MoE recipe runs).
"""

from dataclasses import dataclass, field

import numpy as np

from autoconfig.errors import InputError
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.training.context_parallel import a2a_group_size, heads_divide
from autoconfig.core.plan import (RECOMPUTE_KINDS, RECOMPUTE_METHODS, Plan, PlanTable,
                                  module_mask,
                                  Workload, counts_embedding_and_loss, is_short_last_layout,
                                  short_last_stage_split,
                                  stage_layer_columns, stage_layers)

SWITCH_MODES = ("auto", "on", "off")
CP_MIN_AUTO_SEQ_LEN = 4096
"""Below this sequence length CP is only tried when asked for (--cp)."""
CP_MIN_TOKENS_PER_RANK = 1024
"""Automatic CP keeps at least this many tokens of a sequence per CP rank."""

# Rejection reasons, in the order they are tested (a candidate counts once,
# under the first rule it breaks).
R_DP = "dp not integral (GPUs not divisible by tp*pp*cp)"
R_VP_PP = "vp > 1 needs pp > 1"
R_VP_LAYERS = "stage layers not divisible by vp"
R_SP_TP = "sp needs tp > 1"
R_SP_SEQ = "seq/cp not divisible by tp (sp)"
R_GBS = "gbs not divisible by mbs*dp"
R_VP_MB = "vp needs micro-batches multiple of pp"
R_EP_DENSE = "ep or etp > 1 needs an MoE model"
R_EP_EXPERTS = "ep does not divide the experts"
R_ETP_FFN = "etp does not divide the expert ffn"
R_EP_FOLD = "ep*etp does not divide tp*cp*dp (expert folding)"
R_MOE_SP = "MoE with tp > 1 needs sp"
R_ENC_DEC = "T5 has no pp or cp in megatron-core (pretrain_t5.py)"
R_CP_HEADS = "cp a2a group does not divide the heads per tp rank"
R_STACK = "recompute method the stack does not have"
R_MEMORY = "exceeds memory"
REASONS = (R_DP, R_VP_PP, R_VP_LAYERS, R_SP_TP, R_SP_SEQ, R_GBS, R_VP_MB, R_EP_DENSE,
           R_EP_EXPERTS, R_ETP_FFN, R_EP_FOLD, R_MOE_SP, R_ENC_DEC, R_CP_HEADS, R_STACK, R_MEMORY)


@dataclass(frozen=True)
class AxisChoices:
    """What the user narrowed; ``None`` (or ``"auto"``) means every valid value."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    vp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    """Subset of RECOMPUTE_KINDS."""
    sp: str = "auto"
    distributed_optimizer: str = "auto"
    max_tp: int | None = None
    """Largest tp tried; default: the NVLink domain (GPUs per node)."""
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "vp", "cp", "mbs", "ep", "etp"):
            values = getattr(self, name)
            if values is not None and (not values or any(int(v) < 1 for v in values)):
                raise InputError(f"invalid --{name} {','.join(map(str, values))}: "
                                 "expected positive integers or 'auto'")
        if self.recompute is not None:
            bad = [k for k in self.recompute if k not in RECOMPUTE_KINDS]
            if bad or not self.recompute:
                raise InputError(f"invalid --recompute {','.join(self.recompute)}: allowed are "
                                 f"{', '.join(RECOMPUTE_KINDS)} or auto")
        for name in ("sp", "distributed_optimizer"):
            if getattr(self, name) not in SWITCH_MODES:
                raise InputError(f"invalid --{name.replace('_', '-')} {getattr(self, name)!r}: "
                                 f"allowed are {', '.join(SWITCH_MODES)}")
        if self.max_tp is not None and self.max_tp < 1:
            raise InputError(f"invalid --max-tp-per-node {self.max_tp}: must be >= 1")


@dataclass(frozen=True, eq=False)
class PlanSpace:
    """The valid plans and what was thrown out, by reason."""

    plans: PlanTable
    rejected: dict[str, int] = field(default_factory=dict)
    """Candidates rejected per reason (only reasons that fired, in REASONS order)."""
    considered: int = 0
    """All candidates of the cartesian product: len(plans) + sum(rejected)."""


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tp_values(model: ModelSpec, cluster: Cluster, choices: AxisChoices) -> list[int]:
    """tp must divide heads, kv heads and ffn hidden; at most the NVLink domain."""
    limit = choices.max_tp
    if limit is None and choices.tp is None:
        limit = cluster.nvlink_domain_gpus
    shared = model.moe_shared_expert_ffn_hidden_size
    if choices.tp is None:
        values = [t for t in divisors(model.num_kv_heads)
                  if model.num_heads % t == 0 and model.ffn_hidden_size % t == 0
                  and shared % t == 0]
    else:
        values = sorted(set(choices.tp))
        for t in values:
            if t > model.num_heads:
                raise InputError(f"invalid tp {t}: larger than the {model.num_heads} attention "
                                 f"heads of {model.name}")
            if model.num_heads % t or model.num_kv_heads % t or model.ffn_hidden_size % t:
                raise InputError(f"invalid tp {t}: must divide heads {model.num_heads}, kv heads "
                                 f"{model.num_kv_heads} and ffn hidden {model.ffn_hidden_size}")
    values = [t for t in values if t <= cluster.num_gpus and (limit is None or t <= limit)]
    if not values:
        raise InputError(f"no tensor-parallel size left: --tp {_fmt(choices.tp)} with "
                         f"max tp {limit} on {cluster.num_gpus} GPUs")
    return values


def stage_splits(num_layers: int, pp: int, mtp_layers: int = 0) -> list[tuple[int, int]]:
    """(first, last) stage layer counts worth trying for ``pp`` stages (0 = as the
    middle stages): the even split where pp divides L; the split that counts the
    embedding and the output layer as one layer each, first = last = (L+2)/pp - 1
    (Megatron --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split; Llama 3 405B's 126 layers on 16 stages:
    7, 14 x 8, 7, Dubey et al. 2024 Sec. 3.3.2); and where neither exists, the
    split closest to even: middle stages ceil(L/pp), the rest shared by the first
    and last (the last, which also holds the output layer, takes the smaller half).
    With MTP modules (``mtp_layers``) also the split whose last stage is short
    (``short_last_stage_split``), which Megatron-Bridge's DeepSeek-V3 layouts use
    to make room for them.
    """
    if pp == 1:
        return [(0, 0)]
    short = short_last_stage_split(num_layers, pp) if mtp_layers else 0
    splits = []
    if num_layers % pp == 0:
        splits.append((0, 0))
    if pp > 2 and (num_layers + 2) % pp == 0 and (num_layers + 2) // pp >= 2:
        edge = (num_layers + 2) // pp - 1
        splits.append((edge, edge))
    if not splits:
        middle = -(-num_layers // pp)
        rest = num_layers - (pp - 2) * middle
        last = rest // 2
        first = rest - last
        if last >= 1 and first <= middle:
            splits.append((first, last))
    if short and (0, short) not in splits:
        splits.append((0, short))
    return splits


def default_split(num_layers: int, pp: int, mtp_layers: int = 0, vp: int = 1) -> tuple[int, int]:
    """The split ``estimate`` uses for a pp that does not divide the layers and
    no split given: with MTP modules the short last stage of the Bridge layouts
    (chunks of ceil(L/(pp vp))), else the first of ``stage_splits`` (InputError
    when none)."""
    short = short_last_stage_split(num_layers, pp, vp) if mtp_layers else 0
    if short:
        return 0, short
    splits = [s for s in stage_splits(num_layers, pp) if s != (0, 0)]
    if not splits:
        raise InputError(f"invalid pp {pp}: cannot split the {num_layers} layers into {pp} "
                         "stages")
    return splits[0]


def pp_values(model: ModelSpec, cluster: Cluster, choices: AxisChoices) -> list[int]:
    """pp must split the layers, evenly or unevenly (``stage_splits``)."""
    if choices.pp is None:
        return [p for p in range(1, min(model.num_layers, cluster.num_gpus) + 1)
                if stage_splits(model.num_layers, p, model.mtp_layers)
                and (model.num_layers % p == 0 or cluster.num_gpus % p == 0)]
    values = sorted(set(choices.pp))
    for p in values:
        if p > model.num_layers or not stage_splits(model.num_layers, p, model.mtp_layers):
            raise InputError(f"invalid pp {p}: cannot split the {model.num_layers} layers of "
                             f"{model.name} into {p} stages")
        if p > cluster.num_gpus:
            raise InputError(f"invalid pp {p}: larger than the {cluster.num_gpus} GPUs")
    return values


def cp_values(workload: Workload, cluster: Cluster, choices: AxisChoices) -> list[int]:
    """cp needs seq_len % (2 cp) == 0; automatic only for long sequences."""
    seq = workload.seq_len
    if choices.cp is None:
        if seq < CP_MIN_AUTO_SEQ_LEN:
            return [1]
        return [c for c in divisors(seq) if c == 1 or (seq % (2 * c) == 0
                and seq // c >= CP_MIN_TOKENS_PER_RANK and c <= cluster.num_gpus)]
    values = sorted(set(choices.cp))
    for c in values:
        if c > 1 and seq % (2 * c):
            raise InputError(f"invalid cp {c}: sequence length {seq} must be a multiple of "
                             f"2*cp = {2 * c}")
        if c > cluster.num_gpus:
            raise InputError(f"invalid cp {c}: larger than the {cluster.num_gpus} GPUs")
    return values


def ep_values(model: ModelSpec, cluster: Cluster, choices: AxisChoices) -> list[int]:
    """Expert-parallel sizes: 1 for dense models; else the user's, or every
    divisor of the world size up to the expert count (the masks then reject
    those that do not divide the experts, so the reason is counted)."""
    if choices.ep is not None:
        return sorted(set(choices.ep))
    if not model.is_moe:
        return [1]
    return [e for e in divisors(cluster.num_gpus) if e <= model.num_experts]


ETP_IS_TP = 0
"""``etp_values`` marker: etp equal to the row's tp (megatron's default)."""


def etp_values(model: ModelSpec, choices: AxisChoices) -> list[int]:
    """Expert tensor-parallel sizes: the user's, else 1 and ``ETP_IS_TP``."""
    if choices.etp is not None:
        return sorted(set(choices.etp))
    return [1, ETP_IS_TP] if model.is_moe else [1]


def mbs_values(workload: Workload, choices: AxisChoices) -> list[int]:
    """Micro-batch sizes: every divisor of the global batch, or the user's."""
    if choices.mbs is None:
        return divisors(workload.global_batch_size)
    return sorted(set(choices.mbs))


def pp_vp_pairs(model: ModelSpec, pps: list[int], choices: AxisChoices) -> np.ndarray:
    """(pp, vp, first, last) rows: every stage split of each pp, crossed with
    automatic vp (divisors of the middle stages' layers that also divide the
    first and last stages'; vp > 1 only when pp > 1) or the user's vp list,
    which the masks then check so its rejections are counted. Models with MTP
    modules also get the interleaved short-last layouts (``short_last_stage_split``
    with vp: chunks of ceil(L/(pp vp)) layers, the very last one shorter)."""
    rows = []
    for p in pps:
        for first, last in stage_splits(model.num_layers, p, model.mtp_layers):
            layers = _split_layers(model.num_layers, p, first, last)
            if choices.vp is not None:
                vps = sorted(set(choices.vp))
            elif p == 1:
                vps = [1]
            elif counts_embedding_and_loss(model.num_layers, p, first, last):
                vps = divisors((model.num_layers + 2) // p)
            elif first == 0 and last and last == short_last_stage_split(model.num_layers, p):
                vps = [v for v in divisors(layers[1])
                       if layers[2] % v == 0 or is_short_last_layout(model.num_layers, p, v,
                                                                     first, last)]
            else:
                vps = [v for v in divisors(layers[1]) if layers[0] % v == 0
                       and layers[2] % v == 0]
            rows += [(p, v, first, last) for v in vps]
        if model.mtp_layers and p > 1:
            known = {(r[1], r[2], r[3]) for r in rows if r[0] == p}
            wanted = choices.vp if choices.vp is not None else range(2, model.num_layers // p + 1)
            for v in wanted:
                last = short_last_stage_split(model.num_layers, p, v)
                if last and v > 1 and (v, 0, last) not in known and bool(
                        is_short_last_layout(model.num_layers, p, v, 0, last)):
                    rows.append((p, v, 0, last))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def _split_layers(num_layers: int, pp: int, first: int, last: int) -> tuple[int, int, int]:
    """(first, middle, last) stage layers of one split (integers)."""
    cols = stage_layer_columns(num_layers, pp, first, last)
    return tuple(int(round(float(cols[k]))) for k in ("first", "middle", "last"))


def _switch(mode: str) -> list[bool]:
    return {"auto": [False, True], "on": [True], "off": [False]}[mode]


def _grid(*axes: np.ndarray) -> list[np.ndarray]:
    """Cartesian product of 1-D arrays as flat columns (first axis slowest)."""
    mesh = np.meshgrid(*axes, indexing="ij")
    return [m.ravel() for m in mesh]


def structural_masks(model: ModelSpec, workload: Workload, num_gpus: int,
                     cols: dict[str, np.ndarray], cp_comm_type: str = "p2p",
                     domain_gpus: int = 8) -> list[tuple[str, np.ndarray]]:
    """The cross-axis rules, in order, as (reason, broken) boolean arrays.

    ``cols`` holds tp, pp, vp, cp, mbs, sp (bool) columns of equal length;
    ``cp_comm_type`` is the stack's context-parallel scheme, whose all-to-all
    group (``context_parallel.a2a_group_size`` in an NVLink domain of
    ``domain_gpus``) must divide the heads a TP rank holds.
    """
    tp, pp, vp, cp, mbs, sp = (cols[k] for k in ("tp", "pp", "vp", "cp", "mbs", "sp"))
    stages = stage_layer_columns(model.num_layers, pp, cols.get("first_stage_layers", 0),
                                 cols.get("last_stage_layers", 0))
    model_parallel = tp * pp * cp
    dp = np.maximum(num_gpus // model_parallel, 1)
    micro_batches = workload.global_batch_size // np.maximum(mbs * dp, 1)
    ep = np.asarray(cols.get("ep", 1))
    etp = np.asarray(cols.get("etp", 1))
    experts = max(model.num_experts, 1)
    expert_ffn = max(model.moe_ffn_hidden_size, 1)
    return [
        (R_DP, (num_gpus % model_parallel != 0) | (model_parallel > num_gpus)),
        (R_VP_PP, (vp > 1) & (pp == 1)),
        (R_VP_LAYERS, ((stages["first"] % vp != 0) | (stages["middle"] % vp != 0)
                       | (stages["last"] % vp != 0))
         & ~(counts_embedding_and_loss(model.num_layers, pp, cols.get("first_stage_layers", 0),
                                       cols.get("last_stage_layers", 0))
             & ((model.num_layers + 2) % (pp * vp) == 0))
         & ~is_short_last_layout(model.num_layers, pp, vp, cols.get("first_stage_layers", 0),
                                 cols.get("last_stage_layers", 0))),
        (R_SP_TP, sp & (tp == 1)),
        (R_SP_SEQ, sp & (((workload.seq_len // cp) % tp != 0)
                         | (model.decoder_seq_len % tp != 0))),
        (R_GBS, workload.global_batch_size % (mbs * dp) != 0),
        (R_VP_MB, (vp > 1) & (micro_batches % pp != 0)),
        (R_EP_DENSE, ((ep > 1) | (etp > 1)) & (not model.is_moe)),
        (R_EP_EXPERTS, experts % ep != 0),
        (R_ETP_FFN, expert_ffn % etp != 0),
        (R_EP_FOLD, (tp * cp * dp) % (ep * etp) != 0),
        (R_MOE_SP, model.is_moe & (tp > 1) & ~sp),
        # megatron-core 0.16 builds T5 as one encoder-decoder model per rank:
        # its pretrain_t5.py raises "Pipeline parallelism is not supported for
        # T5" and the pipeline schedules refuse encoder_and_decoder models; no
        # T5 path splits the sequence over context-parallel ranks.
        (R_ENC_DEC, model.is_encoder_decoder & ((pp > 1) | (cp > 1))),
        (R_CP_HEADS, (cp > 1) & ~heads_divide(
            model, tp, a2a_group_size(cp_comm_type, model, tp, cp, domain_gpus))),
    ]


def module_variants(model: ModelSpec) -> tuple[int, ...]:
    """Selective-recompute module sets tried for a model (bitmasks of
    RECOMPUTE_MODULES): Megatron's default (core_attn) for every model; for MoE
    models also the sets the Megatron-Bridge MoE performance recipes use
    (perf_recipes/*: ["mla_up_proj"], ["layernorm", "moe_act"], ["mlp"],
    ["mla_up_proj", "mlp"]), MLA's only for MLA models, and "moe" (the whole
    MoE block). "mlp" touches only dense layers (megatron-core skips it on MoE
    layers), so it is tried only where the model has dense layers."""
    sets = [""]
    if model.is_moe:
        has_dense = "dense" in model.layer_pattern
        sets += ["layernorm,moe_act", "moe"] + (["mlp"] if has_dense else [])
        if model.attention_kind == "mla":
            sets += ["mla_up_proj"] + (["mla_up_proj,mlp"] if has_dense else [])
    return tuple(module_mask(m) for m in sets)


def recompute_variants(chunk_layers: int, kinds: tuple[str, ...],
                       modules: tuple[int, ...] = (1,)) -> np.ndarray:
    """Rows of (kind code, method code, num layers, modules mask) for one
    model-chunk size.

    selective lists each module set of ``modules``; full/uniform lists every
    divisor n of the chunk (groups of n layers); full/block lists
    1 <= n < chunk (block n = chunk equals uniform 1).
    """
    rows = []
    default = module_mask("")
    uniform, block = RECOMPUTE_METHODS.index("uniform"), RECOMPUTE_METHODS.index("block")
    for kind in RECOMPUTE_KINDS:
        if kind not in kinds:
            continue
        code = RECOMPUTE_KINDS.index(kind)
        if kind == "selective":
            rows += [(code, uniform, 0, mask) for mask in modules]
            continue
        if kind != "full":
            rows.append((code, uniform, 0, default))
            continue
        rows += [(code, uniform, n, default) for n in divisors(chunk_layers)]
        rows += [(code, block, n, default) for n in range(1, chunk_layers)]
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def enumerate_plans(model: ModelSpec, workload: Workload, cluster: Cluster,
                    choices: AxisChoices = AxisChoices(),
                    cp_comm_type: str = "p2p") -> PlanSpace:
    """Every valid plan, plus the count of candidates rejected per reason.

    The product of tp x (pp, vp) x cp x mbs x sp x distributed optimizer is
    small (thousands); it is masked first, and only surviving rows are
    expanded by their recompute variants. Rejected rows count with the number
    of recompute variants they would have had, so ``considered`` is the size
    of the whole cartesian product.
    """
    num_gpus = cluster.num_gpus
    kinds = tuple(choices.recompute) if choices.recompute is not None else RECOMPUTE_KINDS
    tps = np.array(tp_values(model, cluster, choices), dtype=np.int64)
    pairs = pp_vp_pairs(model, pp_values(model, cluster, choices), choices)
    cps = np.array(cp_values(workload, cluster, choices), dtype=np.int64)
    mbss = np.array(mbs_values(workload, choices), dtype=np.int64)
    sps = np.array(_switch(choices.sp))
    dos = np.array(_switch(choices.distributed_optimizer))
    eps = np.array(ep_values(model, cluster, choices), dtype=np.int64)
    etps = np.array(etp_values(model, choices), dtype=np.int64)

    t, pair, c, m, s, d, e, et = _grid(tps, np.arange(len(pairs)), cps, mbss, sps, dos, eps, etps)
    cols = {"tp": t, "pp": pairs[pair, 0], "vp": pairs[pair, 1], "cp": c, "mbs": m, "sp": s,
            "distributed_optimizer": d, "first_stage_layers": pairs[pair, 2],
            "last_stage_layers": pairs[pair, 3], "ep": e,
            "etp": np.where(et == ETP_IS_TP, t, et)}
    dp = num_gpus // (cols["tp"] * cols["pp"] * cols["cp"])
    # Variants that are never generated (not rejections): sp on at tp = 1 and
    # distributed optimizer on at dp = 1 when the user left them on auto; etp = tp
    # where tp = 1 (the same plan as etp 1).
    keep = np.ones(len(t), dtype=bool)
    if choices.etp is None and model.is_moe:
        keep &= ~((et == ETP_IS_TP) & (t == 1))
    if choices.sp == "auto":
        keep &= ~(cols["sp"] & (cols["tp"] == 1))
    if choices.distributed_optimizer == "auto":
        keep &= ~(cols["distributed_optimizer"] & (dp <= 1))
    cols = {k: v[keep] for k, v in cols.items()}

    chunk, whole_chunk = _chunk_layers(model, cols)
    modules = module_variants(model)
    weight = _variant_counts(model.num_layers, kinds, modules)[np.where(whole_chunk, chunk, 0)]

    rejected: dict[str, int] = {}
    alive = np.ones(len(weight), dtype=bool)
    for reason, broken in structural_masks(model, workload, num_gpus, cols, cp_comm_type,
                                           cluster.nvlink_domain_gpus):
        hit = alive & broken
        if hit.any():
            rejected[reason] = int(weight[hit].sum())
        alive &= ~broken
    cols = {k: v[alive] for k, v in cols.items()}
    considered = int(weight.sum())
    return PlanSpace(plans=_expand_recompute(model, cols, kinds, num_gpus, modules),
                     rejected=rejected, considered=considered)


def _variant_counts(num_layers: int, kinds: tuple[str, ...],
                    modules: tuple[int, ...] = (1,)) -> np.ndarray:
    """Recompute variants per chunk size 0..num_layers (0: chunk not whole,
    counted once per kind)."""
    counts = np.zeros(num_layers + 1, dtype=np.int64)
    counts[0] = len(kinds)
    for n in range(1, num_layers + 1):
        counts[n] = len(recompute_variants(n, kinds, modules))
    return counts


def _expand_recompute(model: ModelSpec, cols: dict[str, np.ndarray], kinds: tuple[str, ...],
                      num_gpus: int, modules: tuple[int, ...] = (1,)) -> PlanTable:
    """Cross each surviving row with the recompute variants of its chunk size
    (one numpy repeat per distinct chunk size, not a loop per plan)."""
    chunk, _ = _chunk_layers(model, cols)
    parts: list[dict[str, np.ndarray]] = []
    for size in np.unique(chunk):
        rows = np.flatnonzero(chunk == size)
        variants = recompute_variants(int(size), kinds, modules)
        k = len(variants)
        part = {name: np.repeat(v[rows], k) for name, v in cols.items()}
        part["recompute"] = np.tile(variants[:, 0], len(rows)).astype(np.int8)
        part["recompute_method"] = np.tile(variants[:, 1], len(rows)).astype(np.int8)
        part["recompute_num_layers"] = np.tile(variants[:, 2], len(rows))
        part["recompute_modules"] = np.tile(variants[:, 3], len(rows))
        parts.append(part)
    names = ("tp", "pp", "vp", "cp", "mbs", "sp", "distributed_optimizer", "recompute",
             "recompute_method", "recompute_num_layers", "first_stage_layers",
             "last_stage_layers", "ep", "etp", "recompute_modules")
    if parts:
        merged = {n: np.concatenate([p[n] for p in parts]) for n in names}
    else:
        merged = {n: np.zeros(0, dtype=np.int8 if n.startswith("recompute_m") or n == "recompute"
                              else bool if n in ("sp", "distributed_optimizer") else np.int64)
                  for n in names}
    merged["dp"] = num_gpus // np.maximum(merged["tp"] * merged["pp"] * merged["cp"], 1)
    return PlanTable(**merged)


def _chunk_layers(model: ModelSpec, cols: dict) -> tuple[np.ndarray, np.ndarray]:
    """(layers of one model chunk of the middle stages, whether that is whole):
    Megatron applies --recompute-num-layers per chunk of layers/(pp vp); an
    encoder-decoder's encoder and decoder are two blocks that each apply it
    (megatron-core T5 gives both the same recompute settings)."""
    if model.is_encoder_decoder:
        block = max(model.encoder_layers, model.decoder_layers)
        return np.full(len(cols["pp"]), block, dtype=np.int64), np.ones(len(cols["pp"]), bool)
    stages = stage_layer_columns(model.num_layers, cols["pp"], cols["first_stage_layers"],
                                 cols["last_stage_layers"])
    chunk = stages["middle"] / cols["vp"]
    whole = np.isclose(chunk, np.round(chunk)) & (chunk >= 1)
    return np.where(whole, np.round(chunk), 0).astype(np.int64), whole


def check_plan(model: ModelSpec, workload: Workload, cluster: Cluster, plan: Plan,
               cp_comm_type: str = "p2p") -> None:
    """Raise InputError naming the first rule a user's single plan breaks."""
    choices = AxisChoices(tp=(plan.tp,), pp=(plan.pp,), cp=(plan.cp,), max_tp=plan.tp,
                          ep=(plan.ep,), etp=(plan.etp,))
    tp_values(model, cluster, choices)
    cp_values(workload, cluster, choices)
    if plan.tp * plan.pp * plan.cp * plan.dp != cluster.num_gpus:
        raise InputError(f"invalid plan: tp*pp*cp = {plan.tp * plan.pp * plan.cp} does not "
                         f"divide the {cluster.num_gpus} GPUs into a whole data-parallel size")
    stage_layers(model.num_layers, plan)  # InputError for a split the layers do not allow
    cols = {k: np.array([getattr(plan, k)]) for k in ("tp", "pp", "vp", "cp", "mbs", "sp",
                                                       "first_stage_layers", "last_stage_layers",
                                                       "ep", "etp")}
    for reason, broken in structural_masks(model, workload, cluster.num_gpus, cols,
                                           cp_comm_type, cluster.nvlink_domain_gpus):
        if broken[0]:
            raise InputError(f"invalid plan: {reason} ({_describe(plan, workload)})"
                             f"{_allowed_instead(reason, model, plan)}")
    if plan.recompute == "full":
        chunk = max(stage_layers(model.num_layers, plan)) // plan.vp
        if model.is_encoder_decoder:
            chunk = max(model.encoder_layers, model.decoder_layers)
        if plan.recompute_num_layers > chunk:
            raise InputError(f"invalid recompute layers {plan.recompute_num_layers}: a model "
                             f"chunk has {chunk} layers (layers/(pp*vp))")


def _allowed_instead(reason: str, model: ModelSpec, plan: Plan) -> str:
    """What a user's plan may give instead, for the rules that have a fix to name."""
    allowed = {
        R_EP_DENSE: f": {model.name} has no experts, give --ep 1 --etp 1",
        R_EP_EXPERTS: f": ep must divide the {model.num_experts} experts",
        R_ETP_FFN: f": etp must divide the expert ffn {model.moe_ffn_hidden_size}",
        R_EP_FOLD: f": ep*etp = {plan.ep * plan.etp} must divide tp*cp*dp = "
                   f"{plan.tp * plan.cp * plan.dp}",
        R_MOE_SP: ": add --sp",
        R_ENC_DEC: ": give --pp 1 --cp 1",
        R_CP_HEADS: f": {model.num_heads} query and {model.num_kv_heads} key-value heads over "
                    f"tp {plan.tp} must divide by cp, or give --cp-comm-type p2p",
    }
    return allowed.get(reason, "")


def dp_for(num_gpus: int, tp: int, pp: int, cp: int) -> int:
    """Data-parallel size, or InputError when the GPUs do not split evenly."""
    model_parallel = tp * pp * cp
    if model_parallel > num_gpus or num_gpus % model_parallel:
        raise InputError(f"invalid plan: tp*pp*cp = {tp}*{pp}*{cp} = {model_parallel} does not "
                         f"divide the {num_gpus} GPUs (dp would not be a whole number)")
    return num_gpus // model_parallel


def _describe(plan: Plan, workload: Workload) -> str:
    experts = f"ep {plan.ep}, etp {plan.etp}, " if plan.ep > 1 or plan.etp > 1 else ""
    return (f"tp {plan.tp}, pp {plan.pp}, vp {plan.vp}, cp {plan.cp}, {experts}dp {plan.dp}, "
            f"mbs {plan.mbs}, gbs {workload.global_batch_size}, seq {workload.seq_len}")


def _fmt(values: tuple[int, ...] | None) -> str:
    return "auto" if values is None else ",".join(map(str, values))
