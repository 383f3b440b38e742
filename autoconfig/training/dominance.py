"""Recompute settings that buy nothing.

Activation recompute trades step time for memory, so a recompute setting is
worth listing only where it needs less memory than a setting of the same
layout that recomputes less, or is faster. Where another setting of the same
layout (every plan field but the recompute ones) is as fast and needs no more
memory, the setting is Pareto-dominated on (step time, memory): it is never
the better choice, and ranked beside its twin it pushes distinct layouts out
of the top of the list and out of the profiling jobs. Cases the models
produce: selective recompute of the attention core under a fused attention
kernel, which stores no scores to spare (megatron-core 0.16's
TransformerConfig warns the same: 'For fused attention, you have no need to set
core_attn to recompute'); recomputing the MLP of the dense
layers of an MoE model on a pipeline stage that is neither the slowest nor
the fullest.

Comparisons use the precision the ranking uses (``ranking_keys``), so two
plans that rank as equal are equal here. Of exact twins the one that
recomputes less (its ``recompute_s``, then the recompute kind, layers and
modules) is kept.
"""

import numpy as np

from autoconfig.core.plan import RECOMPUTE_MODULES, PlanTable
from autoconfig.units import GIB

LAYOUT_FIELDS = ("tp", "pp", "vp", "cp", "dp", "ep", "etp", "mbs", "sp",
                 "distributed_optimizer", "first_stage_layers", "last_stage_layers")
"""The plan fields that make a layout; the rest are its recompute setting."""


def ranking_keys(step_s, memory_bytes) -> tuple[np.ndarray, np.ndarray]:
    """(step seconds, memory GiB) rounded as the search ranks them: below these
    digits the models carry float noise, not a difference."""
    step = np.round(np.asarray(step_s, dtype=float), 9)
    gib = np.round(np.asarray(memory_bytes, dtype=float) / GIB, 6)
    return step, gib


def _module_counts(masks) -> np.ndarray:
    """Modules in each selective-recompute bitmask."""
    masks = np.asarray(masks, dtype=np.int64)
    return sum((masks >> i) & 1 for i in range(len(RECOMPUTE_MODULES)))


def _layout_runs(plans: PlanTable) -> np.ndarray:
    """A run number per plan, new wherever a layout field differs from the plan
    before: the search enumerates each layout's recompute settings one after
    another (``space._expand_recompute``), and pruning keeps that order, so a run
    is one layout. Were a layout split over runs, a run would still hold one
    layout only: fewer plans would be compared, none wrongly dropped."""
    change = np.zeros(len(plans), dtype=bool)
    for name in LAYOUT_FIELDS:
        column = np.asarray(getattr(plans, name))
        change[1:] |= column[1:] != column[:-1]
    return np.cumsum(change)


def _less_work_first(plans: PlanTable) -> np.ndarray:
    """Of exact twins, the order in which to keep them: recompute kind, then
    layers of full recompute (0 is every layer of the chunk: the most), then
    modules of selective recompute."""
    layers = np.asarray(plans.recompute_num_layers, dtype=np.int64)
    return (np.asarray(plans.recompute, dtype=np.int64) * 1_000_000_000
            + np.where(layers == 0, 999_999, layers) * 100
            + _module_counts(plans.recompute_modules))


def dominated(plans: PlanTable, step_s, memory_bytes, recompute_s) -> np.ndarray:
    """True for each plan that another plan of its layout dominates: at least as
    fast and no larger (of exact twins, the one recomputing less survives)."""
    n = len(plans)
    if n < 2:
        return np.zeros(n, dtype=bool)
    runs = _layout_runs(plans)
    step, gib = ranking_keys(step_s, memory_bytes)
    work = np.round(np.broadcast_to(np.asarray(recompute_s, dtype=float), (n,)), 9)
    # np.lexsort sorts by the last key first: layout, then step, memory, work.
    order = np.lexsort((_less_work_first(plans), work, gib, step, runs))
    runs, gib = runs[order], gib[order]
    # Every plan before this one in its layout is at least as fast; the least
    # memory among them decides whether one is also no larger. One running
    # minimum serves all layouts: each layout is shifted below every earlier one.
    shifted = gib - runs * (np.ptp(gib) + 1.0)
    least = np.minimum.accumulate(shifted)
    before = np.concatenate(([False], (least[:-1] <= shifted[1:]) & (runs[1:] == runs[:-1])))
    out = np.zeros(n, dtype=bool)
    out[order] = before
    return out
