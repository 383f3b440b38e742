"""What every launch target needs to run a mixture-of-experts model.

``MoeLaunch`` is derived once from the LaunchSpec's model, plan, stack and the
family's router (heuristics/launch.yaml ``moe_router``), so Megatron-LM,
Megatron-Bridge and NeMo 1 render the same experts, expert parallelism,
dispatcher and overlap. Where megatron-core (0.16.1, transformer_config.py)
refuses a stack feature for a plan, the feature is switched off here, once,
with the reason (shown in every file's header), exactly as LaunchSpec does for
TP communication overlap without sequence parallelism.
"""

from dataclasses import dataclass, field, replace
from itertools import groupby

from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan
from autoconfig.errors import CatalogError
from autoconfig.training.moe_overlap import a2a_overlap_blocker
from autoconfig.training.stack import SoftwareFeatures

FP32_ROUTER_EXPERTS = 32
"""From this many experts the router runs in fp32: megatron-core 0.16.1 warns
"Using a large number of experts (e.g. >=32) without fp32 routing" below it, and
Megatron-Bridge's DeepSeek-V3 and Kimi providers set moe_router_dtype fp32."""
ROUTER_FIELDS = ("load_balancing_type", "aux_loss_coeff", "score_function", "pre_softmax",
                 "expert_bias", "topk_scaling_factor", "num_groups", "group_topk")


@dataclass(frozen=True)
class MoeRouter:
    """How tokens pick experts and how the load is balanced (Megatron --moe-router-*)."""

    load_balancing_type: str = "aux_loss"
    """aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none."""
    aux_loss_coeff: float = 0.0
    score_function: str = "softmax"
    """softmax or sigmoid (DeepSeek-V3)."""
    pre_softmax: bool = False
    """Softmax over all experts before the top-k (megatron-core needs it for top-1)."""
    expert_bias: bool = False
    """DeepSeek-V3's auxiliary-loss-free balancing bias (sigmoid routers only)."""
    topk_scaling_factor: float | None = None
    """Scale of the routed output (DeepSeek-V3 route_scale 2.5)."""
    num_groups: int | None = None
    """Group-limited routing: experts in this many groups ..."""
    group_topk: int | None = None
    """... of which each token may use this many."""
    source: str = field(default="", repr=False, compare=False)

    @classmethod
    def from_mapping(cls, value: dict, source: str, where: str) -> "MoeRouter":
        unknown = set(value) - set(ROUTER_FIELDS)
        if unknown:
            raise CatalogError(f"{where}: unknown router field(s) {', '.join(sorted(unknown))}: "
                               f"allowed are {', '.join(ROUTER_FIELDS)}")
        return cls(**value, source=source)


@dataclass(frozen=True)
class MoeLaunch:
    """The experts of one run: shape, parallelism and how their tokens travel."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    shared_ffn_hidden_size: int | None
    """All shared experts together (None: none)."""
    layer_pattern: tuple[int, ...]
    """1 for an MoE layer, 0 for a dense one, first to last (Megatron's list form)."""
    ep: int
    etp: int
    dispatcher: str
    """megatron-core moe_token_dispatcher_type: allgather, alltoall or flex."""
    flex_backend: str | None
    """deepep or hybridep for the flex dispatcher."""
    a2a_overlap: bool
    """EP all-to-all overlapped with another micro-batch's compute."""
    a2a_overlap_off: str | None
    """Why the stack's A2A overlap is off for this plan (None: not asked or on)."""
    grouped_gemm: bool
    router: MoeRouter

    @property
    def router_dtype(self) -> str | None:
        """Megatron --moe-router-dtype (None: the model's dtype)."""
        return "fp32" if self.num_experts >= FP32_ROUTER_EXPERTS else None

    @property
    def every_layer(self) -> bool:
        """All layers are MoE: Megatron's default --moe-layer-freq 1 says it."""
        return all(self.layer_pattern)

    @property
    def layer_freq_expression(self) -> str:
        """--moe-layer-freq: ``1`` or Megatron's list expression, e.g. ``([0]*3+[1]*58)``
        (arguments.py moe_freq_type evaluates it: digits, brackets, + and * only)."""
        if self.every_layer:
            return "1"
        return "(" + "+".join(f"[{kind}]*{count}" if count > 1 else f"[{kind}]"
                              for kind, count in _runs(self.layer_pattern)) + ")"

    def describe(self) -> str:
        line = (f"experts: {self.num_experts} x top-{self.topk}, EP {self.ep} ETP {self.etp}, "
                f"dispatcher {self.dispatcher}"
                + (f" ({self.flex_backend})" if self.flex_backend else "")
                + f", grouped GEMM {'on' if self.grouped_gemm else 'off'}, "
                f"EP A2A overlap {'on' if self.a2a_overlap else 'off'}")
        return line + (f" ({self.a2a_overlap_off})" if self.a2a_overlap_off else "")


def _runs(pattern: tuple[int, ...]) -> list[tuple[int, int]]:
    """(value, run length) of consecutive equal values."""
    return [(value, len(list(run))) for value, run in groupby(pattern)]


def moe_launch(model: ModelSpec, plan: Plan, software: SoftwareFeatures,
               router: MoeRouter) -> MoeLaunch | None:
    """The MoE settings of a run; None for a dense model."""
    if not model.is_moe:
        return None
    dispatcher, _, backend = software.moe_dispatcher.partition("-")
    if dispatcher == "flex" and plan.tp * plan.ep == 1:
        # megatron-core's flex dispatcher asserts TP x EP > 1; on one rank no token
        # leaves it, and alltoall is the same (no) communication.
        dispatcher, backend = "alltoall", ""
    blocker = a2a_overlap_blocker(model, plan, dispatcher) if software.moe_a2a_overlap else None
    if model.moe_topk == 1 and router.score_function == "softmax" \
            and router.load_balancing_type != "sinkhorn":
        # megatron-core: "Please use --moe-router-pre-softmax when topk is 1" (a softmax
        # over one chosen expert has a zero gradient).
        router = replace(router, pre_softmax=True)
    return MoeLaunch(
        num_experts=model.num_experts, topk=model.moe_topk,
        ffn_hidden_size=model.moe_ffn_hidden_size,
        shared_ffn_hidden_size=model.moe_shared_expert_ffn_hidden_size or None,
        layer_pattern=tuple(1 if kind == "moe" else 0 for kind in model.layer_pattern),
        ep=plan.ep, etp=plan.etp, dispatcher=dispatcher, flex_backend=backend or None,
        a2a_overlap=software.moe_a2a_overlap and blocker is None,
        a2a_overlap_off=f"the stack's EP A2A overlap is off: megatron-core {blocker}"
        if blocker else None,
        grouped_gemm=software.moe_grouped_gemm, router=router)
