"""Where megatron-core accepts its expert-parallel all-to-all overlap.

One rule set, read by the step-time model (which plans get the overlap) and by
the launch files (which plans carry --overlap-moe-expert-parallel-comm, and why
not), so a prediction never leans on an overlap the launched run cannot have.
The rules are TransformerConfig.__post_init__'s checks for
``overlap_moe_expert_parallel_comm`` in megatron-core 0.16.1.
"""

from __future__ import annotations

import numpy as np

from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import RECOMPUTE_KINDS, Plan, PlanTable

_FULL = RECOMPUTE_KINDS.index("full")


def _rules(model: ModelSpec, plans: PlanTable, dispatcher: str) -> list[tuple[np.ndarray, str]]:
    """(blocked mask, reason) in megatron-core's order of checking."""
    n = len(plans)
    base = dispatcher.partition("-")[0]
    return [
        (plans.ep == 1, "needs EP > 1"),
        (np.full(n, base not in ("alltoall", "flex")),
         f"needs the alltoall or flex dispatcher, not {base}"),
        (plans.recompute == _FULL, "not with full recompute"),
        ((plans.pp > 1) & (plans.vp == 1), "needs virtual pipeline stages when PP > 1"),
        (np.full(n, model.mtp_layers > 1), "at most one MTP layer"),
        ((model.mtp_layers > 0) & (plans.pp == 1), "with an MTP layer it needs PP > 1"),
    ]


def a2a_overlap_allowed(model: ModelSpec, plans: PlanTable, dispatcher: str) -> np.ndarray:
    """True for each plan megatron-core lets overlap its EP dispatch and combine."""
    allowed = np.ones(len(plans), dtype=bool)
    for blocked, _ in _rules(model, plans, dispatcher):
        allowed &= ~blocked
    return allowed


def a2a_overlap_blocker(model: ModelSpec, plan: Plan, dispatcher: str) -> str | None:
    """Why megatron-core refuses the overlap for this plan, or None when it accepts it."""
    for blocked, reason in _rules(model, PlanTable.from_plans([plan]), dispatcher):
        if blocked[0]:
            return reason
    return None
