"""Which predicted plans to profile: the predicted best plus diverse ones.

Profiling only the top of the prediction would re-measure near-identical
layouts and could never reveal that the model mis-ranks an axis. So after the
predicted best, plans are added greedily by how many not-yet-covered axis
values they bring (set cover's greedy rule), the main axes first (TP, PP, EP,
SP, recompute), then the others (VP, CP, ETP, micro-batch, distributed
optimizer; EP and ETP are 1 for dense models), ties
broken by predicted rank. Once every value present in the candidates is
covered, the remaining picks follow the predicted ranking.
"""

from typing import Sequence

from autoconfig.errors import InputError
from autoconfig.core.plan import Plan

PRIMARY_AXES = ("tp", "pp", "ep", "sp", "recompute")
SECONDARY_AXES = ("vp", "cp", "etp", "mbs", "distributed_optimizer")
DEFAULT_TOP_K = 6


def axis_values(plan: Plan, axes: Sequence[str]) -> set[tuple[str, object]]:
    return {(axis, getattr(plan, axis)) for axis in axes}


def select_plans(ranked: Sequence[Plan], k: int = DEFAULT_TOP_K) -> list[Plan]:
    """Pick ``k`` of the plans (given best-predicted first), in pick order.

    The first is the predicted best; each next pick maximises (new primary axis
    values, new secondary axis values), then the better predicted rank.
    """
    if k < 1:
        raise InputError(f"invalid --top-k {k}: must be >= 1")
    ranked = list(dict.fromkeys(ranked))  # drop duplicates, keep rank order
    if not ranked:
        return []
    chosen = [0]
    covered_primary = axis_values(ranked[0], PRIMARY_AXES)
    covered_secondary = axis_values(ranked[0], SECONDARY_AXES)
    while len(chosen) < min(k, len(ranked)):
        best_index, best_score = None, None
        for index, plan in enumerate(ranked):
            if index in chosen:
                continue
            score = (len(axis_values(plan, PRIMARY_AXES) - covered_primary),
                     len(axis_values(plan, SECONDARY_AXES) - covered_secondary),
                     -index)
            if best_score is None or score > best_score:
                best_index, best_score = index, score
        chosen.append(best_index)
        covered_primary |= axis_values(ranked[best_index], PRIMARY_AXES)
        covered_secondary |= axis_values(ranked[best_index], SECONDARY_AXES)
    return [ranked[i] for i in chosen]
