"""Parallel plans: one frozen, hashable ``Plan`` and a columnar ``PlanTable``.

A plan is the key of everything predicted or measured about it; it is never
encoded in a string and parsed back. The table holds many plans as numpy
columns so the memory and step-time models evaluate a whole grid at once.
"""

from dataclasses import asdict, dataclass, fields

import numpy as np

from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, InputError, shown

RECOMPUTE_KINDS = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
PRECISIONS = ("bf16", "fp8", "nvfp4")
"""Training precisions: bf16, FP8 (a recipe of ``autoconfig.training.fp8``) and
NVFP4 (Transformer Engine's NVFP4BlockScaling, also ``autoconfig.training.fp8``)."""
SERVING_PRECISIONS = ("bf16", "fp8", "nvfp4")
"""Precisions ``infer`` prices: bf16; FP8 weights, activations and KV cache; NVFP4
weights and activations (Blackwell) with an FP8 KV cache."""
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe")
"""Megatron --recompute-modules (with --recompute-granularity selective): what each
recomputes instead of keeping for backward (megatron-core TransformerConfig
``recompute_modules``): the attention core, the norms' outputs, MLA's
up-projections, the experts' activation function, the whole MLP (an MoE layer's
whole MoE block), the MoE block. Megatron's default is core_attn alone."""


def module_mask(modules: str) -> int:
    """Bitmask of a comma-separated module list ('' = Megatron's default core_attn)."""
    names = [m.strip() for m in modules.split(",") if m.strip()] or ["core_attn"]
    bad = [m for m in names if m not in RECOMPUTE_MODULES]
    if bad:
        raise InputError(f"invalid recompute module {shown(bad[0])}: allowed are "
                         f"{', '.join(RECOMPUTE_MODULES)}")
    return sum(1 << RECOMPUTE_MODULES.index(m) for m in set(names))


def module_list(mask: int) -> str:
    """The canonical comma-separated list of a bitmask ('' for core_attn alone)."""
    names = [m for i, m in enumerate(RECOMPUTE_MODULES) if mask & (1 << i)]
    return "" if names == ["core_attn"] else ",".join(names)


@dataclass(frozen=True)
class Workload:
    """What one optimizer step processes: batch, sequence and precision."""

    global_batch_size: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    precision: str = "bf16"

    def __post_init__(self) -> None:
        if not 1 <= self.global_batch_size <= MAX_COUNT:
            raise InputError(f"invalid global batch size {shown(self.global_batch_size)}: must "
                             f"be from 1 to {MAX_COUNT}")
        if not 1 <= self.seq_len <= MAX_SEQ_LEN:
            raise InputError(f"invalid sequence length {shown(self.seq_len)}: must be from 1 "
                             f"to {MAX_SEQ_LEN}")
        if self.precision not in PRECISIONS:
            raise InputError(f"invalid precision {self.precision!r}: allowed are "
                             f"{', '.join(PRECISIONS)}")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


@dataclass(frozen=True, order=True)
class Plan:
    """One parallel layout of a training job (Megatron-LM terms)."""

    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline-parallel size."""
    dp: int
    """Data-parallel size (derived: GPUs / (tp * pp * cp))."""
    cp: int = 1
    """Context-parallel size."""
    vp: int = 1
    """Virtual pipeline stages per rank (interleaved 1F1B when > 1)."""
    sp: bool = False
    """Sequence parallelism (only with tp > 1)."""
    mbs: int = 1
    """Micro-batch size in sequences."""
    recompute: str = "none"
    """Activation recompute: none, selective or full."""
    recompute_method: str = "uniform"
    """For full recompute: uniform or block (Megatron --recompute-method)."""
    recompute_num_layers: int = 0
    """For full recompute: layers per stage recomputed (block) or per group
    (uniform); 0 means every layer of the stage."""
    distributed_optimizer: bool = False
    """Shard optimizer state and main params across data-parallel ranks."""
    first_stage_layers: int = 0
    """Transformer layers on the first pipeline stage (Megatron
    --decoder-first-pipeline-num-layers); 0: the even split L/pp."""
    last_stage_layers: int = 0
    """Transformer layers on the last pipeline stage (Megatron
    --decoder-last-pipeline-num-layers); 0: the even split L/pp."""
    ep: int = 1
    """Expert-parallel size (Megatron --expert-model-parallel-size): the routed
    experts of each MoE layer are split over ep ranks."""
    etp: int = 1
    """Expert tensor-parallel size (--expert-tensor-parallel-size): each expert's
    matrices split over etp ranks. The expert data-parallel size follows:
    tp * cp * dp / (ep * etp) (megatron-core ``initialize_model_parallel``)."""
    recompute_modules: str = ""
    """With selective recompute: the modules recomputed (``RECOMPUTE_MODULES``,
    comma-separated, canonical order); '' is Megatron's default, core_attn."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "vp", "mbs", "ep", "etp"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_COUNT:
                raise InputError(f"invalid {name} {shown(value)}: must be a positive integer up "
                                 f"to {MAX_COUNT}")
        if self.recompute not in RECOMPUTE_KINDS:
            raise InputError(f"invalid recompute {self.recompute!r}: allowed are "
                             f"{', '.join(RECOMPUTE_KINDS)}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise InputError(f"invalid recompute method {self.recompute_method!r}: "
                             f"allowed are {', '.join(RECOMPUTE_METHODS)}")
        for name in ("first_stage_layers", "last_stage_layers", "recompute_num_layers"):
            if not 0 <= getattr(self, name) <= MAX_COUNT:
                raise InputError(f"invalid {name} {shown(getattr(self, name))}: must be from 0 "
                                 f"to {MAX_COUNT}")
        for name in ("first_stage_layers", "last_stage_layers"):
            if getattr(self, name) and self.pp == 1:
                raise InputError(f"invalid {name} {getattr(self, name)}: an uneven pipeline "
                                 "split needs pp > 1")
        if self.recompute_num_layers < 0:
            raise InputError(f"invalid recompute layers {self.recompute_num_layers}: must be >= 0")
        if self.sp and self.tp == 1:
            raise InputError("sequence parallel needs tp > 1: use --tp 2 or more, or drop --sp")
        if self.recompute_modules:
            if self.recompute != "selective":
                raise InputError(f"invalid recompute modules {self.recompute_modules!r}: they "
                                 "need --recompute selective")
            canonical = module_list(module_mask(self.recompute_modules))
            if canonical != self.recompute_modules:
                object.__setattr__(self, "recompute_modules", canonical)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def to_dict(self) -> dict:
        return asdict(self)


PLAN_FIELDS = tuple(f.name for f in fields(Plan))
_INT_COLUMNS = ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute_num_layers",
                "first_stage_layers", "last_stage_layers", "ep", "etp")
_MASK_COLUMNS = ("recompute_modules",)
_BOOL_COLUMNS = ("sp", "distributed_optimizer")
_CODE_COLUMNS = {"recompute": RECOMPUTE_KINDS, "recompute_method": RECOMPUTE_METHODS}


@dataclass(frozen=True)
class PlanTable:
    """Many plans as equal-length numpy columns.

    ``recompute`` and ``recompute_method`` are stored as integer codes into
    RECOMPUTE_KINDS and RECOMPUTE_METHODS so formulas can use ``np.where``.
    """

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    vp: np.ndarray
    sp: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray
    recompute_method: np.ndarray
    recompute_num_layers: np.ndarray
    distributed_optimizer: np.ndarray
    first_stage_layers: np.ndarray
    last_stage_layers: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    recompute_modules: np.ndarray
    """Bitmask of RECOMPUTE_MODULES (``module_mask``); core_attn alone by default."""

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @classmethod
    def from_plans(cls, plans: "list[Plan] | tuple[Plan, ...]") -> "PlanTable":
        columns = {}
        for name in PLAN_FIELDS:
            values = [getattr(p, name) for p in plans]
            if name in _CODE_COLUMNS:
                columns[name] = np.array([_CODE_COLUMNS[name].index(v) for v in values],
                                         dtype=np.int8)
            elif name in _MASK_COLUMNS:
                columns[name] = np.array([module_mask(v) for v in values], dtype=np.int64)
            elif name in _BOOL_COLUMNS:
                columns[name] = np.array(values, dtype=bool)
            else:
                columns[name] = np.array(values, dtype=np.int64)
        return cls(**columns)

    def plan(self, i: int) -> Plan:
        """The i-th row as a Plan."""
        kwargs = {}
        for name in PLAN_FIELDS:
            value = getattr(self, name)[i]
            if name in _CODE_COLUMNS:
                kwargs[name] = _CODE_COLUMNS[name][int(value)]
            elif name in _MASK_COLUMNS:
                kwargs[name] = module_list(int(value)) if kwargs["recompute"] == "selective" \
                    else ""
            elif name in _BOOL_COLUMNS:
                kwargs[name] = bool(value)
            else:
                kwargs[name] = int(value)
        return Plan(**kwargs)

    def take(self, index: np.ndarray) -> "PlanTable":
        """The rows at ``index`` (an integer or boolean array)."""
        return PlanTable(**{name: getattr(self, name)[index] for name in PLAN_FIELDS})

    def recompute_is(self, kind: str) -> np.ndarray:
        return self.recompute == RECOMPUTE_KINDS.index(kind)

    @property
    def edp(self) -> np.ndarray:
        """Expert data-parallel size of every plan: the ranks of one stage
        (tp*cp*dp) folded into ep x etp x edp (megatron-core
        ``initialize_model_parallel``); float, as the formulas use it."""
        return self.tp * self.cp * self.dp / (self.ep * self.etp)

    def recomputes(self, module: str) -> np.ndarray:
        """Plans whose selective recompute includes ``module``."""
        bit = 1 << RECOMPUTE_MODULES.index(module)
        return self.recompute_is("selective") & ((self.recompute_modules & bit) != 0)


def stage_layers(num_layers: int, plan: Plan) -> tuple[int, ...]:
    """Transformer layers of every pipeline stage, first to last.

    The even split gives each stage L/pp; an uneven one gives the first and
    last stages their own counts (0 = as the middle stages) and the middle
    stages an equal share of the rest (Megatron's
    --decoder-first/last-pipeline-num-layers). InputError when the layers do
    not split that way.
    """
    pp = plan.pp
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if pp == 1:
        return (num_layers,)
    if not first and not last:
        if num_layers % pp:
            raise InputError(f"invalid pp {pp}: does not divide the {num_layers} layers; give "
                             "the first/last stage layers for an uneven split")
        return (num_layers // pp,) * pp
    middle_stages = pp - (1 if first else 0) - (1 if last else 0)
    rest = num_layers - first - last
    if middle_stages == 0:
        if rest:
            raise InputError(f"invalid stage split {first}+{last} for pp {pp}: must add up to "
                             f"the {num_layers} layers")
        return (first, last)
    if rest < middle_stages or rest % middle_stages:
        raise InputError(f"invalid stage split: {num_layers} layers minus first {first} and "
                         f"last {last} leave {rest}, which the {middle_stages} other stages "
                         "cannot share evenly")
    middle = rest // middle_stages
    return (first or middle,) + (middle,) * (pp - 2) + (last or middle,)


def stage_layer_columns(num_layers: int, pp, first, last) -> dict:
    """Vectorised ``stage_layers``: transformer layers of the ``first``, a
    ``middle`` and the ``last`` pipeline stage per plan (float arrays; with
    pp = 1 all three are the one stage, with pp = 2 the middle is unused and
    equals the first). Rows whose split is invalid get a non-integral middle;
    ``autoconfig.training.space`` rejects them."""
    pp = np.asarray(pp, dtype=float)
    first = np.asarray(first, dtype=float)
    last = np.asarray(last, dtype=float)
    explicit = (first > 0).astype(float) + (last > 0).astype(float)
    middle_stages = np.maximum(pp - explicit, 1.0)
    middle = np.where(pp - explicit > 0, (num_layers - first - last) / middle_stages,
                      np.where(first > 0, first, num_layers / pp))
    single = pp == 1
    return {"first": np.where(single, num_layers, np.where(first > 0, first, middle)),
            "middle": np.where(single | (pp == 2), np.where(first > 0, first, middle), middle),
            "last": np.where(single, num_layers, np.where(last > 0, last, middle))}


def counts_embedding_and_loss(num_layers: int, pp, first, last):
    """Whether a split is the one Megatron's --account-for-embedding-in-pipeline-split
    and --account-for-loss-in-pipeline-split make: the embedding and the loss each
    count as one layer, so first = last = (L + 2)/pp - 1 (vectorised). With virtual
    stages Megatron then needs (L + 2) divisible by pp x vp, not each stage's layers."""
    pp = np.asarray(pp)
    edge = (num_layers + 2) // np.maximum(pp, 1) - 1
    return ((pp > 2) & ((num_layers + 2) % np.maximum(pp, 1) == 0)
            & (np.asarray(first) == edge) & (np.asarray(last) == edge) & (edge >= 1))


def recompute_label(recompute: str, method: str, num_layers: int, modules: str = "") -> str:
    """'none', 'selective', 'selective/mla_up_proj,mlp' or 'full/uniform/1'
    (method and layers only for full, modules only for selective)."""
    if recompute == "selective" and modules:
        return f"selective/{modules}"
    if recompute != "full":
        return recompute
    return f"full/{method}/{num_layers}"


def describe_plan(plan: Plan) -> str:
    """The long one-line form, for reports and messages."""
    recompute = recompute_label(plan.recompute, plan.recompute_method, plan.recompute_num_layers,
                                plan.recompute_modules)
    experts = f"EP {plan.ep}, ETP {plan.etp}, " if plan.ep > 1 or plan.etp > 1 else ""
    return (f"TP {plan.tp}, PP {plan.pp}, VP {plan.vp}, CP {plan.cp}, {experts}DP {plan.dp}, "
            f"SP {'on' if plan.sp else 'off'}, MBS {plan.mbs}, recompute {recompute}, "
            f"distributed optimizer {'on' if plan.distributed_optimizer else 'off'}"
            + (f", stage layers first {plan.first_stage_layers or 'even'} last "
               f"{plan.last_stage_layers or 'even'}"
               if plan.first_stage_layers or plan.last_stage_layers else ""))


def plan_label(plan: Plan) -> str:
    """The compact form for table cells (``tp4 pp8 vp6 dp32 mbs1 sp distopt``):
    display only; everything is keyed on the Plan itself."""
    parts = [f"tp{plan.tp}", f"pp{plan.pp}"]
    if plan.vp > 1:
        parts.append(f"vp{plan.vp}")
    if plan.cp > 1:
        parts.append(f"cp{plan.cp}")
    if plan.ep > 1:
        parts.append(f"ep{plan.ep}")
    if plan.etp > 1:
        parts.append(f"etp{plan.etp}")
    parts += [f"dp{plan.dp}", f"mbs{plan.mbs}"]
    if plan.sp:
        parts.append("sp")
    if plan.recompute != "none":
        rc = plan.recompute
        if plan.recompute == "full":
            rc += f"-{plan.recompute_method}" + (f"{plan.recompute_num_layers}"
                                                 if plan.recompute_num_layers else "")
        if plan.recompute_modules:
            rc += f"[{plan.recompute_modules}]"
        parts.append(f"rc:{rc}")
    if plan.first_stage_layers or plan.last_stage_layers:
        parts.append(f"split:{plan.first_stage_layers or '='}/{plan.last_stage_layers or '='}")
    if plan.distributed_optimizer:
        parts.append("distopt")
    return " ".join(parts)


def stage_kind_columns(model, pp, first, last) -> dict:
    """Layers of each kind (``ModelSpec.layer_pattern``) on the ``first``, a
    ``middle`` (the second) and the ``last`` pipeline stage, per plan:
    ``{stage: {kind: float array}}``. Stages hold consecutive layers, so a
    kind's count on a stage is read off the running count of that kind over
    the pattern (DeepSeek-V3's three leading dense layers land on the first
    stage). Invalid splits (non-integral middles) are rounded; the plan space
    rejects them anyway. Computed once per distinct (pp, first, last)."""
    from autoconfig.core.model import LAYER_KINDS
    pp, first, last = (np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(pp, first, last))
    shape = pp.shape
    base = model.num_layers + 1  # first and last are at most L: one integer per split
    unique, inverse = np.unique(((pp * base + first) * base + last).ravel(), return_inverse=True)
    u_pp, u_first, u_last = unique // (base * base), unique // base % base, unique % base
    cols = stage_layer_columns(model.num_layers, u_pp, u_first, u_last)
    n = model.num_layers
    pattern = np.array(model.layer_pattern)
    single, two = u_pp == 1, u_pp == 2
    f = np.clip(np.round(cols["first"]), 0, n).astype(np.int64)
    mid = np.clip(np.round(cols["middle"]), 0, n).astype(np.int64)
    la = np.clip(np.round(cols["last"]), 0, n).astype(np.int64)
    ranges = {"first": (np.zeros_like(f), f),
              "middle": (np.where(single | two, 0, f),
                         np.where(single | two, f, np.minimum(f + mid, n))),
              "last": (np.where(single, 0, n - la), np.full_like(f, n))}
    out = {}
    for stage, (start, end) in ranges.items():
        out[stage] = {}
        for kind in LAYER_KINDS:
            running = np.concatenate([[0], np.cumsum(pattern == kind)])
            counts = (running[end] - running[start]).astype(float)
            out[stage][kind] = counts[inverse.ravel()].reshape(shape)
    return out


def short_last_stage_split(num_layers: int, pp: int, vp: int = 1) -> int:
    """Layers of the last stage in the split that gives every model chunk
    ceil(L/(pp vp)) layers and the very last chunk the rest (0 when every chunk
    is full or nothing is left). Megatron-Bridge's DeepSeek-V3 and Kimi K2
    pipeline layouts do this (recipes deepseek/h100/deepseek_v3.py
    ``_get_deepseek_v3_pipeline_layout``: PP 4 is 16, 16, 16, 13 + MTP + loss;
    PP 2 x VP 8 gives 16 chunks of 4 but the last, so 32 and 29), leaving room
    on the last stage for the MTP modules and the loss."""
    chunks = pp * max(vp, 1)
    if pp < 2 or num_layers % chunks == 0:
        return 0
    per_chunk = -(-num_layers // chunks)
    last = num_layers - (pp - 1) * max(vp, 1) * per_chunk
    return last if last >= 1 else 0


def is_short_last_layout(num_layers: int, pp, vp, first, last):
    """Whether a (first, last) split with ``vp`` virtual stages is the layout of
    ``short_last_stage_split`` run with the interleaved schedule: every model
    chunk of ceil(L/(pp vp)) layers, the last rank's final chunk shorter
    (Megatron --pipeline-model-parallel-layout; Bridge's PP 4 VP 4 DeepSeek-V3
    layout: 15 chunks of 4 layers, then 1 layer + MTP + loss). Vectorised."""
    pp = np.asarray(pp)
    vp = np.maximum(np.asarray(vp), 1)
    last = np.asarray(last)
    middle = (num_layers - last) / np.maximum(pp - 1, 1)
    chunk = middle / vp
    return ((pp > 1) & (np.asarray(first) == 0) & (last > 0) & (middle == np.round(middle))
            & (chunk == np.round(chunk)) & (last > (vp - 1) * chunk) & (last < vp * chunk))
