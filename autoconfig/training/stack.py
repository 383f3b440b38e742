"""Software stacks: what the training software does, as named, sourced data.

A stack (``heuristics/stacks/<name>.yaml``) is a set of ``SoftwareFeatures``
values, each with its source: Megatron-LM's default flags, NeMo /
Megatron-Bridge performance recipes, Megatron-DeepSpeed, PyTorch FSDP. The
step-time and memory models ask "is TP communication overlapped?", never
"which software is this?"; users pick a stack with ``--stack`` and override
single features with flags (``with_overrides``). Published runs are described
the same way: a stack plus what the source states.
"""

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from autoconfig.core.plan import RECOMPUTE_KINDS, RECOMPUTE_METHODS, Plan, PlanTable
from autoconfig.errors import CatalogError, InputError
from autoconfig.paths import heuristics_dir
from autoconfig.training.context_parallel import CP_COMM_TYPES
from autoconfig.training.fp8 import recipe_name
from autoconfig.yamlio import load_yaml, sourced_field

DEFAULT_STACK = "megatron-lm"
"""Megatron-LM's own defaults: the stack whose every assumption holds for a
plain ``pretrain_gpt.py`` launch with Transformer Engine, so a prediction never
leans on an overlap the user did not switch on. ``--stack nemo`` predicts (and
the launch outputs then set) the performance recipes' overlaps."""
GRAD_REDUCE_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""--grad-reduce-dtype -> bytes per reduced gradient element."""
FSDP_SHARDING = {"full-shard": 2, "shard-grad-op": 1}
"""--fsdp-sharding -> parameter all-gathers per micro-batch (PyTorch ShardingStrategy
FULL_SHARD gathers in forward and again in backward; SHARD_GRAD_OP keeps them)."""
MEGATRON_FSDP_SHARDING = {"full-shard": "optim_grads_params"}
"""--fsdp-sharding on a megatron-core stack -> Megatron-FSDP's
--data-parallel-sharding-strategy. ``optim_grads_params`` shards weights, gradients
and optimizer state over the data-parallel ranks and all-gathers each module's
weights before its forward and again before its backward (megatron-core
``distributed/fsdp``, ``MegatronFSDP``: the pre-forward and pre-backward hooks
unshard, the post hooks reshard), PyTorch's FULL_SHARD. Its ``optim_grads`` keeps
the weights whole, which no PyTorch strategy does, so it has no entry here."""
FRAMEWORKS = ("megatron-core", "megatron-deepspeed", "pytorch-fsdp")
ATTENTION_KERNELS = ("fused", "llm-foundry")
CROSS_ENTROPY_KERNELS = ("unfused", "native", "te", "flash-attn", "torch")
"""How the loss over the vocabulary is computed (``SoftwareFeatures.cross_entropy``;
the bytes each moves per logit are in heuristics/perf.yaml cross_entropy_bytes_per_logit)."""
MOE_DISPATCHERS = ("allgather", "alltoall", "flex-deepep", "flex-hybridep")
"""Token dispatchers of megatron-core MoE layers (--moe-token-dispatcher-type, with
--moe-flex-dispatcher-backend deepep|hybridep for ``flex``)."""
CUDA_GRAPHS = ("none", "te-scoped", "full-iteration")
"""What of a training step runs as CUDA graphs (``SoftwareFeatures.cuda_graph``):
nothing; Transformer Engine's scoped graphs (megatron-core ``--cuda-graph-impl
transformer_engine --cuda-graph-scope attn moe_router moe_preprocess``: the
experts stay eager); or the whole forward-backward (``--cuda-graph-impl local
--cuda-graph-scope full_iteration``)."""
PLAN_FEATURES = {"tp": "tensor parallelism", "pp": "pipeline parallelism",
                 "ep": "expert parallelism",
                 "vp": "interleaved pipeline schedule",
                 "sp": "sequence parallelism", "cp": "context parallelism",
                 "selective_recompute": "selective recompute",
                 "block_recompute": "block recompute (only the first layers of each chunk)",
                 "grouped_recompute": "recompute of groups of several layers"}
"""Plan features a stack may lack (``SoftwareFeatures.cannot_run``) -> what they are."""
WITHOUT = {"tp": "--tp 1", "pp": "--pp 1", "ep": "--ep 1", "vp": "--vp 1", "sp": "sp off", "cp": "--cp 1",
           "selective_recompute": "--recompute none or full",
           "block_recompute": "--recompute-method uniform",
           "grouped_recompute": "--recompute-num-layers 1"}
"""How to ask for a plan without each feature."""
LAUNCHED_FRAMEWORK = "megatron-core"
"""The framework autoconfig's launch files (Megatron-LM, Megatron-Bridge, NeMo) run."""


@dataclass(frozen=True)
class SoftwareFeatures:
    """What the training software does, where it changes the step time."""

    flash_attention: bool = True
    """Fused attention (FlashAttention/cuDNN): no s^2 score traffic, causal half skipped."""
    attention_kernel: str = "fused"
    """With ``flash_attention``: which kernel family, for its efficiency in
    heuristics/perf.yaml attention_efficiency: ``fused`` (Transformer Engine's fused
    attention as megatron-core runs it: cuDNN / FlashAttention-3 class kernels on
    Hopper and Blackwell, FlashAttention-2 on Ampere) or ``llm-foundry`` (the
    attention of llm-foundry's MPT benchmark tables: flash-attn 2 or MPT's Triton
    flash kernel, the tables do not say which)."""
    overlap_grad_reduce: bool = True
    """Megatron --overlap-grad-reduce: gradient buckets reduce while the backward
    of the last micro-batch runs, so only what exceeds it is exposed."""
    overlap_param_gather: bool = True
    """Megatron --overlap-param-gather (with the distributed optimizer): the bf16
    parameter all-gather runs behind the next step's forward instead of after
    the optimizer step."""
    p2p_scatter_gather: bool = True
    """Pipeline sends split over the TP ranks and all-gathered on arrival (Narayanan et
    al. 2021, Sec. 4.1 "scatter/gather optimization"), so each rank sends 1/t of s*b*h;
    with SP the activation is sharded anyway. DeepSpeed's PipelineEngine does the same
    with TP > 1 (partitioned pipe buffers and gradients)."""
    overlap_p2p_comm: bool = True
    """Pipeline sends and receives of the interleaved schedule (VP > 1) run
    asynchronously behind the next model chunk's compute (megatron-core
    ``overlap_p2p_comm``; Megatron-LM's default, ``--no-overlap-p2p-communication``
    turns it off; the Megatron-Bridge recipes set it whenever VP > 1). Without VP,
    or off, each micro-batch's send/receive pair waits on the compute stream
    (1F1B's blocking ``send_forward_recv_backward``), so all of it is exposed."""
    cannot_run: tuple[str, ...] = ()
    """Plan features (``PLAN_FEATURES``) the stack has no implementation of: the
    search never proposes them and ``estimate`` refuses them (PyTorch FSDP is pure
    data parallelism; DeepSpeed's pipeline engine has no interleaved schedule)."""
    framework: str = "megatron-core"
    """Training framework (``megatron-core``, ``megatron-deepspeed`` or
    ``pytorch-fsdp``): picks the per-layer per-micro-batch fixed cost of
    heuristics/perf.yaml."""
    gradient_accumulation_fusion: bool = True
    """Megatron --gradient-accumulation-fusion (on by default since Megatron-LM of
    2022-02, commit 83b1e42f; megatron-core and NeMo keep it): the weight-gradient
    GEMM adds into the fp32 main gradient in its epilogue, so a micro-batch pays
    no pass over the stage's gradients. Off (Megatron-LM of 2020-21, whose backward
    hook runs ``param.main_grad.add_(param.grad.data)``, megatron/model/distributed.py
    at b4bc51b1; DeepSpeed's BF16 optimizer): every micro-batch reads the fresh
    16-bit gradient and reads and writes the accumulator once more
    (``grad_accum_bytes_per_param``). FSDP stacks accumulate only their 1/DP
    shard after the reduce-scatter, so they count as fused."""
    grad_accum_cast_bytes: float = 0.0
    """Extra bytes per parameter per micro-batch of an unfused accumulation that
    first casts the 16-bit gradient to a 32-bit temporary (write 4 + read 4):
    DeepSpeed's BF16 optimizer (``hp_grad.add_(lp.grad.to(hp_grad.dtype))``).
    Paid only with a 32-bit accumulator: 16-bit runs add in place."""
    grad_reduce_bytes: int = 4
    """Bytes per gradient element reduced: Megatron-LM sets accumulate_allreduce_grads_in_fp32
    for bf16 ("bfloat16 requires gradient accumulation and all-reduce to be done in fp32",
    megatron/training/arguments.py), so 4; fp16 runs of 2020-21 reduce in fp16, so 2."""
    tp_async_backward: bool = True
    """megatron-core overlaps the backward TP collective of each column-parallel
    layer (its input gradient) with that layer's weight-gradient GEMM (async
    tensor-parallel all-reduce / reduce-scatter, in Megatron-LM since late 2021).
    Off for 2020-21 Megatron-LM and Megatron-DeepSpeed of 2022."""
    tp_comm_overlap: bool = False
    """Transformer Engine's userbuffers comm-GEMM overlap (Megatron --tp-comm-overlap;
    on in the Megatron-Bridge performance recipes: comm_overlap.tp_comm_overlap_cfg =
    userbuffers_*): each TP all-gather / reduce-scatter is split and pipelined with
    the GEMM next to it, so only TP traffic longer than the layer's weight GEMMs is
    exposed. Off (Megatron-LM default): all of it is."""
    param_gathers_per_microbatch: int = 0
    """Fully sharded data parallel (PyTorch FSDP; Zhao et al. 2023, "PyTorch FSDP",
    Sec. 3): each layer's bf16 parameters are all-gathered over the DP group just
    before use and freed after, and its gradients reduce-scattered as its backward
    ends, for every micro-batch. 2 for FULL_SHARD (ZeRO-3: gathered in forward and
    again in backward; a full recompute runs inside that backward gather), 1 for
    SHARD_GRAD_OP (ZeRO-2: kept from forward to backward), 0 for Megatron (the
    distributed optimizer gathers once per step; see ``overlap_grad_reduce``)."""
    overlap_sharded_comm: bool = True
    """With ``param_gathers_per_microbatch`` > 0: FSDP prefetches the next layer's
    all-gather while the current layer computes (forward_prefetch,
    backward_prefetch=BACKWARD_PRE: the defaults of llm-foundry's FSDP config) and
    reduce-scatters a layer's gradients while earlier layers run backward, so only
    what exceeds the micro-batch's compute, plus the first layer's gather that
    nothing precedes, is exposed; off: all of it."""

    recompute_early_stop: bool = False
    """Full recompute runs under PyTorch's non-reentrant checkpoint, which stops
    recomputing a layer once the last tensor its backward needs is rebuilt
    (torch.utils.checkpoint ``_enable_checkpoint_early_stop = True``, PyTorch
    2.1 on). An op saves its inputs before it runs, so the MLP's down projection,
    whose input is the last tensor saved, is not recomputed, nor what follows it
    (the residual add): a recomputed dense layer costs its forward less that
    GEMM. Off: the whole forward again (Megatron's and DeepSpeed's reentrant
    checkpoint functions, Transformer Engine's checkpoint)."""
    fp8_recipe: str = ""
    """FP8 runs: the Transformer Engine recipe (``autoconfig.training.fp8``:
    delayed, tensorwise, mxfp8, blockwise); empty: the one the Megatron-Bridge
    recipes run on the GPU's generation (heuristics/fp8.yaml default_recipe)."""

    cross_entropy: str = "unfused"
    """How the loss over the vocabulary is computed (``CROSS_ENTROPY_KERNELS``), which
    sets the HBM traffic of the last stage's softmax and its gradient:
    ``unfused`` megatron-core's ``vocab_parallel_cross_entropy`` (Megatron-LM's
    default: ``--cross-entropy-loss-fusion`` is off), ``native`` its fused version
    (``--cross-entropy-loss-fusion --cross-entropy-fusion-impl native``), ``te``
    Transformer Engine's ``parallel_cross_entropy`` (``--cross-entropy-fusion-impl
    te``: what the Megatron-Bridge performance recipes run), ``flash-attn`` the
    Triton cross entropy of the flash-attn package (llm-foundry's default
    ``loss_fn: fused_crossentropy``), ``torch`` PyTorch's ``F.cross_entropy``
    under autocast."""

    moe_dispatcher: str = "allgather"
    """How MoE layers move tokens to their experts (``MOE_DISPATCHERS``):
    megatron-core's default ``allgather`` gathers every token of the
    expert-parallel group on each rank and reduce-scatters the outputs;
    ``alltoall`` sends each token copy only to its expert's rank; ``flex-deepep``
    and ``flex-hybridep`` are the fused all-to-all kernels of DeepEP and HybridEP
    (NVLink and RDMA in one kernel, no separate permute)."""
    moe_a2a_overlap: bool = False
    """Megatron --overlap-moe-expert-parallel-comm (Bridge
    ``comm_overlap.overlap_moe_expert_parallel_comm``): the dispatch and combine
    of one micro-batch run while another micro-batch computes (1F1B A2A overlap),
    so only what exceeds a layer's compute is exposed; off: all of it."""
    cp_comm_type: str = "p2p"
    """How context-parallel attention exchanges its chunks (Megatron
    --cp-comm-type, ``context_parallel.CP_COMM_TYPES``): p2p ring attention
    (megatron-core's default), a2a all-to-all, or a2a+p2p (all-to-all inside a
    node, ring across)."""
    cuda_graph: str = "none"
    """Which part of a step replays as CUDA graphs (``CUDA_GRAPHS``). Only a
    whole-iteration graph takes the launches of an MoE layer's expert kernels
    off the GPU's clock (``step_time.expert_kernels_s``); megatron-core's default
    is none."""
    moe_grouped_gemm: bool = False
    """Megatron --moe-grouped-gemm: a rank's local experts run as one grouped
    GEMM (TEGroupedMLP) instead of one GEMM per expert in turn (SequentialMLP,
    megatron-core's default), which pays a kernel launch and a small-GEMM tail
    per expert."""

    distributed_optimizer: bool = False
    """Whether the stack's runs shard the optimizer state (Megatron's distributed
    optimizer; always under FSDP): what ``estimate`` assumes when the plan does
    not say. The search tries both wherever DP > 1."""
    moe_imbalance: float = 1.0
    """Tokens routed to the busiest expert rank over the mean (>= 1). The
    published MoE benchmarks force-balance the router (Megatron-Bridge
    performance recipes: moe_router_force_load_balancing), so 1.0 there; a
    real router with an auxiliary balancing loss runs above it."""
    moe_capacity_factor: float = 0.0
    """Megatron --moe-expert-capacity-factor: tokens over an expert's capacity
    are dropped, so no rank computes more than this times its mean share;
    0: dropless (no capacity)."""
    cpu_offload_layers: int = 0
    """megatron-core layer-wise activation offloading (Megatron-LM
    --cpu-offloading-num-layers, Bridge ``model.cpu_offloading_num_layers``): the
    activations the first N layers save for backward are copied to host memory as
    each layer's forward ends and back before its backward
    (``autoconfig.training.offload``); 0: off. megatron-core allows it only
    without pipeline parallelism, activation recompute or per-layer CUDA graphs
    (TransformerConfig.__post_init__)."""

    @property
    def moe_expert_load(self) -> float:
        """Expert work of the busiest rank over the balanced share."""
        if self.moe_capacity_factor:
            return min(self.moe_imbalance, self.moe_capacity_factor)
        return self.moe_imbalance

    @property
    def launchable(self) -> bool:
        """Runs on megatron-core, what the launch files start and the profiling worker runs."""
        return self.framework == LAUNCHED_FRAMEWORK

    @property
    def megatron_fsdp(self) -> bool:
        """Fully sharded data parallel on megatron-core: Megatron-FSDP
        (``MEGATRON_FSDP_SHARDING``), which the launch files switch on."""
        return self.launchable and self.param_gathers_per_microbatch > 0


@dataclass(frozen=True)
class Stack:
    """A named software stack: its features and where each value comes from."""

    name: str
    description: str
    features: SoftwareFeatures
    sources: tuple[tuple[str, str], ...]
    """(feature, source) for every feature the stack file sets."""


def stacks_dir() -> Path:
    return heuristics_dir() / "stacks"


def stack_names() -> tuple[str, ...]:
    """The stacks shipped in heuristics/stacks/, sorted."""
    return tuple(sorted(p.stem for p in stacks_dir().glob("*.yaml")))


def load_stack(name: str | None = None) -> Stack:
    """The stack called ``name`` (default ``DEFAULT_STACK``); InputError naming
    the allowed stacks for an unknown name."""
    name = name or DEFAULT_STACK
    if name not in stack_names():
        raise InputError(f"unknown stack {name!r}: allowed are {', '.join(stack_names())}")
    return _load_stack_cached(str(stacks_dir() / f"{name}.yaml"))


@lru_cache(maxsize=16)
def _load_stack_cached(path_text: str) -> Stack:
    path = Path(path_text)
    data = load_yaml(path)
    raw = data.get("features")
    if not isinstance(raw, dict) or not raw:
        raise CatalogError(f"{path}: missing mapping 'features'")
    known = {f.name for f in dataclasses.fields(SoftwareFeatures)} | {"grad_reduce_dtype"}
    values, sources = {}, []
    for key in raw:
        if key not in known:
            raise CatalogError(f"{path}: unknown feature {key!r}: allowed are "
                               f"{', '.join(sorted(known))}")
        value, source = sourced_field(raw, key, path)
        sources.append((key, source))
        if key == "grad_reduce_dtype":
            key, value = "grad_reduce_bytes", _grad_bytes(value, str(path))
        if key == "cannot_run":
            value = tuple(value or ())
        values[key] = value
    features = SoftwareFeatures(**values)
    _check(features, str(path))
    return Stack(name=path.stem, description=str(data.get("description", "")),
                 features=features, sources=tuple(sources))


def _grad_bytes(dtype: str, where: str) -> int:
    if dtype not in GRAD_REDUCE_DTYPES:
        raise InputError(f"invalid grad reduce dtype {dtype!r} in {where}: allowed are "
                         f"{', '.join(GRAD_REDUCE_DTYPES)}")
    return GRAD_REDUCE_DTYPES[dtype]


def _check(features: SoftwareFeatures, where: str) -> None:
    if features.framework not in FRAMEWORKS:
        raise CatalogError(f"{where}: unknown framework {features.framework!r}: allowed are "
                           f"{', '.join(FRAMEWORKS)}")
    unknown = [f for f in features.cannot_run if f not in PLAN_FEATURES]
    if unknown:
        raise CatalogError(f"{where}: unknown plan feature(s) {', '.join(map(str, unknown))} in "
                           f"cannot_run: allowed are {', '.join(PLAN_FEATURES)}")
    if features.moe_dispatcher not in MOE_DISPATCHERS:
        raise CatalogError(f"{where}: unknown MoE dispatcher {features.moe_dispatcher!r}: "
                           f"allowed are {', '.join(MOE_DISPATCHERS)}")
    if features.fp8_recipe:
        recipe_name(features.fp8_recipe, f"{where}: fp8_recipe")
    if features.cp_comm_type not in CP_COMM_TYPES:
        raise CatalogError(f"{where}: unknown cp_comm_type {features.cp_comm_type!r}: "
                           f"allowed are {', '.join(CP_COMM_TYPES)}")
    if features.cuda_graph not in CUDA_GRAPHS:
        raise CatalogError(f"{where}: unknown cuda_graph {features.cuda_graph!r}: "
                           f"allowed are {', '.join(CUDA_GRAPHS)}")
    if features.cross_entropy not in CROSS_ENTROPY_KERNELS:
        raise CatalogError(f"{where}: unknown cross entropy {features.cross_entropy!r}: "
                           f"allowed are {', '.join(CROSS_ENTROPY_KERNELS)}")
    if features.attention_kernel not in ATTENTION_KERNELS:
        raise CatalogError(f"{where}: unknown attention kernel {features.attention_kernel!r}: "
                           f"allowed are {', '.join(ATTENTION_KERNELS)}")


def plan_feature_masks(plans: PlanTable) -> dict[str, np.ndarray]:
    """Each optional plan feature (``PLAN_FEATURES``) -> which plans of the table use it:
    the one definition the search's filter and ``estimate``'s check share."""
    full = plans.recompute == RECOMPUTE_KINDS.index("full")
    method = plans.recompute_method
    return {"tp": plans.tp > 1, "pp": plans.pp > 1, "ep": (plans.ep > 1) | (plans.etp > 1),
            "vp": plans.vp > 1,
            "sp": plans.sp.astype(bool), "cp": plans.cp > 1,
            "selective_recompute": plans.recompute == RECOMPUTE_KINDS.index("selective"),
            "block_recompute": full & (method == RECOMPUTE_METHODS.index("block")),
            "grouped_recompute": (full & (method == RECOMPUTE_METHODS.index("uniform"))
                                  & (plans.recompute_num_layers > 1))}


def plan_features_used(plan: Plan) -> dict[str, str]:
    """The optional plan features a Plan uses -> how it uses them (e.g. ``"tp": "tp 2"``)."""
    masks = plan_feature_masks(PlanTable.from_plans([plan]))
    shown = {"tp": f"tp {plan.tp}", "pp": f"pp {plan.pp}", "ep": f"ep {plan.ep} etp {plan.etp}",
             "vp": f"vp {plan.vp}", "sp": "sp",
             "cp": f"cp {plan.cp}", "selective_recompute": "recompute selective",
             "block_recompute": "recompute method block",
             "grouped_recompute": f"recompute of {plan.recompute_num_layers} layers per group"}
    return {name: shown[name] for name, used in masks.items() if used[0]}


def cannot_run_error(stack: str, name: str, shown: str) -> InputError:
    """The one-line error for a plan feature (``PLAN_FEATURES``) a stack lacks."""
    return InputError(f"stack {stack} cannot run {shown}: it has no {PLAN_FEATURES[name]}; "
                      f"use {WITHOUT[name]} or another --stack")


def check_profilable(features: SoftwareFeatures, stack: str, how: str, where: str = "") -> None:
    """InputError when profiling (real megatron-core steps) is asked of a stack that
    runs another framework; ``how`` names what to change instead, ``where`` prefixes."""
    if not features.launchable:
        raise InputError(f"{where}profiling runs {LAUNCHED_FRAMEWORK} training steps, and stack "
                         f"{stack} runs {features.framework}: {how}")
    if features.megatron_fsdp:
        # The worker wraps its model in megatron-core's DDP with the distributed
        # optimizer; Megatron-FSDP's sharded buffers are not built there.
        raise InputError(f"{where}profiling runs megatron-core steps with the distributed "
                         "optimizer, not Megatron-FSDP: drop --fsdp-sharding to profile, "
                         "or drop --profile")
    if features.cpu_offload_layers:
        # The worker builds its layers without Transformer Engine's offload context.
        raise InputError(f"{where}profiling runs megatron-core steps without activation "
                         "offloading: drop --cpu-offload-layers to profile, or drop --profile")


def check_runnable(plan, features: SoftwareFeatures, stack: str) -> None:
    """InputError naming the first plan feature ``stack`` cannot run, if any."""
    for name, shown in plan_features_used(plan).items():
        if name in features.cannot_run:
            raise cannot_run_error(stack_label(stack, features), name, shown)


def stack_label(stack: str, features: SoftwareFeatures) -> str:
    """The stack as messages name it: with Megatron-FSDP where it shards (what
    then takes expert parallelism away)."""
    return f"{stack} with Megatron-FSDP (--fsdp-sharding)" if features.megatron_fsdp else stack


def grad_accum_bytes_per_param(features: SoftwareFeatures) -> float:
    """HBM bytes per parameter each micro-batch spends accumulating gradients
    outside the weight-gradient GEMM: 0 when fused; otherwise read the 16-bit
    gradient (2) and read and write the accumulator of the reduce dtype, plus
    the stack's cast copy where the accumulator is 32-bit."""
    if features.gradient_accumulation_fusion:
        return 0.0
    cast = features.grad_accum_cast_bytes if features.grad_reduce_bytes > 2 else 0.0
    return 2.0 + 2.0 * features.grad_reduce_bytes + cast


def grad_reduce_dtype(features: SoftwareFeatures) -> str:
    """The --grad-reduce-dtype a feature set reduces in (fp32 or bf16)."""
    return "fp32" if features.grad_reduce_bytes == 4 else "bf16"


SWITCH_OVERRIDES = {"tp_comm_overlap": "tp_comm_overlap",
                    "gradient_accumulation_fusion": "gradient_accumulation_fusion",
                    "overlap_grad_reduce": "overlap_grad_reduce",
                    "overlap_param_gather": "overlap_param_gather",
                    "fused_attention": "flash_attention",
                    "p2p_scatter_gather": "p2p_scatter_gather",
                    "tp_async_backward": "tp_async_backward",
                    "overlap_p2p_comm": "overlap_p2p_comm",
                    "moe_a2a_overlap": "moe_a2a_overlap",
                    "moe_grouped_gemm": "moe_grouped_gemm",
                    "recompute_early_stop": "recompute_early_stop"}
"""On/off override (option ``--NAME``/``--no-NAME``, with dashes) -> the feature it sets."""
OVERRIDES = (*SWITCH_OVERRIDES, "grad_reduce_dtype", "fsdp_sharding", "moe_dispatcher",
             "moe_imbalance", "moe_capacity_factor", "fp8_recipe", "cross_entropy",
             "cuda_graph", "cp_comm_type", "cpu_offload_layers")
"""Every single-feature override ``with_overrides`` takes (the CLI's option names)."""


def with_overrides(features: SoftwareFeatures, **overrides) -> SoftwareFeatures:
    """The stack's features with single features overridden (``OVERRIDES``; None
    keeps the stack's)."""
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise TypeError(f"unknown override(s) {', '.join(unknown)}: allowed are "
                        f"{', '.join(OVERRIDES)}")
    changes = {SWITCH_OVERRIDES[name]: value for name, value in overrides.items()
               if name in SWITCH_OVERRIDES and value is not None}
    grad_reduce_dtype, fsdp_sharding = overrides.get("grad_reduce_dtype"), overrides.get(
        "fsdp_sharding")
    imbalance, capacity = overrides.get("moe_imbalance"), overrides.get("moe_capacity_factor")
    if imbalance is not None:
        if not 1.0 <= imbalance <= 64.0:
            raise InputError(f"invalid --moe-imbalance {imbalance:g}: must be in [1, 64] "
                             "(tokens of the busiest expert rank over the mean)")
        changes["moe_imbalance"] = float(imbalance)
    if capacity is not None:
        if capacity != 0 and not 0.0 < capacity <= 64.0:
            raise InputError(f"invalid --moe-capacity-factor {capacity:g}: must be in (0, 64], "
                             "or 0 for dropless")
        changes["moe_capacity_factor"] = float(capacity)
    if overrides.get("fp8_recipe"):
        changes["fp8_recipe"] = recipe_name(overrides["fp8_recipe"])
    for name, allowed in (("cross_entropy", CROSS_ENTROPY_KERNELS),
                          ("moe_dispatcher", MOE_DISPATCHERS),
                          ("cuda_graph", CUDA_GRAPHS),
                          ("cp_comm_type", CP_COMM_TYPES)):
        if overrides.get(name) is not None:
            changes[name] = _allowed(name, overrides[name], allowed)
    if grad_reduce_dtype is not None:
        changes["grad_reduce_bytes"] = _grad_bytes(grad_reduce_dtype, "--grad-reduce-dtype")
    offload = overrides.get("cpu_offload_layers")
    if offload is not None:
        if isinstance(offload, bool) or not isinstance(offload, int) or offload < 0:
            raise InputError(f"invalid --cpu-offload-layers {offload!r}: must be a whole "
                             "number of layers, 0 for none")
        changes["cpu_offload_layers"] = offload
    if fsdp_sharding is not None:
        changes["param_gathers_per_microbatch"] = _fsdp_gathers(features, fsdp_sharding)
        if features.framework == LAUNCHED_FRAMEWORK and "ep" not in features.cannot_run:
            # Megatron-FSDP shards routed experts over their own expert data-parallel
            # group, which the sharded-state model (memory._fully_sharded_states) does
            # not describe: expert parallelism is refused rather than mispriced.
            changes["cannot_run"] = (*features.cannot_run, "ep")
    return dataclasses.replace(features, **changes)


def _fsdp_gathers(features: SoftwareFeatures, sharding: str) -> int:
    """Parameter all-gathers per micro-batch of ``--fsdp-sharding`` on this stack:
    PyTorch FSDP on the fully sharded stacks, Megatron-FSDP (``MEGATRON_FSDP_SHARDING``)
    on megatron-core ones; a one-line error elsewhere."""
    _allowed("fsdp_sharding", sharding, FSDP_SHARDING)
    if features.framework == LAUNCHED_FRAMEWORK:
        if sharding not in MEGATRON_FSDP_SHARDING:
            raise InputError(f"invalid --fsdp-sharding {sharding!r} on a megatron-core stack: "
                             f"allowed are {', '.join(MEGATRON_FSDP_SHARDING)} (Megatron-FSDP "
                             "optim_grads_params)")
        return FSDP_SHARDING[sharding]
    if features.param_gathers_per_microbatch == 0:
        raise InputError(f"--fsdp-sharding {sharding} needs a fully sharded stack "
                         "(pytorch-fsdp or llm-foundry) or a megatron-core one (Megatron-FSDP)")
    return FSDP_SHARDING[sharding]


def _allowed(name: str, value: str, allowed) -> str:
    """``value`` of the override ``name`` if ``allowed`` has it, else the one-line error."""
    if value not in allowed:
        raise InputError(f"invalid --{name.replace('_', '-')} {value!r}: allowed are "
                         f"{', '.join(allowed)}")
    return value


def override_flags(stack: SoftwareFeatures, features: SoftwareFeatures) -> list[str]:
    """The override options that turn a stack's features into ``features`` (the
    inverse of ``with_overrides``): what a user adds to ``--stack`` to describe a run."""
    flags = []
    for name, feature in SWITCH_OVERRIDES.items():
        if getattr(features, feature) != getattr(stack, feature):
            flag = name.replace("_", "-")
            flags.append(f"--{flag}" if getattr(features, feature) else f"--no-{flag}")
    if features.grad_reduce_bytes != stack.grad_reduce_bytes:
        flags += ["--grad-reduce-dtype", grad_reduce_dtype(features)]
    if features.moe_dispatcher != stack.moe_dispatcher:
        flags += ["--moe-dispatcher", features.moe_dispatcher]
    if features.cross_entropy != stack.cross_entropy:
        flags += ["--cross-entropy", features.cross_entropy]
    if features.cuda_graph != stack.cuda_graph:
        flags += ["--cuda-graph", features.cuda_graph]
    if features.cp_comm_type != stack.cp_comm_type:
        flags += ["--cp-comm-type", features.cp_comm_type]
    if features.fp8_recipe != stack.fp8_recipe:
        flags += ["--fp8-recipe", features.fp8_recipe]
    for name in ("moe_imbalance", "moe_capacity_factor"):
        if getattr(features, name) != getattr(stack, name):
            flags += [f"--{name.replace('_', '-')}", f"{getattr(features, name):g}"]
    if features.cpu_offload_layers != stack.cpu_offload_layers:
        flags += ["--cpu-offload-layers", str(features.cpu_offload_layers)]
    if features.param_gathers_per_microbatch != stack.param_gathers_per_microbatch:
        flags += ["--fsdp-sharding", fsdp_sharding(features)]
    return flags


def fsdp_sharding(features: SoftwareFeatures) -> str | None:
    """The ``--fsdp-sharding`` name of the features' fully sharded data parallel
    (None: the optimizer state alone is sharded, or nothing)."""
    gathers = features.param_gathers_per_microbatch
    return {v: k for k, v in FSDP_SHARDING.items()}[gathers] if gathers else None


def resolve_software(stack: str | None = None, **overrides) -> tuple[Stack, SoftwareFeatures]:
    """(the named stack, its features with the overrides applied)."""
    chosen = load_stack(stack)
    return chosen, with_overrides(chosen.features, **overrides)
