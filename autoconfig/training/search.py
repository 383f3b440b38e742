"""The search: enumerate the plan space, prune by memory, rank by step time.

Pure: (model, workload, cluster, narrowing, objective) -> SearchResult. No I/O;
the CLI renders it and the report module writes it. When nothing fits it
raises InfeasibleError saying why and what would fit (more nodes, a smaller
micro-batch, recompute, the distributed optimizer).
"""

from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd

from autoconfig.training import dominance, memory

from autoconfig.training import step_time as perf
from autoconfig.errors import MAX_COUNT, InfeasibleError, InputError
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import module_list
from autoconfig.core.plan import (RECOMPUTE_KINDS, RECOMPUTE_METHODS, Plan, PlanTable, Workload,
                             describe_plan)
from autoconfig.training.fp8 import check_precision
from autoconfig.training.offload import check_offload
from autoconfig.training.space import (R_DP, R_EP_DENSE, R_EP_EXPERTS, R_ETP_FFN, R_GBS,
                                       R_MEMORY, R_STACK, AxisChoices, PlanSpace, divisors,
                                       enumerate_plans)
from autoconfig.training.stack import (DEFAULT_STACK, SoftwareFeatures, cannot_run_error,
                                       load_stack, plan_feature_masks, stack_label,
                                       with_overrides)
from autoconfig.units import GIB

OBJECTIVES = ("throughput", "memory")

MEMORY_FIELDS = ("weights", "gradients", "optimizer", "activations", "logits", "overhead")
TIME_FIELDS = ("compute_s", "recompute_s", "offload_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
               "pp_bubble_s", "pp_p2p_s", "dp_comm_s", "optimizer_s")
MAX_NODE_TRIALS = 40
"""How many larger node counts the infeasible explanation evaluates at most."""
MAX_NODE_FACTOR = 64
"""...and how far beyond the given node count it looks."""


@dataclass(frozen=True, eq=False)
class SearchResult:
    """The ranked plans that fit, and what was rejected, by reason."""

    model: ModelSpec
    workload: Workload
    cluster: Cluster
    objective: str
    plans: PlanTable
    """Plans that fit, best first."""
    table: pd.DataFrame
    """One row per plan of ``plans`` (same order): plan columns, predictions,
    memory (GiB) and step-time breakdowns."""
    rejected: dict[str, int]
    considered: int
    software: SoftwareFeatures
    """The software features every prediction assumed (the stack plus overrides);
    launch outputs set exactly these."""
    stack: str
    """Name of the stack the features came from."""
    constants: object = None
    """The calibrated PerfConstants the predictions used (None: the shipped ones)."""
    dominated: int = 0
    """Plans that fit but were dropped: a plan of the same layout with another
    recompute setting is as fast and needs no more memory
    (``autoconfig.training.dominance``)."""

    @property
    def feasible(self) -> int:
        return len(self.plans)

    @property
    def best(self) -> Plan:
        return self.plans.plan(0)

    def top_plans(self, n: int) -> tuple[Plan, ...]:
        """The n best plans as Plan values (for reports and profiling)."""
        return tuple(self.plans.plan(i) for i in range(min(n, len(self.plans))))


def search_inputs(inputs) -> SearchResult:
    """The search for resolved ``autoconfig.training.inputs.SearchInputs``."""
    return search(inputs.model, inputs.workload, inputs.cluster, inputs.choices,
                  inputs.objective, software=inputs.software, stack=inputs.stack.name,
                  constants=inputs.constants)


def search(model: ModelSpec, workload: Workload, cluster: Cluster,
           choices: AxisChoices = AxisChoices(), objective: str = "throughput", *,
           software: SoftwareFeatures | None = None, stack: str | None = None,
           constants: perf.PerfConstants | None = None) -> SearchResult:
    """Enumerate -> memory -> prune (with reasons) -> step time -> rank.

    ``software`` (default: the features of ``stack``, itself default
    ``DEFAULT_STACK``) is what the memory and step-time models assume;
    ``constants`` (default: heuristics/perf.yaml) a calibration's."""
    stack = stack or DEFAULT_STACK
    software = software or load_stack(stack).features
    choices = offload_choices(model, cluster, runnable_choices(choices, software, stack),
                              software)
    if objective not in OBJECTIVES:
        raise InputError(f"invalid objective {objective!r}: allowed are {', '.join(OBJECTIVES)}")
    check_precision(cluster.gpu, workload.precision)
    space = runnable_recompute(enumerate_plans(model, workload, cluster, choices,
                                               software.cp_comm_type), software)
    if len(space.plans) == 0:
        raise InfeasibleError(_no_valid_plan_message(model, workload, cluster, space))
    # Model states alone already overflow most large-model plans: drop those
    # before counting activations (the lower bound never drops a plan that fits).
    maybe = _states_lower_bound(model, workload, space.plans,
                                software) <= memory.usable_bytes(cluster.gpu)
    candidates = space.plans.take(maybe) if not maybe.all() else space.plans
    mem = memory.memory_breakdown(model, workload, candidates, software=software)
    fit = np.asarray(memory.fits(mem, cluster.gpu), dtype=bool)
    if not fit.any():
        mem = memory.memory_breakdown(model, workload, space.plans, software=software)
        raise InfeasibleError(_nothing_fits_message(model, workload, cluster, choices, space, mem,
                                                    software))
    rejected = dict(space.rejected)
    if len(space.plans) > int(fit.sum()):
        rejected[R_MEMORY] = len(space.plans) - int(fit.sum())
    plans = candidates.take(fit)
    mem = _take(mem, fit)
    times = perf.step_time(model, workload, plans, cluster, software=software,
                           constants=constants)
    drop = dominance.dominated(plans, times.step_time_s, mem.total_bytes, times.recompute_s)
    if drop.any():
        plans, mem, times = plans.take(~drop), _take(mem, ~drop), _take(times, ~drop)
    order = _rank(plans, mem, times, objective)
    plans = plans.take(order)
    table = _table(plans, workload, _take(mem, order), _take(times, order))
    return SearchResult(model=model, workload=workload, cluster=cluster, objective=objective,
                        plans=plans, table=table, rejected=rejected,
                        considered=space.considered, software=software, stack=stack,
                        constants=constants, dominated=int(drop.sum()))


STATE_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "etp", "distributed_optimizer",
                 "first_stage_layers", "last_stage_layers")
"""The plan columns ``memory.states_lower_bound`` reads (model states do not depend
on the micro-batch, recompute, virtual stages or sequence parallelism)."""


def _states_lower_bound(model: ModelSpec, workload: Workload, plans, software) -> np.ndarray:
    """``memory.states_lower_bound`` of every plan, computed once per run of
    consecutive plans with the same ``STATE_COLUMNS``: the enumeration lays each
    layout out over its recompute variants one after another
    (``space._expand_recompute``), so DeepSeek-V3's 6 million plans on 256 GPUs
    hold some 100 thousand runs. The same numbers, a fraction of the work."""
    n = len(plans)
    starts = np.zeros(n, dtype=bool)
    starts[:1] = True
    for name in STATE_COLUMNS:
        column = np.asarray(getattr(plans, name))
        starts[1:] |= column[1:] != column[:-1]
    bound = memory.states_lower_bound(model, workload, plans.take(np.flatnonzero(starts)),
                                      software=software)
    return bound[np.cumsum(starts) - 1] if n else bound


def runnable_choices(choices: AxisChoices, software: SoftwareFeatures,
                     stack: str) -> AxisChoices:
    """``choices`` narrowed to the plans ``stack`` can run (``SoftwareFeatures.cannot_run``);
    InputError where the user asked for a feature it lacks."""
    cannot = set(software.cannot_run)
    stack = stack_label(stack, software)
    changes: dict = {}
    for axis in ("tp", "pp", "vp", "cp"):
        asked = getattr(choices, axis)
        if axis in cannot:
            if asked is not None and max(asked) > 1:
                raise cannot_run_error(stack, axis, f"{axis} {max(asked)}")
            changes[axis] = (1,)
    if "ep" in cannot:
        for axis in ("ep", "etp"):
            asked = getattr(choices, axis)
            if asked is not None and max(asked) > 1:
                raise cannot_run_error(stack, "ep", f"{axis} {max(asked)}")
            changes[axis] = (1,)
    if "sp" in cannot:
        if choices.sp == "on":
            raise cannot_run_error(stack, "sp", "sp")
        changes["sp"] = "off"
    if "selective_recompute" in cannot:
        if choices.recompute is not None and "selective" in choices.recompute:
            raise cannot_run_error(stack, "selective_recompute", "recompute selective")
        changes["recompute"] = tuple(k for k in (choices.recompute or RECOMPUTE_KINDS)
                                     if k != "selective")
    if software.param_gathers_per_microbatch > 0:
        # FSDP shards the optimizer state whatever the plan says: one variant, not two.
        if choices.distributed_optimizer == "off":
            raise InputError(f"stack {stack} always shards the optimizer state (fully sharded "
                             "data parallel): use --distributed-optimizer on or auto")
        changes["distributed_optimizer"] = "on"
    return replace(choices, **changes) if changes else choices


def offload_choices(model: ModelSpec, cluster: Cluster, choices: AxisChoices,
                    software: SoftwareFeatures) -> AxisChoices:
    """``choices`` narrowed to what megatron-core offloads activations with (one
    stage, no recompute) when ``software`` offloads; InputError where the user
    pinned something else (``offload.check_offload``)."""
    if not software.cpu_offload_layers:
        return choices
    check_offload(model, cluster.gpu, software, pp=choices.pp, recompute=choices.recompute)
    return replace(choices, pp=(1,), vp=(1,), recompute=("none",))


def runnable_recompute(space: PlanSpace, software: SoftwareFeatures) -> PlanSpace:
    """``space`` without the full-recompute variants the stack has no method for
    (``block_recompute``, ``grouped_recompute`` in ``SoftwareFeatures.cannot_run``),
    counted under ``R_STACK``."""
    p = space.plans
    masks = plan_feature_masks(p)
    drop = np.zeros(len(p), dtype=bool)
    for name in ("block_recompute", "grouped_recompute"):
        if name in software.cannot_run:
            drop |= masks[name]
    if not drop.any():
        return space
    return PlanSpace(plans=p.take(~drop), rejected={**space.rejected, R_STACK: int(drop.sum())},
                     considered=space.considered)


def evaluate(model: ModelSpec, workload: Workload, cluster: Cluster, plans: PlanTable,
             software: SoftwareFeatures | None = None,
             recipe: str | None = None, constants: perf.PerfConstants | None = None
             ) -> tuple[pd.DataFrame, np.ndarray]:
    """Predictions for given (valid) plans, unranked: the table and fits."""
    software = software or load_stack(None).features
    mem = memory.memory_breakdown(model, workload, plans, software=software, recipe=recipe)
    fit = np.asarray(memory.fits(mem, cluster.gpu), dtype=bool)
    times = perf.step_time(model, workload, plans, cluster, software=software,
                           constants=constants)
    return _table(plans, workload, mem, times), fit


def _rank(plans: PlanTable, mem, times, objective: str) -> np.ndarray:
    """Stable order: the objective, then the other metric, then the plan
    fields (so equal predictions always come out in the same order)."""
    step, total = dominance.ranking_keys(times.step_time_s, mem.total_bytes)
    keys = [plans.recompute_modules, plans.recompute_num_layers, plans.recompute_method,
            plans.recompute,
            ~plans.distributed_optimizer, ~plans.sp, plans.mbs, plans.cp, plans.vp,
            plans.pp, plans.tp]
    primary = [total, step] if objective == "throughput" else [step, total]
    # np.lexsort sorts by the last key first.
    return np.lexsort(keys + primary)


def _take(breakdown, index):
    """The rows at ``index`` of a breakdown dataclass (scalars kept as they are)."""
    values = {}
    for f in fields(breakdown):
        value = np.asarray(getattr(breakdown, f.name))
        values[f.name] = value[index] if value.ndim else value
    return replace(breakdown, **values)


def _module_lists(plans: PlanTable) -> np.ndarray:
    """Each plan's recompute modules as text ('' unless selective with modules)."""
    masks = np.where(plans.recompute_is("selective"), plans.recompute_modules, 1)
    distinct, index = np.unique(masks, return_inverse=True)
    return np.array([module_list(int(m)) for m in distinct], dtype=object)[index]


def _table(plans: PlanTable, workload: Workload, mem, times) -> pd.DataFrame:
    """The plan columns, the headline predictions, then the breakdowns."""
    n = len(plans)
    micro_batches = workload.global_batch_size // (plans.mbs * plans.dp)
    data = {
        "rank": np.arange(1, n + 1),
        "tp": plans.tp, "pp": plans.pp, "vp": plans.vp, "cp": plans.cp, "ep": plans.ep,
        "etp": plans.etp, "dp": plans.dp,
        "sp": plans.sp, "mbs": plans.mbs, "micro_batches": micro_batches,
        "recompute": np.array(RECOMPUTE_KINDS, dtype=object)[plans.recompute],
        "recompute_method": np.where(plans.recompute == RECOMPUTE_KINDS.index("full"),
                                     np.array(RECOMPUTE_METHODS, dtype=object)[
                                         plans.recompute_method], ""),
        "recompute_num_layers": plans.recompute_num_layers,
        "recompute_modules": _module_lists(plans),
        "distributed_optimizer": plans.distributed_optimizer,
        "first_stage_layers": plans.first_stage_layers,
        "last_stage_layers": plans.last_stage_layers,
        "step_time_s": times.step_time_s,
        "tokens_per_s_per_gpu": times.tokens_per_s_per_gpu,
        "tflops_per_gpu": times.model_tflops_per_gpu,
        "mfu": times.mfu,
        "memory_gib": np.asarray(mem.total_bytes, dtype=float) / GIB,
    }
    for name in MEMORY_FIELDS:
        data[f"{name}_gib"] = np.asarray(getattr(mem, f"{name}_bytes"), dtype=float) / GIB
    for name in TIME_FIELDS:
        data[name] = getattr(times, name)
    return pd.DataFrame({k: np.broadcast_to(np.asarray(v), (n,)) for k, v in data.items()})


def _no_valid_plan_message(model: ModelSpec, workload: Workload, cluster: Cluster,
                           space: PlanSpace) -> str:
    """Why no layout is valid: the two commonest reasons and what to change for the
    first (all counts are in ``search``'s report when some plan is valid)."""
    ranked = sorted(space.rejected.items(), key=lambda item: -item[1])
    reasons = ", ".join(f"{r}: {c}" for r, c in ranked[:2])
    more = f", {len(ranked) - 2} more" if len(ranked) > 2 else ""
    hints = {R_GBS: f"a global batch size that splits over the data-parallel ranks "
                    f"(e.g. a multiple of {cluster.num_gpus})",
             R_EP_EXPERTS: f"--ep values that divide the {model.num_experts} experts",
             R_EP_DENSE: "no --ep/--etp for a dense model",
             R_ETP_FFN: f"--etp values that divide the expert FFN ({model.moe_ffn_hidden_size})",
             R_DP: f"--tp/--pp/--cp whose product divides the {cluster.num_gpus} GPUs"}
    hint = next((hints[r] for r, _ in ranked if r in hints), "")
    return (f"no valid plan for gbs {workload.global_batch_size}, seq {workload.seq_len} on "
            f"{cluster.num_gpus} GPUs: all {space.considered} candidates rejected "
            f"({reasons}{more})" + (f"; try {hint}" if hint else ""))


def _nothing_fits_message(model: ModelSpec, workload: Workload, cluster: Cluster,
                          choices: AxisChoices, space: PlanSpace, mem, software) -> str:
    """Why nothing fits (the leanest plan and its size) and what would."""
    total = np.asarray(mem.total_bytes, dtype=float)
    lean = int(np.argmin(total))
    plan = space.plans.plan(lean)
    capacity = float(memory.usable_bytes(cluster.gpu)) / GIB
    what = (f"no plan fits in the {capacity:.1f} GiB usable on each {cluster.gpu.name}: the "
            f"leanest of "
            f"{len(space.plans)} valid plans needs {total[lean] / GIB:.1f} GiB "
            f"({describe_plan(plan)})")
    fixes = _relaxations(model, workload, cluster, choices, software)
    if _fits_sharded(model, workload, cluster, choices, software):
        fixes.append("--fsdp-sharding full-shard (Megatron-FSDP: the data-parallel ranks "
                     "shard the weights and gradients too)")
    nodes = _nodes_that_fit(model, workload, cluster, choices, software)
    if nodes is not None:
        fixes.append(f"--nodes {nodes} ({nodes * cluster.gpus_per_node} GPUs)")
    if not fixes:
        return what + "; no narrowing or node count up to the limit fits: try a smaller model"
    return what + "; would fit: " + ", or ".join(fixes)


def megatron_fsdp_alternative(software: SoftwareFeatures) -> SoftwareFeatures | None:
    """The features with Megatron-FSDP sharding the weights and gradients, where a
    megatron-core stack does not shard them yet (the fix a plan that does not fit
    may need); None elsewhere."""
    if not software.launchable or software.param_gathers_per_microbatch:
        return None
    return with_overrides(software, fsdp_sharding="full-shard")


def _fits_sharded(model, workload, cluster, choices: AxisChoices, software) -> bool:
    """Whether some plan of ``choices`` fits under ``megatron_fsdp_alternative`` (no
    pinned expert parallelism, which it cannot run)."""
    sharded = megatron_fsdp_alternative(software)
    if sharded is None:
        return False
    try:
        narrowed = runnable_choices(choices, sharded, "")
    except InputError:
        return False
    return _leanest(model, workload, cluster, narrowed, sharded) is not None


def _leanest(model, workload, cluster, choices, software) -> Plan | None:
    """The plan with the least memory that fits, or None."""
    try:
        space = enumerate_plans(model, workload, cluster, choices, software.cp_comm_type)
    except InputError:
        return None
    if len(space.plans) == 0:
        return None
    # As in ``search``: plans whose model states alone overflow cannot fit (the
    # bound never drops one that does), so only the rest have activations counted;
    # a large MoE model on a small cluster drops them all at a fraction of the cost.
    maybe = _states_lower_bound(model, workload, space.plans,
                                software) <= memory.usable_bytes(cluster.gpu)
    if not maybe.any():
        return None
    plans = space.plans.take(maybe) if not maybe.all() else space.plans
    mem = memory.memory_breakdown(model, workload, plans, software=software)
    fit = np.asarray(memory.fits(mem, cluster.gpu), dtype=bool)
    if not fit.any():
        return None
    total = np.where(fit, np.asarray(mem.total_bytes, dtype=float), np.inf)
    return plans.plan(int(np.argmin(total)))


def _relaxations(model, workload, cluster, choices: AxisChoices, software) -> list[str]:
    """Each narrowed axis, freed alone: which flag value would make a plan fit."""
    fixes = []
    relax = {"mbs": ("--mbs", lambda p: str(p.mbs)),
             "recompute": ("--recompute", lambda p: p.recompute),
             "distributed_optimizer": ("--distributed-optimizer",
                                       lambda p: "on" if p.distributed_optimizer else "off"),
             "tp": ("--tp", lambda p: str(p.tp)), "pp": ("--pp", lambda p: str(p.pp)),
             "vp": ("--vp", lambda p: str(p.vp)), "cp": ("--cp", lambda p: str(p.cp)),
             "sp": ("--sp", lambda p: "on" if p.sp else "off")}
    for name, (flag, value) in relax.items():
        current = getattr(choices, name)
        if current is None or current == "auto":
            continue
        freed = replace(choices, **{name: "auto" if isinstance(current, str) else None})
        plan = _leanest(model, workload, cluster, freed, software)
        if plan is not None:
            fixes.append(f"{flag} {value(plan)}")
    return fixes


def _nodes_that_fit(model, workload, cluster: Cluster, choices: AxisChoices,
                    software) -> int | None:
    """The smallest larger node count with a plan that fits (None if none of
    the first MAX_NODE_TRIALS counts whose GPUs can split the batch does, up
    to MAX_NODE_FACTOR times the nodes given)."""
    gbs = workload.global_batch_size
    sizes = sorted({t * p * c for t in divisors(model.num_heads)
                    for p in divisors(model.num_layers) for c in (choices.cp or (1,))})
    trials = 0
    most = min(cluster.nodes * MAX_NODE_FACTOR, MAX_COUNT // cluster.gpus_per_node)
    for nodes in range(cluster.nodes + 1, most + 1):
        gpus = nodes * cluster.gpus_per_node
        # Cheap filter: some dp = gpus / (tp pp cp) must divide the batch.
        if not any(mp <= gpus and gpus % mp == 0 and gbs % (gpus // mp) == 0 for mp in sizes):
            continue
        trials += 1
        # Cheaper still (same answer): the model states spread over every GPU must
        # fit (not for FSDP, whose sharding of expert-parallel states counts less).
        maybe = software.param_gathers_per_microbatch > 0 or memory.states_floor(
            model, gpus, software=software) <= memory.usable_bytes(cluster.gpu)
        if maybe and _leanest(model, workload, replace(cluster, nodes=nodes), choices,
                              software) is not None:
            return nodes
        if trials >= MAX_NODE_TRIALS:
            break
    return None
